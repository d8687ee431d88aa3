"""Errors a person can act on: each names the file, line and value at fault, and what to do."""

from __future__ import annotations

from pathlib import Path


class LockstepError(Exception):
    """Base for every error lockstep raises on purpose (as opposed to a bug)."""


class Refused(LockstepError):
    """The question was asked and the answer is "no" (a promotion the policy forbids, a hold in the
    way, a build already rejected): nothing was changed. The command line exits 1 for it, not 3."""


class FileFormatError(LockstepError):
    """A file lockstep reads is not what it should be.

    Renders as ``path:line: what is wrong`` so editors and terminals can jump to it.
    """

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: {message}")


def decode_utf8(raw: bytes, path: str | Path) -> str:
    """`raw` as text, or a FileFormatError at the line
    of the first byte that is not UTF-8, or of a NUL.

    No text format lockstep reads holds a NUL, and C
    (git, the shell) ends a value at one where Python
    does not: a value with a NUL would mean one thing to lockstep and another to what it runs."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise FileFormatError(
            path, line, f"not UTF-8 text (byte {raw[exc.start]:#04x}): save the file as UTF-8"
        ) from None
    refuse_nul(text, path)
    return text


def refuse_nul(text: str, path: str | Path) -> None:
    """FileFormatError at the line of the first NUL character in `text`."""
    at = text.find("\0")
    if at >= 0:
        line = text.count("\n", 0, at) + 1
        raise FileFormatError(
            path,
            line,
            "holds a NUL byte (\\x00): not text; no value lockstep reads may contain one",
        )
