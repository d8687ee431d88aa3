"""The Jovian build repo (docker-images) as the adoption, the build and the bench will read it.

From a temporary checkout of ``[jovian] build_branch``, for the build dir and every lineage dir
(``[[jovian.lineages]]``): versions.env parses, each profiles/*.env parses and names only keys of
that versions.env, fetch-deps.sh's gate lines parse; the recipes (``recipes_glob``) parse with any
``build_profile`` at the top level (the runbook's TOML trap); the lane's
``recipes/<lane>/baseline.json`` exists and parses; and no boot gate reads a marker file that
nothing in the dir writes (a gate every real build would fail). The parsers are the ones the assets
use, with their file:line errors.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

from jovian_assets.bench_tools import baseline_path, parse_baseline
from jovian_assets.dep_table import parse_gates
from jovian_assets.inputs import PathRefused, inside, read_text
from jovian_assets.profile import parse_env, recipe_profile_placement
from lockstep.preflight.findings import Finding, Section, fail, ok, site_where, warn
from resources.errors import FileFormatError
from resources.git import GitError, GitRemotes, glob_match
from resources.secrets import redact
from resources.site.jovian import BootGate, JovianSection
from resources.site.schema import SiteConfig

AREA = "build repo"
# A marker is a data file a gate reads (a .txt, a .json): never one of the package's own sources.
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.\-/]+\.[A-Za-z0-9]+$")
_SOURCE_SUFFIXES = (".py", ".pyi", ".pyc", ".so", ".pyd")


def check_build_repo(site: SiteConfig, git: GitRemotes) -> list[Section]:
    jovian = site.jovian
    assert jovian is not None
    repo = redact(jovian.build_repo)
    site_text = site.path.read_text(encoding="utf-8")
    title = f"build repo {repo} ({jovian.build_branch})"
    findings: list[Finding] = []
    try:
        with git.checkout(url=jovian.build_repo, branch=jovian.build_branch) as wt:
            title = f"build repo {repo} ({jovian.build_branch} @ {wt.base_sha[:8]})"
            dirs = list(
                dict.fromkeys([jovian.build_dir, *(lineage.dir for lineage in jovian.lineages)])
            )
            for d in dirs:
                findings += _build_dir(wt.path, d, jovian, site, site_text)
            findings += _recipes(wt.path, jovian)
            if jovian.lane is not None:
                findings.append(_baseline(wt.path, jovian.lane.name))
    except GitError as exc:
        findings.append(
            fail(
                AREA,
                "build_repo.checkout",
                f"cannot check out {jovian.build_branch} of {repo}: {exc}",
                site_where(
                    site.path,
                    site_text,
                    ("jovian",),
                    "build_branch",
                    default="[jovian] build_branch",
                ),
                (
                    "Check [jovian] build_repo and build_branch, and that this machine can "
                    "read the repo"
                ),
            )
        )
    return [Section(area=AREA, title=title, findings=findings)]


def _build_dir(
    root: Path, d: str, jovian: JovianSection, site: SiteConfig, site_text: str
) -> list[Finding]:
    try:
        here = inside(root, d)
    except PathRefused as exc:
        return [
            fail(
                AREA, "build_repo.build_dir", str(exc), d, "Name a directory inside the build repo"
            )
        ]
    if not here.is_dir():
        return [
            fail(
                AREA,
                "build_repo.build_dir",
                f"{d}/ is not in the build repo",
                d,
                f"Create {d}/ (versions.env, fetch-deps.sh, Dockerfile, build.sh, profiles/) in "
                "the build repo, "
                "or fix [jovian] build_dir / the [[jovian.lineages]] dir",
            )
        ]
    found, versions = _versions(here, d, jovian)
    if versions is not None:
        found += _profiles(here, d, versions)
    found.append(_gates(here, d))
    found += _boot_gate_markers(here, d, jovian, site, site_text)
    return found


def _versions(
    here: Path, d: str, jovian: JovianSection
) -> tuple[list[Finding], dict[str, tuple[str, int]] | None]:
    """The dir's versions.env findings, and its keys when
    it parses (the profiles are checked against them)."""
    rel = f"{d}/versions.env"
    path = here / "versions.env"
    if not path.is_file():
        return [
            fail(
                AREA,
                "build_repo.versions_env",
                f"{rel} is missing: this build dir has no pins",
                rel,
                (
                    f"Commit {rel} (every pin as KEY=VALUE: source shas, trees, pretend "
                    "versions, runtime)"
                ),
            )
        ], None
    try:
        versions = parse_env(read_text(path, rel), rel)
    except FileFormatError as exc:
        return [
            fail(
                AREA,
                "build_repo.versions_env",
                exc.message,
                f"{exc.path}:{exc.line}",
                (
                    "Make every line KEY=VALUE with one literal shell word as the value, "
                    "commit and push"
                ),
            )
        ], None
    mapped = [key for key in jovian.versions_keys.values() if key not in versions]
    if mapped:
        return [
            fail(
                AREA,
                "build_repo.versions_env",
                f"{rel} has no {', '.join(mapped)}, which [jovian] versions_keys maps the lab's "
                "source lock onto: "
                "adopting a rev would refuse to write its profile",
                rel,
                f"Add {', '.join(mapped)} to {rel}, or map [jovian] versions_keys onto keys it has",
            )
        ], versions
    return [
        ok(
            AREA,
            "build_repo.versions_env",
            f"{len(versions)} pins parse, every versions_keys target among them",
            rel,
        )
    ], versions


def _profiles(here: Path, d: str, versions: dict[str, tuple[str, int]]) -> list[Finding]:
    found = []
    profiles = sorted((here / "profiles").glob("*.env")) if (here / "profiles").is_dir() else []
    for path in profiles:
        rel = f"{d}/profiles/{path.name}"
        try:
            keys = parse_env(read_text(path, rel), rel)
        except FileFormatError as exc:
            found.append(
                fail(
                    AREA,
                    "build_repo.profiles",
                    exc.message,
                    f"{exc.path}:{exc.line}",
                    (
                        "Make every line KEY=VALUE with one literal shell word as the value, "
                        "commit and push"
                    ),
                )
            )
            continue
        for key, (_, line) in keys.items():
            if key not in versions:
                close = difflib.get_close_matches(key, list(versions), n=1)
                found.append(
                    fail(
                        AREA,
                        "build_repo.profiles",
                        f"{key} is not a key of {d}/versions.env"
                        + (f" (did you mean {close[0]}?)" if close else "")
                        + ": build.sh would pass a build-arg the Dockerfile never reads",
                        f"{rel}:{line}",
                        "Rename it to the versions.env key it "
                        f"overrides{f' ({close[0]})' if close else ''}, "
                        "or add the key to versions.env",
                    )
                )
    if not any(f.status == "fail" for f in found):
        found.append(
            ok(
                AREA,
                "build_repo.profiles",
                f"{len(profiles)} profile(s) parse and name only versions.env keys",
                f"{d}/profiles/",
            )
        )
    return found


def _gates(here: Path, d: str) -> Finding:
    rel = f"{d}/fetch-deps.sh"
    path = here / "fetch-deps.sh"
    if not path.is_file():
        return fail(
            AREA,
            "build_repo.fetch_deps",
            f"{rel} is missing: the dep table has no gate list to diff against",
            rel,
            (
                f"Commit {rel} with a `gate NAME REPOSITORY TAG [SUBDIR...]` line per "
                "CUDA-path cmake pin"
            ),
        )
    try:
        gates = parse_gates(read_text(path, rel), rel)
    except FileFormatError as exc:
        return fail(
            AREA,
            "build_repo.fetch_deps",
            exc.message,
            f"{exc.path}:{exc.line}",
            (
                "Write each gate as `gate NAME REPOSITORY TAG [SUBDIR...]` with literal words, "
                "commit and push"
            ),
        )
    if not gates:
        return warn(
            AREA,
            "build_repo.fetch_deps",
            "no `gate NAME REPOSITORY TAG` line: no cmake pin is gated",
            rel,
            (
                "Add a gate line per CUDA-path pin of the vLLM tree (`lockstep lab dep-table "
                "TREE` lists them)"
            ),
        )
    return ok(AREA, "build_repo.fetch_deps", f"{len(gates)} gate lines parse", rel)


def _recipes(root: Path, jovian: JovianSection) -> list[Finding]:
    every = (f.relative_to(root).as_posix() for f in root.rglob("*.toml") if f.is_file())
    rels = sorted(rel for rel in every if glob_match(jovian.recipes_glob, rel))
    if not rels:
        return [
            warn(
                AREA,
                "build_repo.recipes",
                f"no file matches [jovian] recipes_glob {jovian.recipes_glob!r}",
                jovian.recipes_glob,
                "Fix [jovian] recipes_glob to match the lane recipes (recipes/<lane>/recipe.toml)",
            )
        ]
    found = []
    for rel in rels:
        try:
            placed = recipe_profile_placement(read_text(root / rel, rel), rel)
        except FileFormatError as exc:
            found.append(
                fail(
                    AREA,
                    "build_repo.recipes",
                    exc.message,
                    f"{exc.path}:{exc.line}" if exc.line else exc.path,
                    (
                        "Fix the recipe so it is valid TOML with build_profile a profile name, "
                        "commit and push"
                    ),
                )
            )
            continue
        if placed is not None and not placed.passed:
            # Its description is "<rel>:<line>: what": the same
            # file:line convention as every FileFormatError.
            m = re.match(rf"^{re.escape(rel)}:(\d+): (.*)$", placed.description, re.DOTALL)
            where, what = (f"{rel}:{m.group(1)}", m.group(2)) if m else (rel, placed.description)
            found.append(
                fail(
                    AREA,
                    "build_repo.recipes",
                    what,
                    where,
                    "Move `build_profile = ...` above the recipe's first [section] or [[table]] "
                    "(a bare key "
                    "after [[extra_mounts]] lands in the last mount), commit and push",
                )
            )
    if not found:
        found.append(
            ok(
                AREA,
                "build_repo.recipes",
                f"{len(rels)} recipe(s) parse; build_profile, where set, is top-level",
                jovian.recipes_glob,
            )
        )
    return found


def _baseline(root: Path, lane: str) -> Finding:
    rel = baseline_path(lane)
    fix = (
        "Record one from a filed report of a run you trust: `lockstep lane rebaseline "
        f"recipes/{lane}/reports/"
        "<report>.md` (or restore the file), commit and push"
    )
    try:
        path = inside(root, *rel.split("/"))
    except PathRefused as exc:
        return fail(AREA, "build_repo.baseline", str(exc), rel, fix)
    if not path.is_file():
        return fail(
            AREA,
            "build_repo.baseline",
            f"{rel} is not in the build repo: the lane {lane} has no recorded baseline, so every "
            "bench report's "
            "quality gate fails (nothing comparable to gate against)",
            rel,
            fix,
        )
    try:
        base = parse_baseline(path.read_bytes(), rel)
    except FileFormatError as exc:
        return fail(
            AREA,
            "build_repo.baseline",
            exc.message,
            f"{exc.path}:{exc.line}" if exc.line else exc.path,
            fix,
        )
    return ok(
        AREA,
        "build_repo.baseline",
        f"{base.rev}'s run {base.run.run_id}: {base.run.tool} {base.run.tool_version}, "
        f"score {base.run.final_score}",
        rel,
    )


def gate_markers(gate: BootGate) -> list[str]:
    """The data files a gate's code names as string
    literals (``'_cuda_archs.txt'``), not the package's
    own sources (``'cache.py'``). SyntaxError when the code is not Python."""
    names = [
        node.value
        for node in ast.walk(ast.parse(gate.code))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _FILE_NAME.match(node.value)
    ]
    return list(dict.fromkeys(n for n in names if not n.endswith(_SOURCE_SUFFIXES)))


def _boot_gate_markers(
    here: Path, d: str, jovian: JovianSection, site: SiteConfig, site_text: str
) -> list[Finding]:
    """A boot gate that reads a marker file (``<pkg>/_cuda_archs.txt``,
    ``vllm/_sm12x_patches.json``) passes only on an image whose build wrote it; when no file
    of the build dir so much as names the marker, every
    build from it fails the gate."""
    texts = [
        p.read_bytes().decode("utf-8", errors="replace")
        for p in sorted(here.rglob("*"))
        if p.is_file()
    ]
    found, checked = [], 0
    for i, gate in enumerate(jovian.boot_gates):
        where = site_where(
            site.path,
            site_text,
            ("jovian", "boot_gates", str(i)),
            "code",
            default=f"[jovian] boot_gates: lockstep's default gate {gate.name!r}",
        )
        try:
            markers = gate_markers(gate)
        except SyntaxError as exc:
            found.append(
                fail(
                    AREA,
                    "build_repo.boot_gates",
                    f"boot gate {gate.name!r}: its code is not Python ({exc.msg}, "
                    f"line {exc.lineno} of the code)",
                    where,
                    (
                        "Fix the gate's code in [jovian] boot_gates (it runs as `python -c "
                        "CODE` in the image)"
                    ),
                )
            )
            continue
        for marker in markers:
            checked += 1
            name = marker.rsplit("/", 1)[-1]
            if not any(name in text for text in texts):
                found.append(
                    fail(
                        AREA,
                        "build_repo.boot_gates",
                        f"boot gate {gate.name!r} reads the marker file {marker}, which nothing "
                        f"in {d}/ "
                        "(Dockerfile, build scripts) writes: every image built from it would "
                        "fail the gate",
                        where,
                        f"Make {d}'s build write {marker} into the image, or set [jovian] "
                        "boot_gates "
                        f"without {gate.name!r} (the list replaces the defaults: keep the others)",
                    )
                )
    if not found:
        found.append(
            ok(
                AREA,
                "build_repo.boot_gates",
                f"every marker file the boot gates read ({checked}) is written by {d}/'s build",
                f"{d}/",
            )
        )
    return found
