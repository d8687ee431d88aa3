"""`profiles/<rev>.env`: the whole pin set of a rev
at once, only the keys that differ from versions.env.

Also the recipe TOML trap (2026-09-08): a bare `build_profile` placed after an `[[extra_mounts]]`
block parses into the last mount table and is silently ignored.

versions.env and profiles are shell-quoted KEY=VAL lines: a value is read as ONE shell word with
`shlex` (quotes and backslashes as bash reads them), and a value bash would read differently from
lockstep (an unterminated quote, a second word that bash would run as a command, a `$` or backtick
it would expand) is refused with file:line. Values written into a profile are `shlex.quote`d, so a
lab value can never become shell syntax on the build node.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jovian_assets.inputs import check_utf8, name_at, read_text
from jovian_assets.models import Finding, ProfileDiff
from jovian_assets.source_lock import SourceLock
from resources.errors import FileFormatError
from resources.tomlfile import load_toml

_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_env(text: str, path: str) -> dict[str, tuple[str, int]]:
    """KEY=VAL lines (comments and blanks skipped) ->
    {KEY: (value, line)}; anything else is an error."""
    out: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(check_utf8(text, path).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise FileFormatError(path, number, f"not a KEY=VAL line: {line.strip()!r}")
        value = shell_value(m.group(2), path, number, m.group(1))
        if m.group(1) in out:
            raise FileFormatError(
                path, number, f"{m.group(1)} is set again (first on line {out[m.group(1)][1]})"
            )
        out[m.group(1)] = (value, number)
    return out


def shell_value(raw: str, path: str, line: int, key: str) -> str:
    """The value of `KEY=<raw>` as bash assigns it, or
    FileFormatError when bash would do more than assign."""
    if raw[:1].isspace():  # `KEY= word` runs `word` with KEY empty
        rest = raw.strip()
        if rest and not rest.startswith("#"):
            raise FileFormatError(
                path,
                line,
                f"{key}={raw!r}: the space after '=' makes bash run {rest.split()[0]!r} "
                "as a command; write KEY=VALUE, quoting a value with spaces",
            )
        return ""
    _refuse_expansion(raw, path, line, key)
    lexer = shlex.shlex(raw, posix=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        word = lexer.get_token()
    except ValueError:
        raise FileFormatError(
            path, line, f"{key}={raw!r} has an unterminated quote: close it on the same line"
        ) from None
    rest = lexer.instream.read().strip()
    if rest and not rest.startswith("#"):
        raise FileFormatError(
            path,
            line,
            f"{key}={raw!r} is more than one shell word: bash would run {rest.split()[0]!r} "
            "as a command; quote the whole value",
        )
    return word or ""


def _refuse_expansion(raw: str, path: str, line: int, key: str) -> None:
    """A `$` or backtick outside single quotes in the first
    word: bash would expand it, lockstep reads it literally."""
    quote: str | None = None
    escaped = False
    for char in raw:
        if escaped:
            escaped = False
            # bash drops this backslash, shlex keeps it: the two would disagree
            if quote == '"' and char in "$`":
                raise FileFormatError(
                    path,
                    line,
                    f"{key}={raw!r}: write a literal {char!r} in single quotes, not as \\{char} "
                    "in double quotes",
                )
        elif quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif char in "$`":
            raise FileFormatError(
                path,
                line,
                f"{key}={raw!r}: bash would expand {char!r} here; pins are literal values "
                "(put a value that needs it in single quotes)",
            )
        elif char == quote or (quote is None and char in "'\""):
            quote = None if char == quote else char
        elif quote is None and char.isspace():
            return


def plan_profile(
    lock: SourceLock,
    versions: dict[str, tuple[str, int]],
    mapping: dict[str, str],
    optional: dict[str, str] | None = None,
) -> tuple[list[ProfileDiff], list[str]]:
    """(keys whose lock value differs from versions.env, mapping targets that versions.env lacks).

    `optional` targets (repository URLs) are followed only where versions.env has them: a site whose
    versions.env pins no URLs is not an error, one that
    does gets the fork's new URL with its commit."""
    diff: list[ProfileDiff] = []
    unknown: list[str] = []
    present = {k: v for k, v in (optional or {}).items() if v in versions and k not in mapping}
    for lock_key, env_key in {**mapping, **present}.items():
        if lock_key not in lock.keys:
            continue
        if env_key not in versions:
            close = difflib.get_close_matches(env_key, list(versions), n=1)
            unknown.append(
                f"{env_key} is not a key of versions.env"
                + (f" (did you mean {close[0]}?)" if close else "")
            )
            continue
        base = versions[env_key][0]
        if base != lock.keys[lock_key]:
            diff.append(ProfileDiff(key=env_key, base=base, profile=lock.keys[lock_key]))
    return diff, unknown


def render_profile(
    *, rev: str, lab_commit: str, lock_path: str, diff: list[ProfileDiff], holds: Sequence[str] = ()
) -> str:
    """The profile's text; every value shell-quoted (plain
    pins come out unchanged) and read back by parse_env.

    `holds` (the fork-cut audit's held pins) become comment
    lines: a held pin is part of the set on purpose."""

    def comment(text: str) -> str:
        return text if text.isprintable() else repr(text)  # a newline must not end the comment

    header = (
        f"# profiles/{rev}.env: the {rev} pin set from the lab's source lock, adopted as ONE set "
        "by lockstep.\n"
        f"# source: {comment(lock_path)} @ {lab_commit}\n"
        "# Only the keys that differ from versions.env; merge order: versions.env < profile < "
        "recipe [build.versions].\n"
    )
    held = "".join(f"# held: {comment(h)}\n" for h in holds)
    return header + held + "".join(f"{d.key}={shlex.quote(d.profile)}\n" for d in diff)


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
    """None when the recipe does not name `key`; else
    whether it is a TOP-LEVEL key, as tomllib reads it.

    A recipe that is not UTF-8 or not TOML, or whose `key` is not a profile name (a string like
    "r35": it picks `profiles/<name>.env`), is a FileFormatError naming the line and the value."""
    data = load_toml(Path(path), check_utf8(text, path))
    lines = text.splitlines()
    line = next((n for n, l in enumerate(lines, 1) if re.match(rf"^\s*{key}\s*=", l)), None)
    if key in data:
        name_at(path, line, key, data[key])
        return Finding(passed=True, description=f"{path}: {key} = {data[key]!r} is top-level")
    nested = _nested_key(data, key)
    if nested is None:
        return None
    header = next(
        (
            f"{lines[n - 1].strip()} (line {n})"
            for n in range(line or 0, 0, -1)
            if lines[n - 1].lstrip().startswith("[")
        ),
        "a table",
    )
    return Finding(
        passed=False,
        description=(
            f"{path}:{line}: {key} sits after {header} and parses into {nested}, not the top "
            "level: the recipe "
            f"silently builds with the base pins. Move it above the first [section]."
        ),
    )


def recipe_finding(root: Path, rel: str) -> Finding | None:
    """`recipe_profile_placement` of the recipe at `rel` under `root`; a recipe that cannot be read
    fails the check, naming file:line."""
    try:
        return recipe_profile_placement(read_text(root / rel, rel), rel)
    except FileFormatError as exc:
        return Finding(passed=False, description=str(exc))
