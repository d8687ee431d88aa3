"""Starting and stopping the real servers the tests
run: the parts every one of them does the same way.

tests/support/registry_server.py, tests/support/sshd_server.py, tests/support/postgres_server.py and
tests/support/ui/dagster_dev.py each start a server as our child on a free 127.0.0.1 port, poll a
readiness probe until a deadline while the process is alive, and stop it by its PID. What is
particular to one server (its config, its probe, sshd's per-connection children, the demo's process
group, `pg_ctl stop`) stays in its module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# After SIGKILL the process cannot refuse; the wait
# only reaps it (and covers a process stuck in IO).
KILL_WAIT_S = 10.0


class ServerNotReady(RuntimeError):
    """The server exited, or did not pass its readiness
    probe in time; the message has its log's tail."""


def free_port() -> int:
    """A port nobody listens on at 127.0.0.1 right now
    (the server binds it later: see start_on_free_port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_on_free_port(start: Callable[[int], T], *, attempts: int = 3) -> T:
    """`start(port)` on a fresh free port, again on another one if the server did not come up.

    Another process can take the port between free_port() and the server's bind; the last attempt's
    ServerNotReady (with that attempt's log) is what the caller sees.
    """
    for attempt in range(1, attempts + 1):
        try:
            return start(free_port())
        except ServerNotReady:
            if attempt == attempts:
                raise
    raise ValueError(f"attempts must be at least 1, not {attempts}")


def log_tail(path: Path, chars: int) -> str:
    """The last `chars` characters of a server's log,
    for an error message (which must not fail itself)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError as exc:
        return f"(no log: {exc})"


def wait_until_ready(
    proc: subprocess.Popen[bytes],
    probe: Callable[[], bool],
    *,
    timeout_s: float,
    interval_s: float,
    log: Path,
    tail_chars: int,
    message: Callable[[int | None, str], str],
    stop: Callable[[], None],
) -> None:
    """Return once `probe()` is true; otherwise stop the server and raise ServerNotReady.

    Polls while `proc` is alive and the deadline has not passed. The error's text is
    `message(returncode, tail)`: returncode is None when the server was still running at the
    deadline, so a caller can tell "it exited" from "it never answered"; tail is the end of `log`,
    read before `stop()` so it shows what the server said, not its shutdown. `stop()` also runs when
    the wait is interrupted (KeyboardInterrupt, a
    failing probe), so no server outlives a failed start.
    """
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if probe():
                return
            time.sleep(interval_s)
        raise ServerNotReady(message(proc.poll(), log_tail(log, tail_chars)))
    except BaseException:
        stop()
        raise


def stop_process(
    proc: subprocess.Popen[bytes], *, grace_s: float, group: bool = False, sigterm: bool = True
) -> None:
    """Stop exactly the process we started: SIGTERM, up
    to `grace_s` to exit, then SIGKILL; reaped either way.

    `group=True` signals its whole process group instead (the process was started with
    start_new_session, so the group is exactly what it started), even after the leader has exited,
    since its children may not have. `sigterm=False` when the caller has already asked it to stop
    in its own way (postgres: `pg_ctl stop`) and only the wait and the kill are left.
    """

    def send(sig: signal.Signals) -> None:
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)  # start_new_session: the leader's PID is the group id
        else:
            # a no-op once proc is reaped, so a recycled PID is never signalled
            proc.send_signal(sig)

    if sigterm:
        send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=KILL_WAIT_S)


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the stop helpers need."""

    pid: int
    state: str  # "Z" for a zombie
    ppid: int
    pgrp: int


def processes() -> list[ProcStat]:
    """Every process on the machine, from /proc; ones that vanish while we read are skipped."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid pgrp ...": comm may hold
            # spaces and ")", so split after the last ")".
            state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
            found.append(ProcStat(pid=int(entry.name), state=state, ppid=int(ppid), pgrp=int(pgrp)))
    return found
