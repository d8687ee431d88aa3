"""Counts the suite prints at the end (tests/conftest.py's terminal summary): how many malformed
files were refused, how many hostile names, faults and canary scans were tried. A count that drops
means a corpus lost cases."""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

COUNTS: Counter[str] = Counter()


def count(what: str, n: int = 1) -> None:
    COUNTS[what] += n


# How a malformed input can end: only the first is right. Each is counted, zeros included, so the
# summary shows what a regression would be, and `tried`
# hands the outcome back for the test to assert on.
REFUSED = "malformed files refused with file:line"
OUTCOMES = (
    REFUSED,
    "malformed files refused without a location",
    "malformed files accepted silently",
    "malformed files crashed (not a LockstepError)",
)


def tried(
    read: Callable[[], object], located: Callable[[Exception], bool]
) -> tuple[str, Exception | None, str]:
    """Run one reader over one malformed input: (outcome,
    the exception, what to show when it is wrong).

    `located` says whether a LockstepError names where the fault is (file:line or a JSON path)."""
    from resources.errors import LockstepError

    for what in OUTCOMES:
        count(what, 0)
    try:
        read()
    except LockstepError as exc:
        outcome = REFUSED if located(exc) else OUTCOMES[1]
        count(outcome)
        return outcome, exc, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - the point: anything but a LockstepError is a crash
        count(OUTCOMES[3])
        return OUTCOMES[3], exc, traceback.format_exc()
    count(OUTCOMES[2])
    return OUTCOMES[2], None, "the input was accepted"


def queue_fault(home: Path, fault: str) -> None:
    """The sandbox iris's next job misbehaves
    (sandbox.fake_iris.queue_fault), counted for the summary."""
    from sandbox.fake_iris import queue_fault as queue

    if fault != "ok":
        count("faults injected (iris jobs)")
    queue(home, fault)
