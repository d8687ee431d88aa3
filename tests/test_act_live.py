"""The acting commands against a running `dagster dev`: `lockstep promote --plan`, `promote`, `rollback
--plan`, `rollback`, `hold release tag|harbor` launch the tpu location's jobs through the webserver's
GraphQL (the commands get only its URL: no DAGSTER_HOME, no database), follow the runs, exit by their
outcome, and the records name who acted.

One sandbox, one server start. Two builds are verified in process on a SQLite instance (the demo's
instance config) and the older one promoted, so the tag has a history to roll back along; then
`dagster dev` (webserver + daemon, sensors stopped: the only runs are the commands') is started on
that instance and every command runs as a subprocess, as a person runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from lockstep.graphql import Webserver
from sandbox.world import Sandbox
from tests.support.runs import Pipeline, failure_message, two_verified_builds
from tests.support.ui.dagster_dev import (
    ROOT,
    Demo,
    free_port,
    lockstep_command,
    start_process,
    stop_demo,
)
from tpu_assets.harbor_hold import HOLD
from tpu_assets.history import FLOATING_TAG
from tpu_assets.keys import HARBOR_LOCK

pytestmark = pytest.mark.heavy(300)  # seconds, about: builds, a dagster dev start, six runs

DEMO_YAML = ROOT / "deploy" / "sandbox" / "dagster.yaml"
COMMAND_TIMEOUT_S = 600


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(DEMO_YAML, home / "dagster.yaml")
    return home


@pytest.fixture
def instance(home: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield inst


def start_ui(sb: Sandbox, home: Path, tmp_path: Path) -> Demo:
    """`dagster dev` on the prepared instance; sensors stay STOPPED (no LOCKSTEP_SENSORS_RUNNING)."""
    env = {k: v for k, v in os.environ.items() if k != "LOCKSTEP_SENSORS_RUNNING"}
    env |= {"DAGSTER_HOME": str(home), "LOCKSTEP_SITE": str(sb.site_file), "LOCKSTEP_CACHE": str(sb.root / "cache")}
    port = free_port()
    argv = [sys.executable, "-m", "dagster", "dev", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)]
    return start_process(argv, url=f"http://127.0.0.1:{port}", sandbox=sb, log=tmp_path / "dagster-dev.log", env=env)


_LOCATIONS = "{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus } } } }"


def wait_for_tpu_location(demo: Demo) -> None:
    """/server_info answers before the code locations have loaded: until then no job of theirs is found."""
    web = Webserver(demo.url)
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while time.monotonic() < deadline:
        entries = web.query(_LOCATIONS)["workspaceOrError"].get("locationEntries") or []
        if any(e["name"] == "tpu" and e["loadStatus"] == "LOADED" for e in entries):
            return
        time.sleep(1)
    pytest.fail(f"the tpu code location did not load; dagster dev:\n{demo.log_tail(3000)}")


def lockstep(demo: Demo, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`lockstep ARGS --url <the server>` as a person on a laptop runs it: no DAGSTER_HOME, no site file
    (unless `home`: the in-process planner's path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "LOCKSTEP_SITE")}
    if home is not None:
        env |= {"DAGSTER_HOME": str(home), "LOCKSTEP_SITE": str(demo.sandbox.site_file)}
    return subprocess.run([str(lockstep_command()), *args, "--url", demo.url], env=env, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT_S, cwd=ROOT)


def said(done: subprocess.CompletedProcess[str], demo: Demo) -> str:
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}\ndagster dev:\n{demo.log_tail(3000)}"


def refresh_status(demo: Demo) -> None:
    """Launch refresh_status and wait for it: the status record `--plan` reads is new (status_sensor, which
    records it each minute, is stopped here)."""
    web = Webserver(demo.url)
    run_id = web.launch(location="tpu", job="refresh_status", run_config={}, tags={})
    *_, final = web.run_events(run_id, deadline_s=COMMAND_TIMEOUT_S)
    assert final == "SUCCESS", f"refresh_status ended {final}; dagster dev:\n{demo.log_tail(3000)}"


def newest_move(instance: dg.DagsterInstance) -> dict[str, object]:
    record = instance.fetch_materializations(FLOATING_TAG, limit=1).records[0]
    meta = record.asset_materialization.metadata  # type: ignore[union-attr]
    return {"run_id": record.run_id, **{k: getattr(v, "value", v) for k, v in meta.items()}}


def run_text(instance: dg.DagsterInstance, run_id: str) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(run_id))


def test_promote_rollback_and_hold_release_through_the_webserver_record_who_acted(
    sb: Sandbox, resources: dict[str, object], home: Path, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    tpu = Pipeline(sb, resources, instance)
    (older, newer), _ = two_verified_builds(tpu)
    first = tpu.tag("promote", build=older)
    assert first.success, failure_message(first)
    assert tpu.floating() == tpu.pinned(older)

    demo = start_ui(sb, home, tmp_path)
    try:
        wait_for_tpu_location(demo)
        # --plan changes nothing: the tag stays where it is, and no run is launched.
        refresh_status(demo)
        runs_before = len(instance.get_run_records())
        planned = lockstep(demo, "promote", "--plan")
        assert planned.returncode == 0, said(planned, demo)
        assert newer[:8] in planned.stdout, said(planned, demo)
        planned_json = lockstep(demo, "promote", "--plan", "--build", newer[:10], "--json", home=home)
        assert planned_json.returncode == 0, said(planned_json, demo)
        shown = json.loads(planned_json.stdout)
        assert shown["ok"] is True and shown["target"]["build"] == newer and shown["plan"] is True
        assert tpu.floating() == tpu.pinned(older)

        # promote as alice: the tag moves to the newer build; the run and its record name alice.
        promoted = lockstep(demo, "promote", "--by", "alice", "--note", "ship the fix", "--json")
        assert promoted.returncode == 0, said(promoted, demo)
        answer = json.loads(promoted.stdout)
        assert answer["status"] == "SUCCESS" and answer["outcome"] == "ok" and answer["by"] == "alice"
        assert answer["url"] == f"{demo.url}/runs/{answer['run_id']}"
        assert tpu.floating() == tpu.pinned(newer) and answer["move"]["to_digest"] == tpu.pinned(newer)
        run = instance.get_run_by_id(answer["run_id"])
        assert run is not None and run.job_name == "promote_tpu"
        assert run.tags["lockstep/by"] == "alice" and run.tags["lockstep/cli"] == "promote"
        move = newest_move(instance)
        assert move["run_id"] == answer["run_id"] and move["action"] == "promote" and move["note"] == "ship the fix"
        assert move.get("by") == "alice", move
        assert "alice" in run_text(instance, answer["run_id"])

        # A second promote is a negative answer (the tag is already there): exit 1, nothing moves.
        again = lockstep(demo, "promote", "--by", "alice")
        assert again.returncode == 1, said(again, demo)
        assert "refused" in again.stdout and "already points at" in again.stdout, said(again, demo)  # and why
        assert tpu.floating() == tpu.pinned(newer)

        assert len(instance.get_run_records()) == runs_before + 2  # the two promotes; no plan launched a run
        refresh_status(demo)
        planned = lockstep(demo, "rollback", "--plan")
        assert planned.returncode == 0, said(planned, demo)
        assert older[:8] in planned.stdout and "nothing was changed" in planned.stdout, said(planned, demo)
        assert tpu.floating() == tpu.pinned(newer)
        assert len(instance.get_run_records()) == runs_before + 3  # and the refresh

        # rollback as bob (the log printed as it comes): back to the older build, hold set.
        rolled = lockstep(demo, "rollback", "--by", "bob", "--note", "bad harbor")
        assert rolled.returncode == 0, said(rolled, demo)
        assert f"{demo.url}/runs/" in rolled.stdout and "SUCCESS" in rolled.stdout
        assert "rollback by bob: bad harbor" in rolled.stdout, said(rolled, demo)  # the run's log, as it came
        assert tpu.floating() == tpu.pinned(older)
        move = newest_move(instance)
        assert move["action"] == "rollback" and move["hold"] is True and move.get("by") == "bob", move
        assert "bob" in run_text(instance, str(move["run_id"]))
        harbor_held = instance.fetch_materializations(HARBOR_LOCK, limit=1).records[0].asset_materialization
        assert harbor_held is not None and harbor_held.metadata[HOLD].value is True  # scope auto: both

        # Release both holds, as carol: the tag's, then harbor's (re-locked to the tip, pushed).
        released = lockstep(demo, "hold", "release", "tag", "--by", "carol")
        assert released.returncode == 0, said(released, demo)
        move = newest_move(instance)
        assert move["action"] == "release_hold" and move["hold"] is False and move.get("by") == "carol", move
        assert tpu.floating() == tpu.pinned(older)  # a release moves nothing

        relocked = lockstep(demo, "hold", "release", "harbor", "--by", "carol", "--json")
        assert relocked.returncode == 0, said(relocked, demo)
        lock = instance.fetch_materializations(HARBOR_LOCK, limit=1).records[0]
        meta = lock.asset_materialization.metadata  # type: ignore[union-attr]
        assert lock.run_id == json.loads(relocked.stdout)["run_id"]
        assert meta[HOLD].value is False and meta["by"].value == "carol"
        assert "harbor hold released by carol" in run_text(instance, lock.run_id)

        # No hold left: releasing it again is a refusal (exit 1), not a crash.
        none_left = lockstep(demo, "hold", "release", "harbor", "--by", "carol")
        assert none_left.returncode == 1, said(none_left, demo)
        assert "no harbor hold to release" in none_left.stdout, said(none_left, demo)
    finally:
        stop_demo(demo)
