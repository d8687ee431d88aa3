"""The run launcher of a single-host instance (the demo's, deploy/sandbox/dagster.yaml): Dagster's
DefaultRunLauncher, plus the worker health check it lacks, so run monitoring can fail a dead run.

A run the DefaultRunLauncher starts is a process the code server spawns. While that code server
lives it notices its child die and fails the run; when the code server dies too (the demo killed
-9, the laptop's OOM killer, a crash) nobody does, and the run stays STARTED for ever, holding its
pool slot: with `tag_moves` = 1, no promote, rollback or hold release could run again. The run
worker says its pid in the event log when it starts ("Started process for run (pid: N)."); this
launcher looks that process up on this host. Gone, a zombie, or a newer process that reuses the pid
-> WorkerStatus.FAILED, and the monitoring daemon marks the run failed, which frees the slot.

A run the check cannot judge is reported RUNNING with the reason: one this launcher did not start
(executed in-process by a script or `dagster asset materialize`: no worker pid is logged), or one
whose code server is on another host. Failing those would kill runs that may be healthy.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import dagster as dg
from dagster._core.events import DagsterEventType
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG

# What the run worker logs first (dagster/_grpc/impl.py; `dagster api execute_run` logs the same).
WORKER_STARTED = ("Started process for run (pid: ", "Started process for resuming job (pid: ")
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", ""}
# Slack between a process's start as /proc counts it (clock ticks) and the event's wall-clock time.
_START_SLACK_S = 2.0


def worker_started(message: str) -> int | None:
    """The pid in the run worker's start event, or None for any other message."""
    for prefix in WORKER_STARTED:
        if message.startswith(prefix):
            digits = message[len(prefix) :].split(")", 1)[0]
            return int(digits) if digits.isdigit() else None
    return None


def process_state(pid: int, *, proc: Path = Path("/proc")) -> tuple[str, float | None] | None:
    """A live process's state letter and start time (epoch seconds), or None when no such process.

    Linux: read from /proc (a zombie is dead for our purposes: its state is `Z`). Elsewhere (a
    macOS laptop): `kill(pid, 0)` says whether the pid exists, with no state and no start time.
    """
    stat = proc / str(pid) / "stat"
    if proc.is_dir():
        try:
            text = stat.read_text()
        except (FileNotFoundError, ProcessLookupError):
            return None
        # The command name is in parentheses and may hold
        # spaces: the fields start after the last ")".
        fields = text.rsplit(")", 1)[1].split()
        state, start_ticks = fields[0], int(fields[19])
        return state, _boot_time(proc) + start_ticks / os.sysconf("SC_CLK_TCK")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, owned by someone else
    return "?", None


def _boot_time(proc: Path) -> float:
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def worker_health(
    *, pid: int | None, logged_at: float, host: str | None, state: tuple[str, float | None] | None
) -> CheckRunHealthResult:
    """The verdict on one run worker, from what the event log and this host say about it.

    `pid` and `logged_at`: from the worker's start event (None: no such event); `host`: where its
    code server runs (None: a local socket); `state`: `process_state(pid)` on this host.
    """
    if pid is None:
        return CheckRunHealthResult(
            WorkerStatus.RUNNING,
            "not checked: no run worker pid in the event log (a run "
            "executed in-process, not started by this launcher)",
        )
    if host is not None and host not in LOCAL_HOSTS and host != socket.gethostname():
        return CheckRunHealthResult(
            WorkerStatus.RUNNING,
            f"not checked: the run worker (pid {pid}) runs on {host}, not on this host",
        )
    if state is None:
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"the run worker process (pid {pid}) is gone: it was "
            "killed or crashed without recording the end of the run",
            run_worker_id=str(pid),
        )
    letter, started = state
    if letter == "Z":
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"the run worker process (pid {pid}) has exited (a zombie its parent has not reaped)",
            run_worker_id=str(pid),
        )
    if started is not None and started > logged_at + _START_SLACK_S:
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"the run worker process (pid {pid}) is gone: pid {pid} "
            "now belongs to a process started after it",
            run_worker_id=str(pid),
        )
    return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(pid))


class LocalRunLauncher(dg.DefaultRunLauncher):
    """DefaultRunLauncher whose runs run monitoring can
    check: the worker's pid, looked up on this host."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        pid, logged_at = self._worker_pid(run.run_id)
        grpc = json.loads(run.tags.get(GRPC_INFO_TAG) or "{}")
        host = None if "socket" in grpc else grpc.get("host")
        return worker_health(
            pid=pid,
            logged_at=logged_at,
            host=host,
            state=process_state(pid) if pid is not None else None,
        )

    def _worker_pid(self, run_id: str) -> tuple[int | None, float]:
        """The newest worker start event of the run: its pid and when it was logged."""
        found: tuple[int | None, float] = (None, 0.0)
        cursor = None
        while True:
            page = self._instance.event_log_storage.get_records_for_run(
                run_id, cursor=cursor, of_type=DagsterEventType.ENGINE_EVENT, limit=100
            )
            for record in page.records:
                pid = worker_started(record.event_log_entry.message or "")
                if pid is not None:
                    found = (pid, record.event_log_entry.timestamp)
            if not page.has_more:
                return found
            cursor = page.cursor
