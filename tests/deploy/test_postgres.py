"""The deployment's Postgres storage, for real: the sandbox TPU pipeline runs on an instance whose
runs, event log and schedules live in a PostgreSQL this test starts, and `lockstep rollback plan` (a
separate process, as a person runs it) chooses its rollback from that history.

The instance's `storage:` block is taken verbatim from deploy/docker/dagster.yaml (Postgres settings
from DAGSTER_POSTGRES_* environment variables), so this also proves the deployment's storage config
works against a real server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from sandbox.teardown import stop_sandbox
from sandbox.world import Sandbox, advance_harbor, up
from tests.conftest import sandbox_resources
from tests.support.deploy.instance import write_production_home
from tests.support.postgres_server import PgDatabase, PostgresServer
from tests.support.runs import Pipeline, failure_message
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE, tag_history, verified_history

pytestmark = pytest.mark.heavy(60)  # seconds, about: the order parallel workers take modules in

POSTGRES_STORAGE = {
    "run_storage": "PostgresRunStorage",
    "event_log_storage": "PostgresEventLogStorage",
    "schedule_storage": "PostgresScheduleStorage",
}


@dataclass(frozen=True)
class History:
    """What the pipeline left behind: the instance's home, its database, and the three builds."""

    home: Path
    db: PgDatabase
    sb: Sandbox
    env: dict[str, str]  # DAGSTER_POSTGRES_* for this database, as the deployment sets them
    # b1 (guard fix only), b2 (+ export fix), b3 (newest, promoted now)
    builds: tuple[str, str, str]
    export_fix: str
    digests: dict[str, str]


def _sqlite_files(home: Path) -> list[Path]:
    return [p for p in home.rglob("*") if p.suffix in {".db", ".sqlite"}]


@pytest.fixture(scope="module")
def history(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[History]:
    """The e2e TPU flow (tests/tpu/test_image_pipeline.py),
    on Postgres: relock -> build -> promote, a fix
    upstream, again, and once more, so there are three verified builds and three promotions."""
    tmp = tmp_path_factory.mktemp("pg-pipeline")
    db = postgres.fresh_database("tpu_pipeline")
    home = tmp / "dagster_home"
    env = write_production_home(home, db)
    sb = up(tmp / "sandbox")
    resources = sandbox_resources(sb, tmp / "cache")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            storages = {attr: type(getattr(instance, attr)).__name__ for attr in POSTGRES_STORAGE}
            assert storages == POSTGRES_STORAGE, f"the instance is not on Postgres: {storages}"
            p = Pipeline(sb, resources, instance)

            def relock_build_promote() -> str:
                commit = p.relock()
                built = p.build(commit)
                assert built.success, failure_message(built)
                promoted = p.tag("promote")
                assert promoted.success, failure_message(promoted)
                assert p.floating() == p.pinned(commit)
                return commit

            try:
                # the runbook's guard fix: every build from here verifies
                advance_harbor(sb.root, fix=True)
                b1 = relock_build_promote()
                export_fix = advance_harbor(sb.root)  # the fix a later rollback must keep
                b2 = relock_build_promote()
                advance_harbor(sb.root)
                b3 = relock_build_promote()
                digests = {b: p.pinned(b) or "" for b in (b1, b2, b3)}
                yield History(
                    home=home,
                    db=db,
                    sb=sb,
                    env=env,
                    builds=(b1, b2, b3),
                    export_fix=export_fix,
                    digests=digests,
                )
            finally:
                stop_sandbox(sb.root)  # iris jobs, engines, the git daemon: by PID


def test_tpu_pipeline_history_is_stored_in_postgres(history: History) -> None:
    b1, b2, b3 = history.builds
    verified_key = VERIFIED_IMAGE.to_string()
    rows = history.db.query(
        (
            "SELECT partition FROM event_logs WHERE dagster_event_type = "
            "'ASSET_MATERIALIZATION' AND asset_key = %s"
        ),
        (verified_key,),
    )
    assert sorted(str(r[0]) for r in rows) == sorted([b1, b2, b3])
    ((moves,),) = history.db.query(
        (
            "SELECT count(*) FROM event_logs WHERE dagster_event_type = "
            "'ASSET_MATERIALIZATION' AND asset_key = %s"
        ),
        (FLOATING_TAG.to_string(),),
    )
    assert moves == 3
    statuses = dict(history.db.query("SELECT status, count(*) FROM runs GROUP BY status"))  # type: ignore[arg-type]
    assert statuses == {"SUCCESS": 9}, statuses  # 3 x (relock, build, promote)
    assert _sqlite_files(history.home) == []  # nothing fell back to SQLite under DAGSTER_HOME

    # A second instance on the same home reads the history back the way rollback planning does.
    with pytest.MonkeyPatch.context() as mp:
        for name, value in history.env.items():
            mp.setenv(name, value)
        with dg.DagsterInstance.from_config(str(history.home)) as again:
            assert type(again.event_log_storage).__name__ == "PostgresEventLogStorage"
            verified = {v.build: v.digest for v in verified_history(again)}
            moves_read = tag_history(again)
    assert verified == history.digests
    # newest first
    assert [m.to_digest for m in moves_read] == [history.digests[b] for b in (b3, b2, b1)]
    assert moves_read[0].from_digest == history.digests[b2] and moves_read[-1].from_digest is None


def test_rollback_plan_cli_reads_the_history_from_postgres(
    history: History, tmp_path: Path
) -> None:
    """The same plan as the SQLite e2e test: b2 is the
    target, b1 predates the fix, b3 is where :tpu is now."""
    b1, b2, b3 = history.builds
    env = {
        **os.environ,
        **history.env,
        "DAGSTER_HOME": str(history.home),
        "LOCKSTEP_SITE": str(history.sb.site_file),
        "LOCKSTEP_CACHE": str(tmp_path / "cli-cache"),
    }
    lockstep = Path(sys.executable).with_name("lockstep")
    done = subprocess.run(
        [str(lockstep), "rollback", "plan", "--must-contain", history.export_fix[:8]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {
        line.split()[1]: line for line in done.stdout.splitlines() if line.startswith("  build")
    }
    assert "-> TARGET" in lines[b2[:8]]
    assert "predates" in lines[b1[:8]] and "no-op" in lines[b1[:8]]
    assert "points at now" in lines[b3[:8]]
    assert _sqlite_files(history.home) == []


def test_pools_set_with_the_clis_are_kept_in_postgres(history: History) -> None:
    """What dagster.yaml tells an operator to run: `lockstep
    pools --apply`, then a raise with Dagster's CLI."""
    env = {
        **os.environ,
        **history.env,
        "DAGSTER_HOME": str(history.home),
        "LOCKSTEP_SITE": str(history.sb.site_file),
    }
    bin_dir = Path(sys.executable).parent
    for argv in (
        [str(bin_dir / "lockstep"), "pools", "--apply", "--iris-builds", "2"],
        [str(bin_dir / "dagster"), "instance", "concurrency", "set", "iris_builds", "4"],
    ):
        done = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert done.returncode == 0, f"{' '.join(argv[1:])}:\n{done.stdout}{done.stderr}"
    limits = dict(history.db.query('SELECT concurrency_key, "limit" FROM concurrency_limits'))  # type: ignore[arg-type]
    assert limits.pop("iris_builds") == 4 and limits.pop("tag_moves") == 1
    assert limits and all(
        key.startswith("spark_node/") and limit == 1 for key, limit in limits.items()
    ), limits
