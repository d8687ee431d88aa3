"""The pre-flight of the consumer's kaniko build
script (docker/build_tpu_kaniko.sh), before any submit.

The real script (`open-thoughts/OpenThoughts-Agent`, `docker/build_tpu_kaniko.sh` at 7951edcd of
2026-07-03; be1aaff6 of 2026-07-08 wraps the auth block in `set +x`, and its line 26 still traces
the token) taught three traps:
- it HARD-CODES its destination
  (``DEST_PINNED=ghcr.io/open-thoughts/openthoughts-agent:tpu-${GITSHA}``)
  and never reads the IMAGE lockstep sends: the push
  goes where the script says, whatever the site says;
- it runs ``set -euxo pipefail`` before ``: "${DOCKER_TOKEN:?}"``: bash's xtrace prints the token
  (and the ``AUTH=`` base64 of ``user:token``) into the iris job log;
- ``crane export gcr.io/kaniko-project/executor:latest ... || true``: an unpinned executor of an
  upstream archived on 2025-06-03, and a failed export hidden.

This reads the script as text, line by line, the way bash would run it top to bottom: enough for
these scripts, not a shell parser (bashlex and friends parse bash's grammar but know nothing of
xtrace state or of what an assignment taints, which
is what matters here). Pure: text in, report out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from resources.errors import LockstepError
from resources.model import Model

_ASSIGN = re.compile(
    r"^\s*(?:export\s+|readonly\s+|local\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$"
)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_GITSHA_GUARD = re.compile(r"\$\{GITSHA:\?")
_DESTINATION = re.compile(r"--destination(?:=|\s+)(\S+)")
_KANIKO_LATEST = re.compile(r"gcr\.io/kaniko-project/executor(?::latest)?(?![:@\w.-])")


ScriptCheck = Literal[
    "xtrace", "destination", "gitsha_guard", "token_missing", "executor_unpinned", "export_hidden"
]


class ScriptFinding(Model):
    """One thing wrong with the script: `message` is
    what a log or an error shows (what, then the fix);
    `kind`, `what` and `fix` are its parts, for a caller
    that reports them apart (lockstep preflight)."""

    severity: Literal["error", "warning"]
    line: int
    kind: ScriptCheck
    what: str
    fix: str
    message: str

    @classmethod
    def of(
        cls,
        severity: Literal["error", "warning"],
        line: int,
        kind: ScriptCheck,
        what: str,
        fix: str,
        *,
        joined: str | None = "; ",
    ) -> ScriptFinding:
        """`joined`: how the message puts the fix after what
        is wrong (None: the message is `what` alone)."""
        message = what if joined is None else f"{what}{joined}{fix}"
        return cls(severity=severity, line=line, kind=kind, what=what, fix=fix, message=message)


class BuildScriptRefused(LockstepError):
    """The build script would push elsewhere, leak the
    token or skip the GITSHA guard; nothing submitted."""


class ScriptReport(Model):
    path: str
    destination: str | None = Field(
        default=None, description="Where the script pushes, as resolved from its text."
    )
    destination_line: int | None = None
    requires: list[str] = Field(
        default_factory=list, description="Variables the script guards with ${VAR:?}."
    )
    findings: list[ScriptFinding] = Field(default_factory=list)

    @property
    def errors(self) -> list[ScriptFinding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[ScriptFinding]:
        return [f for f in self.findings if f.severity == "warning"]

    def render(self, findings: Sequence[ScriptFinding] | None = None) -> str:
        return "\n".join(
            f"{self.path}:{f.line}: {f.message}"
            for f in (self.findings if findings is None else findings)
        )


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) with backslash continuations
    joined (numbered where the joined line starts)
    and heredoc bodies marked as such: bash does not trace a heredoc's body."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, buf = i + 1, lines[i]
        while buf.endswith("\\") and i + 1 < len(lines):
            i += 1
            buf = buf[:-1] + " " + lines[i].strip()
        out.append((start, buf))
        if m := _HEREDOC.search(_code(buf)):
            end = m.group(2)
            i += 1
            while i < len(lines) and lines[i].strip() != end:
                out.append((i + 1, "\0heredoc"))
                i += 1
        i += 1
    return out


def _physical_line(text: str, start: int, needle: str) -> int:
    """The line, from `start` on, where `needle` is written (inside a continued command)."""
    for number, line in enumerate(text.splitlines()[start - 1 :], start):
        if needle in line:
            return number
    return start


def _code(line: str) -> str:
    """The line without its comment and without single-quoted text (which bash does not expand)."""
    out, quote = [], None
    for pos, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            if quote == '"' or ch == '"':
                out.append(ch)
            continue
        if ch in "'\"":
            quote = ch
            if ch == '"':
                out.append(ch)
            continue
        if ch == "#" and (pos == 0 or line[pos - 1].isspace()):
            break
        out.append(ch)
    return "".join(out)


def _xtrace_change(code: str) -> bool | None:
    """True/False when the line runs `set -x`/`set +x` (in any spelling); None when it does not."""
    state: bool | None = None
    for part in re.split(r"[;&|{}()]+", code):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        if not words or words[0] != "set":
            continue
        args = iter(words[1:])
        for arg in args:
            if arg in ("-o", "+o"):
                if next(args, "") == "xtrace":
                    state = arg == "-o"
            elif re.fullmatch(r"[-+][a-zA-Z]+", arg) and "x" in arg:
                state = arg.startswith("-")
    return state


def _expands(code: str, name: str) -> bool:
    """`$NAME`, `${NAME}`, `${NAME:?...}`, `${#NAME}` and the like."""
    n = re.escape(name)
    return (
        re.search(r"\$(?:\{#?" + n + r"(?:[^}A-Za-z0-9_][^}]*)?\}|" + n + r"\b)", code) is not None
    )


def _resolve(value: str, env: dict[str, str]) -> str:
    """Expand `$NAME`/`${NAME}`/`${NAME:-default}` from
    the script's own assignments; keep ${GITSHA}."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name == "GITSHA":
            return "${GITSHA}"
        if name in env:
            return env[name]
        return default if default is not None else "${" + name + "}"

    return re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, value
    )


