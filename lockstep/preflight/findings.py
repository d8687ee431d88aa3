"""What preflight reports: one `Finding` per check, grouped by area, as text for a person or JSON.

A finding that is not ok says what is wrong, where (``file:line`` in a repository, a node, or
``site.toml:line``) and the fix, one sentence a person can act on. Every string passes `redact` with
the values of the site's secret variables before it is
shown: a finding names a variable, never its value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from resources.model import Model
from resources.secrets import redact
from resources.tomlfile import key_line

Status = Literal["ok", "warn", "fail"]
Area = Literal["site", "consumer", "build repo", "iris", "nodes", "registry"]
AREAS: tuple[Area, ...] = ("site", "consumer", "build repo", "iris", "nodes", "registry")

EXIT_OK = 0  # nothing failed (warnings allowed)
EXIT_FAILED = 1  # a check failed
EXIT_USAGE = 2  # click's own code for a bad command line
EXIT_CANNOT_RUN = 3  # preflight itself could not run (no site file, one that does not load)


class Finding(Model):
    """One check's outcome."""

    area: Area
    check: str = Field(description="Stable name, e.g. consumer.build_script.xtrace.")
    status: Status
    what: str = Field(description="What was found: for ok, what holds; otherwise what is wrong.")
    where: str = Field(description="file:line in a repository, a node, or site.toml:line.")
    fix: str = Field(default="", description="One actionable sentence; empty when ok.")

    @model_validator(mode="after")
    def _fix_when_not_ok(self) -> Finding:
        if self.status != "ok" and not self.fix:
            raise ValueError(f"{self.check}: a {self.status} finding must say how to fix it")
        return self


def ok(area: Area, check: str, what: str, where: str) -> Finding:
    return Finding(area=area, check=check, status="ok", what=what, where=where)


def warn(area: Area, check: str, what: str, where: str, fix: str) -> Finding:
    return Finding(area=area, check=check, status="warn", what=what, where=where, fix=fix)


def fail(area: Area, check: str, what: str, where: str, fix: str) -> Finding:
    return Finding(area=area, check=check, status="fail", what=what, where=where, fix=fix)


class Section(Model):
    """What one area's checks found, under a heading that
    says what was looked at (a repo at a commit...)."""

    area: Area
    title: str
    findings: list[Finding] = Field(default_factory=list)


class Report(Model):
    site: str
    sections: list[Section]

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.sections for f in s.findings]

    def count(self, status: Status) -> int:
        return sum(f.status == status for f in self.findings)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.count("fail") else EXIT_OK


def build_report(site: Path, sections: Iterable[Section], *, secrets: Iterable[str] = ()) -> Report:
    """One section per area in AREAS order (an area's sections merged under its first title), every
    string redacted of the given secret values."""
    secrets = list(secrets)
    merged: dict[Area, Section] = {}
    for section in sections:
        have = merged.setdefault(section.area, Section(area=section.area, title=section.title))
        have.findings.extend(section.findings)

    def clean(f: Finding) -> Finding:
        return f.model_copy(
            update={k: redact(getattr(f, k), secrets) for k in ("what", "where", "fix")}
        )

    ordered = [
        Section(
            area=s.area, title=redact(s.title, secrets), findings=[clean(f) for f in s.findings]
        )
        for area in AREAS
        if (s := merged.get(area)) is not None
    ]
    return Report(site=str(site), sections=ordered)


def site_where(
    path: Path, text: str, table: tuple[str, ...], key: str | None = None, *, default: str = ""
) -> str:
    """``site.toml:line`` of `key` in `table` (or of
    the table's header); `default` (else the file alone)
    when the file does not spell it out (a default value)."""
    line = key_line(text, table, key)
    if line is None:
        return f"{path} ({default})" if default else str(path)
    return f"{path}:{line}"


_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}


def render_text(report: Report) -> str:
    """Grouped by area: ok checks one line each, warnings
    and failures with what, where and the fix."""
    out = [f"lockstep preflight: {report.site}"]
    for section in report.sections:
        out += ["", section.title]
        for f in section.findings:
            if f.status == "ok":
                out.append(f"  ok    {f.check}: {f.what} ({f.where})")
                continue
            out.append(f"  {_MARK[f.status]:<5} {f.check}")
            out.append(f"        what:  {_indent(f.what)}")
            out.append(f"        where: {_indent(f.where)}")
            out.append(f"        fix:   {_indent(f.fix)}")
    failed, warned, passed = report.count("fail"), report.count("warn"), report.count("ok")
    verdict = "some checks FAIL" if failed else "ready (no check fails)"
    out += [
        "",
        f"{failed} failed, {warned} warnings, {passed} ok: {verdict} (exit {report.exit_code})",
    ]
    return "\n".join(out)


def _indent(text: str) -> str:
    return text.replace("\n", "\n               ")


def render_json(report: Report) -> str:
    """The report as one JSON object: the findings (a list),
    the counts, the exit code, the sections' titles."""
    return json.dumps(
        {
            "site": report.site,
            "exit_code": report.exit_code,
            "counts": {s: report.count(s) for s in ("ok", "warn", "fail")},
            "sections": [{"area": s.area, "title": s.title} for s in report.sections],
            "findings": [f.model_dump() for f in report.findings],
        },
        indent=2,
    )
