"""The one way lockstep takes a file in: a regular file of bounded size, UTF-8 without NUL bytes,
and (for TOML and JSON) nested no deeper than a person writes. Every parser reads through here.

Why each guard:
- type before open: `open()` on a FIFO blocks until a
  writer comes (a hung sensor tick), a directory is an
  `IsADirectoryError` traceback, a device reads forever. `os.stat` names the kind; the file is then
  opened with O_NONBLOCK and `fstat`ed again, so a
  FIFO swapped in between the two still cannot block.
- size: every file lockstep reads is written by a
  person or a tool and is kilobytes (a big uv.lock is a
  few MB); reading past `MAX_BYTES` only feeds a memory blow-up.
- NUL: no text format lockstep reads has one, and a NUL inside a value is cut short by C (git, the
  shell) where Python keeps it: the two would disagree about the value.
- nesting: tomllib and json recurse per level, so 50,000 `[` are a RecursionError, not an answer. A
  pre-scan of the brackets outside strings is cheap and names the line; a dotted key nests without
  brackets, so the parsed tree's depth is checked too (iteratively), before anything repr()s it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

from resources.errors import FileFormatError, decode_utf8

MAX_BYTES = 16 * 1024 * 1024
# Real files nest 2-5 levels (a uv.lock's inline tables, iris's tasks); 64 is far inside Python's
# recursion limit for tomllib, json and pydantic, and far beyond anything written on purpose.
MAX_DEPTH = 64

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse_kind(shown: str | Path, mode: int) -> None:
    kind = _kind(mode)
    if kind is not None:
        raise FileFormatError(
            shown, None, f"is {kind}, not a file: point lockstep at the file itself"
        )


def read_bytes(
    path: str | Path, shown: str | Path | None = None, *, limit: int = MAX_BYTES
) -> bytes:
    """The bytes of a regular file of at most `limit`
    bytes; anything else is a FileFormatError naming
    `shown` (default: the path): missing, unreadable,
    a directory, FIFO, device or socket, too big."""
    where = shown if shown is not None else path
    try:
        _refuse_kind(where, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileFormatError(where, None, "does not exist") from None
    except OSError as exc:
        raise FileFormatError(where, None, f"cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        # swapped for a FIFO after the stat: O_NONBLOCK kept the open from hanging
        _refuse_kind(where, st.st_mode)
        if st.st_size > limit:
            raise FileFormatError(
                where,
                None,
                (
                    f"is {st.st_size} bytes, more than the {limit} lockstep reads: not a file "
                    "it wrote or a person did"
                ),
            )
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while being read
                raise FileFormatError(where, None, f"is more than the {limit} bytes lockstep reads")
        return b"".join(chunks)
    except OSError as exc:
        raise FileFormatError(where, None, f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, shown: str | Path | None = None, *, limit: int = MAX_BYTES) -> str:
    """`read_bytes`, decoded: UTF-8 without NUL bytes,
    or a FileFormatError at the line of the bad byte."""
    return decode_utf8(read_bytes(path, shown, limit=limit), shown if shown is not None else path)


# -- nesting ---------------------------------------------------------------------------------------

# Only what can hide a bracket (strings, comments) and
# the brackets themselves; everything else is skipped.
_TOML_TOKENS = re.compile(
    r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]',
    re.DOTALL,
)
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def check_nesting(
    text: str, shown: str | Path, syntax: Literal["toml", "json"], *, limit: int = MAX_DEPTH
) -> None:
    """FileFormatError at the line where `[`/`{` outside
    strings and comments nest deeper than `limit`."""
    depth = 0
    for m in (_TOML_TOKENS if syntax == "toml" else _JSON_TOKENS).finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, m.start()) + 1
                raise FileFormatError(
                    shown,
                    line,
                    f"nested deeper than {limit} levels of [ and {{: no {syntax.upper()} "
                    "file lockstep reads nests like that (a generated or hostile file?)",
                )
        elif token in "]}":
            depth = max(depth - 1, 0)


def tree_problem(data: Any, limit: int = MAX_DEPTH) -> tuple[list[str | int], str] | None:
    """(path, what) of the first value nested deeper
    than `limit`, or of a key or string holding a NUL
    (TOML's and JSON's `\\u0000` escapes make one from clean
    bytes); None when there is neither. No recursion."""
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > limit:
            return path, f"nested deeper than {limit} levels"
        if isinstance(value, str) and "\0" in value:
            return path, "holds a NUL character (\\u0000)"
        if isinstance(value, dict):
            for k, v in reversed(value.items()):
                if "\0" in k:
                    return [
                        *path,
                        k.replace("\0", "\\0"),
                    ], "is a key holding a NUL character (\\u0000)"
                stack.append((v, [*path, k]))
        elif isinstance(value, list):
            stack.extend((v, [*path, i]) for i, v in reversed(list(enumerate(value))))
    return None


def json_path(path: list[str | int] | tuple[str | int, ...]) -> str:
    """`$.tasks[0].state`, as iris's and the bench tools' errors name a field."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


# -- strict JSON -----------------------------------------------------------------------------------


class _Duplicated(dict):  # type: ignore[type-arg]
    """An object that named a key twice: kept as a marker until its JSON path is known."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Duplicated(pairs, key)
        seen.add(key)
    return dict(pairs)


def _find_duplicate(data: Any) -> tuple[list[str | int], str] | None:
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _Duplicated):
            return path, value.key
        if isinstance(value, dict):
            stack.extend((v, [*path, k]) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, [*path, i]) for i, v in reversed(list(enumerate(value))))
    return None


def loads_json(text: str, shown: str | Path, *, limit: int = MAX_DEPTH) -> Any:
    """JSON as a person would read it: a key named twice in one object is refused (json.loads keeps
    the last one silently), as is nesting deeper than
    `limit`, NUL bytes and a syntax error, each as a
    FileFormatError naming `shown`, the line and, for a duplicate key, its JSON path."""
    if (nul := text.find("\0")) >= 0:
        raise FileFormatError(
            shown, text.count("\n", 0, nul) + 1, "holds a NUL byte: not JSON text"
        )
    check_nesting(text, shown, "json", limit=limit)
    try:
        data = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            shown, exc.lineno, f"not JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if (dup := _find_duplicate(data)) is not None:
        path, key = dup
        where = json_path([*path, key])
        raise FileFormatError(
            shown,
            _second_line(text, key),
            f"{where} is given twice: a JSON object names each key once "
            "(json.loads would keep the last one silently)",
        )
    if (problem := tree_problem(data, limit)) is not None:
        path, what = problem
        raise FileFormatError(
            shown, _second_line(text, str(path[-1])) if path else 1, f"{json_path(path)} {what}"
        )
    return data


def _second_line(text: str, key: str) -> int:
    """The line of the second `"key":` in the text (where
    a duplicate most likely is), else the first."""
    hits = [m.start() for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
    at = hits[1] if len(hits) > 1 else (hits[0] if hits else 0)
    return text.count("\n", 0, at) + 1