def _unquote(value: str) -> str:
    value = value.strip()
    try:
        words = shlex.split(value, comments=True)
    except ValueError:
        return value
    return words[0] if len(words) == 1 else value


def check_build_script(
    text: str,
    *,
    path: str,
    image: str,
    secret_vars: Sequence[str] = ("DOCKER_TOKEN",),
    token_given: bool = True,
) -> ScriptReport:
    """Everything that must hold before the script is submitted, each finding with its line.

    Errors: no ``${GITSHA:?}`` guard; a destination that is not ``<image>:tpu-${GITSHA}`` (or that
    cannot be read from the script); a secret variable (or one assigned from it) expanded while
    xtrace is on; a required DOCKER_TOKEN with no token configured (`token_given`). Warnings: an
    unpinned kaniko executor of the archived upstream;
    a failed executor export hidden by ``|| true``.
    """
    report = ScriptReport(path=path)
    lines = _logical_lines(text)
    findings = report.findings

    xtrace_on: int | None = None  # the line that turned xtrace on, while it is on
    first = text.splitlines()[0] if text else ""
    if first.startswith("#!") and re.search(r"\s-\w*x", first):
        xtrace_on = 1
    # var -> (secret it carries, line)
    tainted: dict[str, tuple[str, int]] = {v: (v, 0) for v in secret_vars}
    # the script's own assignments, in order, for resolving the destination
    env: dict[str, str] = {}
    reads_env_image = False

    for number, line in lines:
        if line == "\0heredoc":
            continue
        code = _code(line)
        if not code.strip():
            continue
        for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", code):
            report.requires.append(m.group(1))
        change = _xtrace_change(code)
        if change is False:
            xtrace_on = None
        if xtrace_on is not None:
            for var, (secret, since) in tainted.items():
                if _expands(code, var):
                    origin = "" if var == secret else f" (assigned from ${secret} at line {since})"
                    findings.append(
                        ScriptFinding.of(
                            "error",
                            number,
                            "xtrace",
                            (
                                f"`set -x` (line {xtrace_on}) is on when ${var}{origin} is "
                                "expanded: the token would be "
                                "printed into the iris job log"
                            ),
                            "put `set +x` before this line (and `set -x` after, if wanted)",
                        )
                    )
                    break
        if change is True and xtrace_on is None:
            xtrace_on = number
        if m := _ASSIGN.match(code):
            name, value = m.group(1), m.group(2)
            carried = next(
                (secret for var, (secret, _) in tainted.items() if _expands(value, var)), None
            )
            if carried and name not in secret_vars:
                tainted[name] = (carried, number)
            if name == "IMAGE" and re.fullmatch(r'"?\$\{IMAGE(?::[-?][^}]*)?\}"?', value.strip()):
                reads_env_image = True
                continue
            env[name] = _resolve(_unquote(value), env)
        for m in _DESTINATION.finditer(code):
            report.destination = _resolve(_unquote(m.group(1)), env)
            report.destination_line = _physical_line(text, number, "--destination")
        if _KANIKO_LATEST.search(code):
            findings.append(
                ScriptFinding.of(
                    "warning",
                    number,
                    "executor_unpinned",
                    (
                        "the kaniko executor is gcr.io/kaniko-project/executor:latest: unpinned, "
                        "and its upstream "
                        "(GoogleContainerTools/kaniko) was archived on 2025-06-03"
                    ),
                    (
                        "pin a digest of a maintained fork (e.g. chainguard-dev/kaniko, "
                        "osscontainertools/kaniko)"
                    ),
                )
            )
            if re.search(r"\|\|\s*true\b", code):
                findings.append(
                    ScriptFinding.of(
                        "warning",
                        number,
                        "export_hidden",
                        (
                            "`|| true` hides a failed executor export: the build would go on "
                            "without a fresh executor"
                        ),
                        "drop the `|| true`, so a failed export fails the build",
                        joined=None,
                    )
                )

    if "GITSHA" not in report.requires and not _GITSHA_GUARD.search(text):
        findings.append(
            ScriptFinding.of(
                "error",
                1,
                "gitsha_guard",
                (
                    'no `: "${GITSHA:?}"` guard: without it a job with no GITSHA would push to '
                    "`:tpu-` (runbook §3)"
                ),
                'add `: "${GITSHA:?}"` near the top of the script, before anything uses GITSHA',
                joined=None,
            )
        )
    if "DOCKER_TOKEN" in report.requires and not token_given:
        at = next(n for n, line in lines if re.search(r"\$\{DOCKER_TOKEN:\?", line))
        findings.append(
            ScriptFinding.of(
                "error",
                at,
                "token_missing",
                ("the script requires DOCKER_TOKEN, but the site passes none"),
                "set [iris] docker_token_env to the NAME of the env var holding the push token "
                "(ghcr: a GitHub PAT "
                "with write:packages)",
                joined=": ",
            )
        )
    findings.extend(_destination_findings(report, image=image, reads_env_image=reads_env_image))
    findings.sort(key=lambda f: (f.line, f.severity))
    return report


