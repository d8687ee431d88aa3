"""Counts the suite prints at the end (tests/conftest.py's terminal summary): how many malformed
files were refused, how many hostile names, faults and canary scans were tried. A count that drops
means a corpus lost cases."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

COUNTS: Counter[str] = Counter()


def count(what: str, n: int = 1) -> None:
    COUNTS[what] += n


def queue_fault(home: Path, fault: str) -> None:
    """The sandbox iris's next job misbehaves (sandbox.fake_iris.queue_fault), counted for the summary."""
    from sandbox.fake_iris import queue_fault as queue

    if fault != "ok":
        count("faults injected (iris jobs)")
    queue(home, fault)
