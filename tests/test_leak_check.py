"""The session's leak check (tests/support/leaks.py, wired in tests/conftest.py) catches a process a
test leaves running: a nested pytest with this conftest,
on a test that starts a sleeper in its own session and
never stops it, fails, names the sleeper and leaves
it dead; the same run without the leak passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.processes import alive
from tests.support.leaks import SESSION_ENV

ROOT = Path(__file__).resolve().parent.parent

CLEAN = """
import subprocess


def test_starts_and_stops_a_sleeper() -> None:
    proc = subprocess.Popen(["sleep", "3001"], start_new_session=True)
    proc.kill()
    proc.wait()
"""

LEAKY = """
import subprocess
from pathlib import Path


def test_leaves_a_sleeper_running() -> None:
    proc = subprocess.Popen(["sleep", "3002"], start_new_session=True)  # never stopped: the leak
    Path({pidfile!r}).write_text(str(proc.pid))
"""


def _nested_pytest(test_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """pytest on `test_file` with this repo's conftest
    as a plugin (so its hooks run), one xdist worker."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(test_file.parent),
            *extra,
            str(test_file),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_leaked_process_fails_the_session_is_named_and_is_stopped(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper.pid"
    (tmp_path / "test_leaky.py").write_text(LEAKY.format(pidfile=str(pidfile)))

    run = _nested_pytest(tmp_path / "test_leaky.py", "-n", "1")

    output = run.stdout + run.stderr
    pid = int(pidfile.read_text())
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "1 passed" in output  # the test itself passed: the session failed for the leak alone
    assert f"LEAKED pid {pid}: sleep 3002" in output, output
    assert not alive(pid)


def test_a_session_that_stops_what_it_starts_passes(tmp_path: Path) -> None:
    (tmp_path / "test_clean.py").write_text(CLEAN)

    run = _nested_pytest(tmp_path / "test_clean.py", "-n", "1")

    assert run.returncode == 0 and "LEAKED" not in run.stdout, run.stdout + run.stderr


def test_a_nested_session_adds_its_token_and_keeps_the_outer_one() -> None:
    # This process is inside a marked session (a controller
    # or its worker): its children carry the token.
    tokens = os.environ[SESSION_ENV].split()
    assert tokens and all(len(t) == 32 for t in tokens)
