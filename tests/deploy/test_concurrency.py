"""Concurrency with the daemon running against a real instance: builds on one DGX node and moves of
`:tpu` are serialized by the instance's pools, not by luck.

The instance has production's QueuedRunCoordinator and concurrency blocks
(deploy/docker/dagster.yaml: pools at run granularity, default limit 1) on a real Postgres the test
session starts. Two revs are adopted and one TPU build is verified in-process on that instance; then
`dagster dev` (webserver + daemon, sensors stopped) is started on it, and two `build_jovian_rev`
runs for the same build node and two `promote_tpu` runs are submitted through Dagster's GraphQL
client, as the UI would. The runs' start and end times, read back from
the instance, must not overlap within each pair.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster_graphql import DagsterGraphQLClient

from jovian_assets.keys import node_pool
from sandbox.jovian_world import BUILD_NODE, new_lab_rev
from sandbox.teardown import stop_sandbox
from sandbox.world import Sandbox, advance_harbor
from tests.support.deploy.instance import PRODUCTION_YAML, write_production_home
from tests.support.jovian.lab import Lab
from tests.support.postgres_server import PostgresServer
from tests.support.runs import Pipeline, failure_message
from tests.support.ui.dagster_dev import (
    ROOT,
    Demo,
    free_port,
    lockstep_command,
    start_process,
    stop_demo,
)

pytestmark = pytest.mark.heavy(160)  # about the seconds the module takes alone (-n 0)

DEMO_YAML = ROOT / "deploy" / "sandbox" / "dagster.yaml"
RUN_TIMEOUT_S = 300.0


@pytest.fixture
def home(
    sb: Sandbox, tmp_path: Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A DAGSTER_HOME with production's instance config (deploy/docker/dagster.yaml: Postgres
    storage, queue and pool rules) on a real Postgres; runs are local processes (no Docker engine
    here). The `DAGSTER_POSTGRES_*` it reads are set here, so the
    in-process instance and every process this test
    starts (dagster dev, lockstep pools) see them."""
    home = tmp_path / "dagster_home"
    for name, value in write_production_home(home, postgres.fresh_database("concurrency")).items():
        monkeypatch.setenv(name, value)
    return home


def test_the_demo_queues_with_the_production_pool_rules() -> None:
    demo, production = (
        yaml.safe_load(p.read_text(encoding="utf-8")) for p in (DEMO_YAML, PRODUCTION_YAML)
    )
    assert (
        demo["concurrency"]["pools"]
        == production["concurrency"]["pools"]
        == {"granularity": "run", "default_limit": 1}
    )
    assert (
        demo["run_coordinator"]["class"]
        == production["run_coordinator"]["class"]
        == "QueuedRunCoordinator"
    )


@pytest.fixture
def instance(home: Path, sb: Sandbox) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield inst
    stop_sandbox(sb.root)  # iris jobs, engines, the git daemon: by PID


def start_ui(sb: Sandbox, home: Path, tmp_path: Path) -> Demo:
    """`dagster dev` on the prepared instance; sensors
    stay STOPPED (no LOCKSTEP_SENSORS_RUNNING), so the
    only runs are the ones this test submits."""
    env = {k: v for k, v in os.environ.items() if k != "LOCKSTEP_SENSORS_RUNNING"}
    env |= {
        "DAGSTER_HOME": str(home),
        "LOCKSTEP_SITE": str(sb.site_file),
        "LOCKSTEP_CACHE": str(sb.root / "cache"),
    }
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(ROOT / "workspace.yaml"),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    return start_process(
        argv, url=f"http://127.0.0.1:{port}", sandbox=sb, log=tmp_path / "dagster-dev.log", env=env
    )


def wait_finished(
    instance: dg.DagsterInstance, run_ids: list[str], demo: Demo
) -> dict[str, dg.RunRecord]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        records = {
            r.dagster_run.run_id: r
            for r in instance.get_run_records(dg.RunsFilter(run_ids=run_ids))
        }
        if len(records) == len(run_ids) and all(
            r.dagster_run.is_finished for r in records.values()
        ):
            return records
        time.sleep(1)
    states = {
        r.dagster_run.run_id[:8]: r.dagster_run.status.value
        for r in instance.get_run_records(dg.RunsFilter(run_ids=run_ids))
    }
    pytest.fail(
        f"runs not finished within {RUN_TIMEOUT_S:.0f} s: {states}; dagster dev "
        f"log:\n{demo.log_tail()}"
    )


