"""The lab's and the build repo's files as the Jovian graph takes them in: UTF-8 or refused, names
checked with the file and line they came from.

Locks, cmake files, `.gitmodules`, versions.env and recipes are written by other people; a byte
that is not UTF-8 or a name that breaks its rule (resources/names.py) is a FileFormatError naming
`path:line` and the value, never a traceback. Text that git handed over (GitPython decodes with
`surrogateescape`) carries a bad byte as a lone surrogate: `check_utf8` finds it there too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from pathlib import Path

from resources.errors import FileFormatError, LockstepError, refuse_nul
from resources.names import KNOWN_SCHEMES, NameRefused, PathEscape, check_name, check_url, under
from resources.reader import read_text as _read_text

_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def read_text(path: Path, shown: str | Path | None = None) -> str:
    """A regular file's text, refused unless it is UTF-8
    without NUL bytes (resources/reader.py: never a
    directory, FIFO or device, never past its size
    limit); errors name `shown` (default: the path)."""
    return _read_text(path, shown)


def check_utf8(text: str, path: str | Path) -> str:
    """`text` as given, refused when it holds a byte that was not UTF-8 (decoded with
    surrogateescape) or a NUL."""
    bad = _ESCAPED_BYTE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        byte = ord(bad.group()) - 0xDC00
        raise FileFormatError(
            path, line, f"not UTF-8 text (byte {byte:#04x}): save the file as UTF-8"
        )
    refuse_nul(text, path)
    return text


def _at(
    rule: Callable[[str, object], str], path: str | Path, line: int | None, kind: str, value: object
) -> str:
    try:
        return rule(kind, value)
    except NameRefused as exc:
        raise FileFormatError(path, line, str(exc)) from None


def name_at(path: str | Path, line: int | None, kind: str, value: object) -> str:
    """`check_name` with the file and line the value came from."""
    return _at(check_name, path, line, kind, value)


def url_at(
    path: str | Path,
    line: int | None,
    kind: str,
    value: object,
    schemes: Collection[str] = KNOWN_SCHEMES,
) -> str:
    """`check_url` with the file and line the value came from."""
    return _at(lambda k, v: check_url(k, v, schemes), path, line, kind, value)


class PathRefused(LockstepError):
    """A directory or file lockstep was about to write would be named by, or land outside its root
    because of, a value from outside; nothing was written."""


def inside(root: Path, *parts: str) -> Path:
    """`names.under(root, *parts)`, refused as a PathRefused
    (a LockstepError) when it would leave `root`."""
    try:
        return under(root, *parts)
    except PathEscape as exc:
        raise PathRefused(f"{exc}") from None


def path_under(root: Path, *parts: str, kind: str = "path part") -> Path:
    """`root/parts...` when every part is a plain name (check_name) and the result resolves inside
    `root`: the one way the Jovian assets build a directory from a rev, a dep name or a gitlink."""
    for part in parts:
        try:
            check_name(kind, part)
        except NameRefused as exc:
            raise PathRefused(f"{exc}: nothing was written under {root}") from None
    return inside(root, *parts)
