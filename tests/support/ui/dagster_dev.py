"""`lockstep demo` as a pytest fixture: a sandbox in
tmp, `dagster dev` on a free port, stopped by PID.

The demo is started the way a user starts it (`lockstep demo --dir DIR --port N` from the repo
root), under `env --default-signal=INT,TERM`: a `dagster dev` started from a script that ignores
SIGINT/SIGTERM (as pytest's runners may) would otherwise ignore them too, and could not be stopped
cleanly. It runs in its own session, so its process group is exactly what it started (webserver,
daemon, code servers); at the end the group gets SIGTERM, then SIGKILL for anything still there, and
nothing is left behind. The port, the readiness loop and the
terminate/wait/kill are tests/support/servers.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from sandbox.teardown import stop_sandbox
from sandbox.world import Sandbox, up
from tests.support.servers import (
    ServerNotReady,
    free_port,
    log_tail,
    processes,
    stop_process,
    wait_until_ready,
)

ROOT = Path(__file__).resolve().parents[3]
# dagster dev answers /server_info after ~18-25 s on a quiet machine; with the browser and the
# daemon tests each starting one on a parallel worker
# of a loaded 2-core machine, it took over 120 s once.
READY_TIMEOUT_S = 300.0
STOP_GRACE_S = 25.0


@dataclass
class Demo:
    url: str
    sandbox: Sandbox
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return log_tail(self.log, chars)


def lockstep_command() -> Path:
    """The `lockstep` console script of the environment running the tests (the project venv)."""
    script = Path(sys.executable).parent / "lockstep"
    if not script.exists():
        pytest.fail(
            f"no `lockstep` console script next to {sys.executable}: run the tests with `uv run "
            "pytest` "
            "(or `./dev test`) so the project is installed",
            pytrace=False,
        )
    return script


def start_demo(tmp: Path) -> Demo:
    sb = up(tmp / "sandbox")
    port = free_port()
    return start_process(
        [str(lockstep_command()), "demo", "--dir", str(sb.root), "--port", str(port)],
        url=f"http://127.0.0.1:{port}",
        sandbox=sb,
        log=tmp / "demo.log",
        env=dict(os.environ),
    )


def start_process(
    argv: list[str], *, url: str, sandbox: Sandbox, log: Path, env: dict[str, str]
) -> Demo:
    """Start a Dagster UI process (the demo, or `dagster dev` on a prepared instance) in its own
    session from the repo root, and wait until `url` answers."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["env", "--default-signal=INT,TERM", *argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    demo = Demo(url=url, sandbox=sandbox, proc=proc, log=log)
    wait_ready(demo)  # which stops it, if it does not come up
    return demo


def wait_ready(demo: Demo) -> None:
    """Until /server_info answers; else the demo is
    stopped and the test fails with its log's tail."""
    last = "no answer yet"  # the probe's last error, for the timeout message

    def answers() -> bool:
        nonlocal last
        try:
            return requests.get(f"{demo.url}/server_info", timeout=2).ok
        except requests.RequestException as exc:
            last = type(exc).__name__
            return False

    def message(returncode: int | None, tail: str) -> str:
        if returncode is not None:
            return (
                f"`lockstep demo` exited with {returncode} before the UI answered; its log:\n{tail}"
            )
        return (
            f"{demo.url}/server_info did not answer within {READY_TIMEOUT_S:.0f} s ({last}); the "
            "demo's log:\n"
            f"{tail}"
        )

    try:
        wait_until_ready(
            demo.proc,
            answers,
            timeout_s=READY_TIMEOUT_S,
            interval_s=0.5,
            log=demo.log,
            tail_chars=4000,
            message=message,
            stop=lambda: stop_demo(demo),
        )
        return
    except ServerNotReady as exc:
        failure = str(exc)
    # Failed outside the except block: the report is
    # the message and the log, not a chained traceback.
    pytest.fail(failure, pytrace=False)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`, read from /proc."""
    return [info.pid for info in processes() if info.pgrp == pgid and info.state != "Z"]


def stop_demo(demo: Demo) -> None:
    """SIGTERM to the demo's process group, wait, then SIGKILL whatever is left in it."""
    pgid = demo.proc.pid  # start_new_session: the leader's pid is the group id
    stop_process(demo.proc, grace_s=STOP_GRACE_S, group=True)
    # dagster dev can restart a code server while it shuts
    # down: give stragglers a moment, then kill them.
    deadline = time.monotonic() + 5
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
    left = _group_members(pgid)
    assert not left, f"processes of the demo still running after SIGKILL: {left}"


_SENSORS = """
query Sensors($repo: RepositorySelector!) {
  sensorsOrError(repositorySelector: $repo) {
    __typename ... on Sensors { results { name sensorState { id status } } }
  }
}
"""
_STOP_SENSOR = "mutation Stop($id: String!) { stopSensor(id: $id) { __typename } }"
LOCATIONS = ("tpu", "jovian")


def stop_sensors(url: str, names: set[str] | None = None) -> list[str]:
    """Stop the running sensors of both code locations named in `names` (all when None) through the
    webserver's GraphQL, as the UI's switch does; the names of those stopped."""
    from lockstep.graphql import REPOSITORY, Webserver

    web, stopped = Webserver(url, timeout_s=30), []
    for location in LOCATIONS:
        repo = {"repositoryLocationName": location, "repositoryName": REPOSITORY}
        found = web.query(_SENSORS, {"repo": repo})["sensorsOrError"]
        assert found["__typename"] == "Sensors", f"{location}: sensorsOrError answered {found}"
        for sensor in found["results"]:
            state = sensor["sensorState"]
            if (names is None or sensor["name"] in names) and state["status"] == "RUNNING":
                done = web.query(_STOP_SENSOR, {"id": state["id"]})["stopSensor"]["__typename"]
                assert done == "StopSensorMutationResult", f"stopping {sensor['name']}: {done}"
                stopped.append(sensor["name"])
    return stopped


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """`lockstep demo` on a fresh sandbox in tmp, on a free port, for the module's tests (a start is
    ~30 s of both cores); stopped (and checked stopped) afterwards."""
    server = start_demo(tmp_path_factory.mktemp("demo"))
    try:
        yield server
    finally:
        try:
            stop_demo(server)
        finally:
            # The demo stops its sandbox on SIGTERM; should it have been killed first, what it left
            # (engines, iris jobs, the git daemon) is
            # stopped here, by the PIDs the sandbox recorded.
            stop_sandbox(server.sandbox.root)