def _destination_findings(
    report: ScriptReport, *, image: str, reads_env_image: bool
) -> list[ScriptFinding]:
    want = f"{image}:tpu-${{GITSHA}}"
    if report.destination is None:
        return [ScriptFinding.of("error", 1, "destination", (
            "no kaniko `--destination` in the script: lockstep cannot tell where the build pushes"
        ), f"pass kaniko `--destination {want}`", joined=None)]  # fmt: skip
    got = report.destination.replace("${IMAGE}", image) if reads_env_image else report.destination
    line = report.destination_line or 1
    if "$" in got.replace("${GITSHA}", "") or "`" in got:
        return [
            ScriptFinding.of(
                "error",
                line,
                "destination",
                (
                    f"the destination {report.destination} is not a literal lockstep can read "
                    "(only the script's own "
                    "assignments and ${GITSHA} are resolved)"
                ),
                "write it as <image>:tpu-${GITSHA}",
                joined=": ",
            )
        ]
    if got != want:
        what = (
            f"the script pushes to {got}, but the site's [tpu].image is {image} (lockstep "
            f"expects {want}): the "
            "script never reads lockstep's IMAGE, so the push would go where the script says"
        )
        return [
            ScriptFinding(
                severity="error",
                line=line,
                kind="destination",
                what=what,
                message=f"{what}. Make the two agree",
                fix=f"make the script push to {want} (or read lockstep's IMAGE), or set "
                "[tpu].image to "
                "the repository it pushes to",
            )
        ]
    return []