def window(record: dg.RunRecord) -> tuple[float, float]:
    assert record.start_time is not None and record.end_time is not None, record.dagster_run.status
    return record.start_time, record.end_time


def run_error(instance: dg.DagsterInstance, run_id: str) -> str:
    failures = [
        e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_step_failure
    ]
    return "\n".join(
        str(
            e.dagster_event.step_failure_data.error.cause or e.dagster_event.step_failure_data.error
        )  # type: ignore[union-attr]
        for e in failures
    )


def test_builds_on_one_node_and_tag_moves_never_overlap_under_the_daemon(
    sb: Sandbox,
    resources: dict[str, object],
    home: Path,
    instance: dg.DagsterInstance,
    tmp_path: Path,
) -> None:
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    # Prepared in-process on the same instance: one verified TPU build, two adopted lab revs.
    tpu = Pipeline(sb, resources, instance)
    advance_harbor(sb.root, fix=True)
    commit = tpu.relock()
    built = tpu.build(commit)
    assert built.success, failure_message(built)
    lab = Lab(sb, {k: resources[k] for k in ("site", "git", "spark")}, instance)
    for rev in ("r28", "r29"):
        new_lab_rev(sb.root, rev)
        adopted = lab.adopt(rev)
        assert adopted.success, failure_message(adopted)

    # The README's step: `lockstep pools --apply` sets every pool the site needs, explicitly. (The
    # instance's default_limit alone leaves a window in Dagster 1.13 — see lockstep/pools.py.)
    env = {**os.environ, "DAGSTER_HOME": str(home), "LOCKSTEP_SITE": str(sb.site_file)}
    done = subprocess.run(
        [str(lockstep_command()), "pools", "--apply", "--iris-builds", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()} == {
        node_pool(BUILD_NODE): 1,
        "tag_moves": 1,
        "iris_builds": 2,
    }

    demo = start_ui(sb, home, tmp_path)
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=int(demo.url.rsplit(":", 1)[1]))
        builds = [
            client.submit_job_execution(
                "build_jovian_rev",
                repository_location_name="jovian",
                tags={"dagster/partition": rev},
            )
            for rev in ("r28", "r29")
        ]
        moves = [
            client.submit_job_execution("promote_tpu", repository_location_name="tpu")
            for _ in range(2)
        ]
        records = wait_finished(instance, builds + moves, demo)
    finally:
        stop_demo(demo)

    # The two builds target the pool of the same node and ran one after the other, both to success.
    pool = node_pool(BUILD_NODE)
    for run_id in builds:
        run = records[run_id].dagster_run
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_error(instance, run_id)
        assert pool in (run.run_op_concurrency.all_pools if run.run_op_concurrency else set()), (
            run.run_op_concurrency
        )
    (s1, e1), (s2, e2) = sorted(window(records[r]) for r in builds)
    assert e1 <= s2, f"builds on {BUILD_NODE} overlapped: {s1:.1f}-{e1:.1f} and {s2:.1f}-{e2:.1f}"

    # The two promotions: one moved :tpu; the other started
    # only after it ended, saw the move and refused.
    ordered = sorted(moves, key=lambda r: window(records[r])[0])
    (s1, e1), (s2, e2) = (window(records[r]) for r in ordered)
    assert e1 <= s2, f"promotions overlapped: {s1:.1f}-{e1:.1f} and {s2:.1f}-{e2:.1f}"
    first, second = (records[r].dagster_run for r in ordered)
    assert first.status == dg.DagsterRunStatus.SUCCESS, run_error(instance, first.run_id)
    assert second.status == dg.DagsterRunStatus.FAILURE
    assert "already points at" in run_error(instance, second.run_id)
    assert tpu.floating() == tpu.pinned(commit)


def test_pools_lists_one_pool_per_build_node_and_the_commands_that_set_them(sb: Sandbox) -> None:
    env = {**os.environ, "LOCKSTEP_SITE": str(sb.site_file)}
    shown = subprocess.run([str(lockstep_command()), "pools", "--iris-builds", "3"], env=env,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.splitlines() == [
        "dagster instance concurrency set tag_moves 1",
        "dagster instance concurrency set iris_builds 3",
        f"dagster instance concurrency set {node_pool(BUILD_NODE)} 1",
    ]
