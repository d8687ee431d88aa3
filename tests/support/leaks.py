"""The test session's leak check: every process a test session starts carries a marker in its
environment, and whatever still carries it when the session ends has leaked.

The controller (the `pytest` process, not an xdist worker) adds a fresh token to
``LOCKSTEP_TEST_SESSION`` before any worker or test starts; every child inherits it through its
environment: xdist workers, the servers tests start, a sandbox's ``dockerd`` and through it
containerd and the shims. A token is added, not set, so a pytest run inside a test is checked by its
own token and its processes still carry the outer one. At the end the controller reads
``/proc/*/environ``: a live process carrying its token (other than itself and its exiting xdist
workers), and every process below one (a container's processes get their environment from the
container, not from the shim that started them), has leaked. Leaks are stopped (SIGTERM, then
SIGKILL: by process group when the group is not the controller's own) and named.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SESSION_ENV = "LOCKSTEP_TEST_SESSION"
# what is still exiting at session end (an xdist worker, a git cat-file it ran) gets this long
SETTLE_S = 10.0
STOP_GRACE_S = 5.0
# The command line execnet starts an xdist worker with: `python -c "import
# sys;exec(eval(sys.stdin.readline()))"`.
_WORKER_BOOTSTRAP = b"exec(eval(sys.stdin.readline()))"


@dataclass(frozen=True)
class Leak:
    pid: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.cmdline}"


def mark_session() -> str:
    """Add this session's token to the environment every child inherits; return it."""
    token = uuid.uuid4().hex
    os.environ[SESSION_ENV] = " ".join([*os.environ.get(SESSION_ENV, "").split(), token])
    return token


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        state, ppid, pgrp = text[text.rindex(")") + 2 :].split()[:3]
        return state, int(ppid), int(pgrp)
    except (OSError, ValueError, IndexError):
        return None


def _carries(pid: int, token: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    prefix = f"{SESSION_ENV}=".encode()
    return any(
        token in entry[len(prefix) :].decode(errors="replace").split()
        for entry in environ.split(b"\0")
        if entry.startswith(prefix)
    )


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return "?"


def _xdist_worker(pid: int, parent: int) -> bool:
    stat = _stat(pid)
    with contextlib.suppress(OSError):
        return (
            stat is not None
            and stat[1] == parent
            and _WORKER_BOOTSTRAP in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
    return False


def find(token: str, *, me: int) -> list[int]:
    """Live processes carrying `token` (or below one), except `me` and my xdist workers."""
    live: dict[int, tuple[str, int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] != "Z":
            live[int(entry.name)] = stat
    marked = {
        pid for pid in live if pid != me and _carries(pid, token) and not _xdist_worker(pid, me)
    }
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in live.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(marked), list(marked)
    while todo:
        for child in children.get(todo.pop(), []):
            if child != me and child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def check(token: str) -> list[Leak]:
    """What of this session still runs after a short settle, stopped; empty when nothing leaked."""
    me = os.getpid()
    gc.collect()  # GitPython's Repo objects end their `git cat-file` helpers when collected
    deadline = time.monotonic() + SETTLE_S
    while (pids := find(token, me=me)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not pids:
        return []
    leaks = [Leak(pid, _cmdline(pid)) for pid in pids]
    _stop(pids, me_group=os.getpgrp())
    return leaks


def _stop(pids: list[int], *, me_group: int) -> None:
    def signal_all(sig: signal.Signals) -> None:
        for pid in pids:
            stat = _stat(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if stat is not None and stat[2] not in (me_group, 0) and stat[2] == pid:
                    os.killpg(pid, sig)  # a group leader (start_new_session): its whole group
                else:
                    os.kill(pid, sig)  # never the controller's own group: that is us and our shell

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_all(signal.SIGKILL)
