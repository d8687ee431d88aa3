"""TOML with line numbers: tomllib parses, this finds where a key sits so errors can name the line.

tomllib keeps no positions, and the well-kept round-trip parsers (tomlkit) would be a second TOML
implementation to trust; a line scan is enough to point a person at `file:line`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from resources.errors import FileFormatError, refuse_nul
from resources.reader import check_nesting, read_text, tree_problem
from resources.secrets import redact

# A key whose name says it holds a credential: its line is never shown, whatever is wrong with it.
SECRET_KEY = re.compile(
    r"(token|password|passwd|secret|passphrase|credential|api_key)", re.IGNORECASE
)
_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")
_NUL_ESCAPE = re.compile(r"\\(u0000|U00000000)")
_TOML_POS = re.compile(r"\(at line (\d+), column \d+\)")


def _norm(part: str) -> str:
    return part.strip().strip("\"'")


def load_toml(path: Path, text: str | None = None) -> dict[str, Any]:
    """Parse a TOML file (read through resources/reader.py
    when `text` is not given); a syntax error,
    a NUL byte or nesting deeper than reader.MAX_DEPTH becomes a FileFormatError with the line."""
    if text is None:
        text = read_text(path)
    refuse_nul(text, path)
    check_nesting(text, path, "toml")  # tomllib recurses per `[`/`{`: a RecursionError otherwise
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_POS.search(str(exc))
        line = int(m.group(1)) if m else 1
        raise FileFormatError(path, line, f"not valid TOML: {exc}{_shown(text, line)}") from None
    # A dotted key (`a.b.c...`) nests without a bracket, and "\u0000" makes a NUL from clean bytes:
    # the tree is checked before anything repr()s it or hands a value to git or a shell.
    if (problem := tree_problem(data)) is not None:
        where, what = problem
        key = str(where[-1]) if where else ""
        # A NUL reaches a TOML value only as an escape: its line is where that escape is written.
        nul = _NUL_ESCAPE.search(text) if "NUL" in what else None
        line = text.count("\n", 0, nul.start()) + 1 if nul else _line_naming(text, key)
        shown = ".".join(str(p) for p in where[:4]) + ("..." if len(where) > 4 else "")
        raise FileFormatError(
            path,
            line,
            f"{shown} {what}: no TOML file lockstep reads has that (a generated or hostile file?)",
        )
    return data


def _line_naming(text: str, key: str) -> int:
    """The first line that sets `key` (`key =`, `"key" =`), else the first that names it, else 1."""
    lines = text.splitlines()
    sets = re.compile(rf"""(^|[\s.{{,"'])({re.escape(key)})["']?\s*=""")
    return next(
        (n for n, t in enumerate(lines, 1) if key and sets.search(t)),
        next((n for n, t in enumerate(lines, 1) if key and key in t), 1),
    )


def _shown(text: str, line: int | None) -> str:
    """The line a syntax error is on, so the person sees
    the value; never one whose key names a secret."""
    lines = text.splitlines()
    if not line or line > len(lines):
        return ""
    shown = lines[line - 1].strip()
    return "" if SECRET_KEY.search(shown.split("=", 1)[0]) else f" in {redact(shown[:200])!r}"


def key_line(text: str, table: tuple[str, ...], key: str | None = None) -> int | None:
    """1-based line of `key` inside `[table]`; failing that, of the `[table]` header; else None.

    Keys before the first header are top-level (``table == ()``). A digit part of `table` is an
    index into an array of tables (``("spark", "nodes", "1")`` is the second ``[[spark.nodes]]``),
    as in pydantic's error locations. Dotted keys are matched on their first part, which is what a
    person would look for.
    """
    current: tuple[str, ...] = ()
    header_line: int | None = None
    arrays: dict[tuple[str, ...], int] = {}  # array-of-tables path -> entries seen so far
    for number, line in enumerate(text.splitlines(), start=1):
        if m := _HEADER.match(line):
            parts = [_norm(p) for p in m.group(1).split(".")]
            is_array = line.lstrip().startswith("[[")
            if is_array:
                bare = tuple(parts)
                arrays[bare] = arrays.get(bare, 0) + 1
            current = _indexed(parts, arrays, defining_array=is_array)
            if current == table and header_line is None:
                header_line = number
            continue
        if (
            key is not None
            and current == table
            and (m := _KEY.match(line))
            and _norm(m.group(1).split(".")[0]) == key
        ):
            return number
    return header_line


def _indexed(
    parts: list[str], arrays: dict[tuple[str, ...], int], *, defining_array: bool
) -> tuple[str, ...]:
    """A header's path with the index of the current entry after every array-of-tables prefix."""
    out: list[str] = []
    for i in range(len(parts)):
        out.append(parts[i])
        prefix = tuple(parts[: i + 1])
        if prefix in arrays and (i < len(parts) - 1 or defining_array):
            out.append(str(arrays[prefix] - 1))
    return tuple(out)
