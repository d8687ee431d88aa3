"""Every instance config fails a run whose worker died, so it frees its pool slot (`tag_moves` = 1:
a dead promotion would otherwise block every move of `:tpu`): run monitoring on, never resumed (a
resumed promotion would repeat its PUT), with a launcher that can check a worker — the demo's
LocalRunLauncher, DockerRunLauncher, K8sRunLauncher. And LocalRunLauncher's verdicts, offline and
fast. (That the daemon acts on them: tests/tpu/test_floating_tag_log.py, under dagster-daemon.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.events import EngineEventData
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import WorkerStatus
from dagster._core.test_utils import create_run_for_test
from dagster_docker import DockerRunLauncher
from dagster_k8s import K8sRunLauncher

from lockstep.run_launcher import LocalRunLauncher, process_state, worker_health, worker_started
from tests.support.deploy.k8s_chart import load_values, render_instance

REPO = Path(__file__).resolve().parents[2]
SANDBOX = REPO / "deploy" / "sandbox" / "dagster.yaml"
DOCKER = REPO / "deploy" / "docker" / "dagster.yaml"
NOW = 1_800_000_000.0


def _checks_workers(launcher: type) -> bool:
    """The launcher's `supports_check_run_worker_health`,
    read without building it (K8s would want a cluster)."""
    return launcher.supports_check_run_worker_health.fget(None)  # type: ignore[attr-defined]


@pytest.fixture
def demo_instance(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The demo's instance exactly as `lockstep demo` copies it (SQLite in tmp)."""
    shutil.copy(SANDBOX, tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        yield instance


def test_the_demo_instance_monitors_runs_with_a_launcher_that_checks_workers(
    demo_instance: dg.DagsterInstance,
) -> None:
    dagster_instance_config(str(Path(demo_instance.root_directory)))  # Dagster's own schema
    launcher = demo_instance.run_launcher
    assert isinstance(launcher, LocalRunLauncher) and isinstance(launcher, dg.DefaultRunLauncher)
    assert launcher.supports_check_run_worker_health and not launcher.supports_resume_run
    assert demo_instance.run_monitoring_enabled
    assert demo_instance.run_monitoring_max_resume_run_attempts == 0
    # a laptop: seconds, not Dagster's 120
    assert demo_instance.run_monitoring_poll_interval_seconds <= 10
    # a loaded machine starts a worker slowly
    assert demo_instance.run_monitoring_start_timeout_seconds >= 600


def test_the_team_deployments_monitor_runs_with_launchers_that_check_workers() -> None:
    docker = yaml.safe_load(DOCKER.read_text(encoding="utf-8"))
    assert docker["run_launcher"]["class"] == "DockerRunLauncher" and _checks_workers(
        DockerRunLauncher
    )
    assert (
        docker["run_monitoring"]["enabled"] is True
        and docker["run_monitoring"]["max_resume_run_attempts"] == 0
    )
    k8s = render_instance(load_values())
    assert k8s["run_launcher"]["class"] == "K8sRunLauncher" and _checks_workers(K8sRunLauncher)
    assert (
        k8s["run_monitoring"]["enabled"] is True
        and k8s["run_monitoring"]["max_resume_run_attempts"] == 0
    )
    assert not _checks_workers(dg.DefaultRunLauncher)  # why the demo needs its own


# -- LocalRunLauncher's verdicts -------------------------------------------------------------------


def test_a_worker_that_is_gone_a_zombie_or_a_reused_pid_is_failed() -> None:
    gone = worker_health(pid=41, logged_at=NOW, host="localhost", state=None)
    assert gone.status == WorkerStatus.FAILED and "(pid 41) is gone" in (gone.msg or "")
    zombie = worker_health(pid=41, logged_at=NOW, host=None, state=("Z", NOW - 5))
    assert zombie.status == WorkerStatus.FAILED and "zombie" in (zombie.msg or "")
    reused = worker_health(pid=41, logged_at=NOW, host="127.0.0.1", state=("S", NOW + 60))
    assert reused.status == WorkerStatus.FAILED and "started after it" in (reused.msg or "")


def test_a_live_worker_or_one_that_cannot_be_judged_is_running() -> None:
    assert (
        worker_health(pid=41, logged_at=NOW, host=None, state=("S", NOW - 1)).status
        == WorkerStatus.RUNNING
    )
    assert (
        worker_health(pid=41, logged_at=NOW, host="localhost", state=("?", None)).status
        == WorkerStatus.RUNNING
    )
    in_process = worker_health(pid=None, logged_at=0, host=None, state=None)
    assert in_process.status == WorkerStatus.RUNNING and "not checked" in (in_process.msg or "")
    remote = worker_health(pid=41, logged_at=NOW, host="code.example.org", state=None)
    assert remote.status == WorkerStatus.RUNNING and "code.example.org" in (remote.msg or "")


def test_the_worker_pid_is_read_from_its_start_event_only() -> None:
    assert worker_started("Started process for run (pid: 1234).") == 1234
    assert worker_started("Started process for resuming job (pid: 99).") == 99
    assert worker_started("Executing steps in process (pid: 1234)") is None
    assert worker_started("Started process for run (pid: x).") is None


def test_process_state_reads_proc_and_a_command_name_with_spaces_and_parentheses(
    tmp_path: Path,
) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    (tmp_path / "77").mkdir()
    # fields 4-21, then 22: starttime, in clock ticks
    rest = " ".join(["1"] * 18 + ["250"] + ["0"] * 10)
    (tmp_path / "77" / "stat").write_text(f"77 (python -c (x)) Z {rest}\n")
    state, started = process_state(77, proc=tmp_path)  # type: ignore[misc]
    assert state == "Z" and started == 1_700_000_000 + 250 / os.sysconf("SC_CLK_TCK")
    assert process_state(78, proc=tmp_path) is None


def test_the_launcher_judges_a_run_by_the_pid_its_worker_logged(
    demo_instance: dg.DagsterInstance,
) -> None:
    launcher = demo_instance.run_launcher
    run = create_run_for_test(demo_instance, job_name="promote_tpu")
    # in-process: nothing logged
    assert "not checked" in (launcher.check_run_worker_health(run).msg or "")
    demo_instance.report_engine_event(
        f"Started process for run (pid: {os.getpid()}).",
        run,
        EngineEventData.in_process(os.getpid()),
    )
    # this test's own process
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
    dead = _dead_pid()
    demo_instance.report_engine_event(
        f"Started process for run (pid: {dead}).", run, EngineEventData.in_process(dead)
    )
    verdict = launcher.check_run_worker_health(run)  # the newest start event counts
    assert verdict.status == WorkerStatus.FAILED and f"(pid {dead}) is gone" in (verdict.msg or "")


def _dead_pid() -> int:
    """A pid no process has now: a child that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
