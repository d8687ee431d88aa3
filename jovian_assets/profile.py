"""`profiles/<rev>.env`: the whole pin set of a rev at once, only the keys that differ from versions.env.

Also the recipe TOML trap (2026-09-08): a bare `build_profile` placed after an `[[extra_mounts]]`
block parses into the last mount table and is silently ignored.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from typing import Any

from jovian_assets.models import Finding, ProfileDiff
from jovian_assets.source_lock import SourceLock
from resources.errors import FileFormatError

_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_env(text: str, path: str) -> dict[str, tuple[str, int]]:
    """KEY=VAL lines (comments and blanks skipped) -> {KEY: (value, line)}; anything else is an error."""
    out: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise FileFormatError(path, number, f"not a KEY=VAL line: {line.strip()!r}")
        value = m.group(2).strip().strip('"').strip("'")
        if m.group(1) in out:
            raise FileFormatError(path, number, f"{m.group(1)} is set again (first on line {out[m.group(1)][1]})")
        out[m.group(1)] = (value, number)
    return out


def plan_profile(
    lock: SourceLock, versions: dict[str, tuple[str, int]], mapping: dict[str, str], optional: dict[str, str] | None = None
) -> tuple[list[ProfileDiff], list[str]]:
    """(keys whose lock value differs from versions.env, mapping targets that versions.env lacks).

    `optional` targets (repository URLs) are followed only where versions.env has them: a site whose
    versions.env pins no URLs is not an error, one that does gets the fork's new URL with its commit."""
    diff: list[ProfileDiff] = []
    unknown: list[str] = []
    present = {k: v for k, v in (optional or {}).items() if v in versions and k not in mapping}
    for lock_key, env_key in {**mapping, **present}.items():
        if lock_key not in lock.keys:
            continue
        if env_key not in versions:
            close = difflib.get_close_matches(env_key, list(versions), n=1)
            unknown.append(f"{env_key} is not a key of versions.env" + (f" (did you mean {close[0]}?)" if close else ""))
            continue
        base = versions[env_key][0]
        if base != lock.keys[lock_key]:
            diff.append(ProfileDiff(key=env_key, base=base, profile=lock.keys[lock_key]))
    return diff, unknown


def render_profile(*, rev: str, lab_commit: str, lock_path: str, diff: list[ProfileDiff]) -> str:
    header = (
        f"# profiles/{rev}.env: the {rev} pin set from the lab's source lock, adopted as ONE set by lockstep.\n"
        f"# source: {lock_path} @ {lab_commit}\n"
        "# Only the keys that differ from versions.env; merge order: versions.env < profile < recipe [build.versions].\n"
    )
    return header + "".join(f"{d.key}={d.profile}\n" for d in diff)


def _nested_key(data: Any, key: str, trail: str = "") -> str | None:
    """Where `key` sits below the top level, as a dotted trail (e.g. 'extra_mounts[1]'), or None."""
    if isinstance(data, dict):
        for k, v in data.items():
            here = f"{trail}.{k}" if trail else k
            if k == key and trail:
                return trail
            if (found := _nested_key(v, key, here)) is not None:
                return found
    elif isinstance(data, list):
        for i, item in enumerate(data):
            if (found := _nested_key(item, key, f"{trail}[{i}]")) is not None:
                return found
    return None


def recipe_profile_placement(text: str, path: str, key: str = "build_profile") -> Finding | None:
    """None when the recipe does not name `key`; else whether it is a TOP-LEVEL key, as tomllib reads it."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Finding(passed=False, description=f"{path}: not valid TOML: {exc}")
    if key in data:
        return Finding(passed=True, description=f"{path}: {key} = {data[key]!r} is top-level")
    nested = _nested_key(data, key)
    if nested is None:
        return None
    lines = text.splitlines()
    line = next((n for n, l in enumerate(lines, 1) if re.match(rf"^\s*{key}\s*=", l)), None)
    header = next((f"{lines[n - 1].strip()} (line {n})" for n in range(line or 0, 0, -1) if lines[n - 1].lstrip().startswith("[")), "a table")
    return Finding(
        passed=False,
        description=(
            f"{path}:{line}: {key} sits after {header} and parses into {nested}, not the top level: the recipe "
            f"silently builds with the base pins. Move it above the first [section]."
        ),
    )
