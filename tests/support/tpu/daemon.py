"""`dagster-daemon run` on a prepared instance, as the crash test needs it: started in its own
session from the repo root (under `env --default-signal=INT,TERM`, like
tests/support/ui/dagster_dev.py),
killed -9 with everything it started, or stopped by PID; and waits that fail with the log's tail."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from tests.support.servers import log_tail, processes, stop_process

ROOT = Path(__file__).resolve().parents[3]
DEMO_YAML = ROOT / "deploy" / "sandbox" / "dagster.yaml"
T = TypeVar("T")


def write_demo_home(home: Path) -> None:
    """The demo's instance (deploy/sandbox/dagster.yaml), with the queue and run monitoring polling
    every second, so the test waits seconds, not the laptop's intervals."""
    config = yaml.safe_load(DEMO_YAML.read_text(encoding="utf-8"))
    config["run_coordinator"]["config"]["dequeue_interval_seconds"] = 1
    config["run_monitoring"]["poll_interval_seconds"] = 1
    config["telemetry"] = {"enabled": False}
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


def start_daemon(workspace: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    daemon = Path(sys.executable).parent / "dagster-daemon"
    with log.open("ab") as out:
        return subprocess.Popen(
            ["env", "--default-signal=INT,TERM", str(daemon), "run", "-w", str(workspace)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def live_members(pgid: int) -> list[int]:
    return [p.pid for p in processes() if p.pgrp == pgid and p.state != "Z"]


def is_gone(pid: int) -> bool:
    return not any(p.pid == pid and p.state != "Z" for p in processes())


def kill_hard(proc: subprocess.Popen[bytes], *, also: int, log: Path) -> None:
    """SIGKILL the daemon's whole session (its code
    servers, their run workers) and `also`, a process
    that may sit elsewhere; wait until none of them is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(also, signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(
        "the killed processes to be gone",
        lambda: not live_members(proc.pid) and is_gone(also),
        log,
        30,
    )


def stop_daemon(proc: subprocess.Popen[bytes], log: Path) -> None:
    stop_process(proc, grace_s=25, group=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a code server still shutting down
    wait_for("the daemon's processes to stop", lambda: not live_members(proc.pid), log, 30)


def wait_for(what: str, done: Callable[[], T], log: Path, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := done():
            return value
        time.sleep(0.25)
    pytest.fail(
        f"{what}: not within {timeout_s:.0f} s; {log.name}:\n{log_tail(log, 4000)}", pytrace=False
    )
