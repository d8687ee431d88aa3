"""`lockstep demo` stops what its sandbox runs when it is told to stop: a SIGTERM to the demo's own
process (as a service manager sends it; Ctrl-C takes the same path) ends `dagster dev` and then the
sandbox's Docker engines, by their PIDs."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from sandbox.engines import Engine, engine_dirs
from sandbox.processes import alive
from sandbox.teardown import stop_sandbox
from tests.support.ui.dagster_dev import start_demo, stop_demo

pytestmark = pytest.mark.heavy(40)  # seconds, about: `dagster dev` starting both code locations


def test_sigterm_to_the_demo_stops_dagster_dev_and_the_sandbox_engines(tmp_path: Path) -> None:
    demo = start_demo(tmp_path)
    try:
        engines = {state: Engine(state).pid() for state in engine_dirs(demo.sandbox.root)}
        # the demo started every node's engine
        assert len(engines) >= 3 and all(engines.values()), engines

        demo.proc.send_signal(signal.SIGTERM)  # the demo's process alone, not its group
        try:
            returncode = demo.proc.wait(90)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"`lockstep demo` still runs 90 s after SIGTERM; its log:\n{demo.log_tail()}"
            )

        assert returncode != 0
        assert [pid for pid in engines.values() if pid and alive(pid)] == [], demo.log_tail()
        assert "stopped engine" in demo.log_tail(20000), demo.log_tail()
    finally:
        stop_demo(demo)
        stop_sandbox(demo.sandbox.root)
