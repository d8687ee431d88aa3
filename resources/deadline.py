"""One time budget shared by every outside call made inside a `budget()` block (a sensor tick).

Each call has its own deadline ([timeouts] in the site); a sensor tick must also end well inside
Dagster's 60 s sensor limit however many calls it makes. A context variable rather than a parameter
threaded through every git and registry method: the calls deep in GitRemotes.fetch or
HttpRegistry._request need it, and a tick is one thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

# Below this a call is not started: it could not even connect.
MIN_CALL_S = 0.05


@dataclass(frozen=True)
class Budget:
    ends: float  # time.monotonic() when it is spent
    seconds: float
    # what set it, as a person would raise it, e.g. "the
    # sensor tick's budget ([timeouts] sensor_tick_s)"
    name: str


_CURRENT: ContextVar[Budget | None] = ContextVar("lockstep_budget", default=None)


@contextlib.contextmanager
def budget(seconds: float, name: str) -> Iterator[Budget]:
    """Every call inside ends within `seconds` of now
    (a nested budget cannot extend an outer one)."""
    outer = _CURRENT.get()
    mine = Budget(ends=time.monotonic() + seconds, seconds=seconds, name=name)
    if outer is not None and outer.ends < mine.ends:
        mine = outer
    token = _CURRENT.set(mine)
    try:
        yield mine
    finally:
        _CURRENT.reset(token)


def limit(own_s: float, own_name: str) -> tuple[float, str]:
    """(seconds a call may take, the name of what
    bounds it): its own deadline, or what is left of the
    current budget when that is shorter."""
    current = _CURRENT.get()
    if current is None:
        return own_s, own_name
    left = current.ends - time.monotonic()
    if left >= own_s:
        return own_s, own_name
    return max(MIN_CALL_S, left), f"{current.name}, {current.seconds:g} s"
