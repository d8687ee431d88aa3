"""Counts the suite prints at the end (tests/conftest.py's terminal summary): how many malformed
files were refused, how many hostile names, faults and canary scans were tried. A count that drops
means a corpus lost cases."""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()


def count(what: str, n: int = 1) -> None:
    COUNTS[what] += n
