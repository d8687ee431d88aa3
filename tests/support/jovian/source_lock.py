"""The lab's real r35 source lock, and line edits of a lock the bad-variant tests make."""

from __future__ import annotations

from pathlib import Path

# The lab's real lock, not a made-up one (where it came from: tests/corpus/lab/README.md).
R35_PATH = Path(__file__).resolve().parents[2] / "corpus" / "lab" / "r35.source.lock"


def replace_line(text: str, key: str, new_line: str | None) -> str:
    """The lock with the line of `key` replaced (or dropped when new_line is None)."""
    out = []
    for line in text.splitlines():
        if line.split("=", 1)[0] == key:
            if new_line is not None:
                out.append(new_line)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def line_no(text: str, key: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if line.split("=", 1)[0] == key)
