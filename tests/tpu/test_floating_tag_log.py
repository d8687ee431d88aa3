"""Every state of the floating tag is in the promotion log, and moves hold across every lockstep writer.

Against a real docker-registry (started once for the module) with two verified builds made once by
the sandbox TPU pipeline; each test gets its own floating tag (a copy of the site file naming
another tag) and a fresh instance that holds copies of the two real `tpu/verified_image` records.
The scars: a PUT the registry applied but answered 500, a PUT that failed, another writer right
after our PUT, a move made by hand, a run SIGKILLed between its PUT and its record, and two promote
runs in two processes racing on one instance (SQLite: a file lock; Postgres: an advisory lock).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml

from resources.git import git_for
from resources.registry import HttpRegistry, Registry
from resources.site import SiteResource, load_site
from sandbox.fake_iris import stop_all
from sandbox.world import Sandbox, advance_harbor, up
from tests.conftest import sandbox_resources
from tests.postgres_server import PostgresServer, running_postgres
from tests.registry_server import RegistryServer, running_registry
from tests.runs import Pipeline, failure_message, materialize, metadata
from tests.tpu import yield_in_lock
from tests.tpu.registries import AppliedThen500, FailedPut, MovedRightAfter, push_hand_made_image
from tpu_assets import promotion_assets
from tpu_assets.definitions import defs
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE, log_state, tag_history
from tpu_assets.promotion import floating_tag_lock_name, plan_for
from tpu_assets.rollback import TagMove
from tpu_assets.tag_lock import floating_tag_lock
from tpu_assets.tag_log import log_disagreement

ROOT = Path(__file__).resolve().parents[2]
# The move alone: the WARN check on the image at the tag reads its layers; it is tested elsewhere.
ONLY_THE_MOVE = dg.AssetSelection.assets(FLOATING_TAG).without_checks()
_TAGS = itertools.count(1)


@dataclass(frozen=True)
class Built:
    sb: Sandbox
    host: str
    repository: str
    records: list[dg.AssetMaterialization]  # the real verified_image records, oldest first
    builds: tuple[str, str]
    digests: dict[str, str]
    hand: str  # a digest on the server that lockstep never built or verified


@pytest.fixture(scope="module")
def registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    with running_registry(tmp_path_factory.mktemp("docker-registry")) as server:
        yield server


@pytest.fixture(scope="module")
def built(registry_server: RegistryServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """Two verified builds, made once: relock -> build -> checks -> smoke -> verified, twice."""
    tmp = tmp_path_factory.mktemp("tag-log")
    sb = up(tmp / "sandbox", registry=registry_server.host)
    with dg.instance_for_test() as instance:
        p = Pipeline(sb, sandbox_resources(sb, tmp / "cache"), instance)
        try:
            builds = []
            for fix in (True, False):
                advance_harbor(sb.root, fix=fix)
                commit = p.relock()
                result = p.build(commit)
                assert result.success, failure_message(result)
                builds.append(commit)
            records = [r.asset_materialization for r in instance.fetch_materializations(
                VERIFIED_IMAGE, limit=10, ascending=True).records]
            hand = push_hand_made_image(HttpRegistry(host=registry_server.host), repository=p.repository)
            yield Built(sb=sb, host=registry_server.host, repository=p.repository,
                        records=[r for r in records if r is not None], builds=(builds[0], builds[1]),
                        digests={b: p.pinned(b) or "" for b in builds}, hand=hand)
        finally:
            stop_all(sb.iris_home)


class TagWorld:
    """One floating tag of its own on the shared server, and an instance that knows the two builds."""

    def __init__(self, built: Built, instance: dg.DagsterInstance, home: Path, tmp: Path) -> None:
        self.built, self.instance, self.home, self.tmp = built, instance, home, tmp
        self.tag = f"floating-{os.getpid()}-{next(_TAGS)}"
        self.site_file = built.sb.root / f"site-{self.tag}.toml"  # next to the original: relative paths hold
        text = built.sb.site_file.read_text(encoding="utf-8")
        assert 'floating_tag = "tpu"' in text
        self.site_file.write_text(text.replace('floating_tag = "tpu"', f'floating_tag = "{self.tag}"'), encoding="utf-8")
        self.site = load_site(self.site_file)
        self.registry = HttpRegistry(host=built.host)
        self.resources: dict[str, object] = {
            **sandbox_resources(built.sb, tmp / "cache"), "site": SiteResource(path=str(self.site_file)),
            "registry": self.registry,
        }
        for record in built.records:  # the same verified records the pipeline wrote, in order
            if not instance.has_dynamic_partition("tpu_builds", record.partition or ""):
                instance.add_dynamic_partitions("tpu_builds", [record.partition or ""])
            instance.report_runless_asset_event(record)
        self.b1, self.b2 = built.builds
        self.d1, self.d2 = built.digests[self.b1], built.digests[self.b2]

    def move(self, action: str, registry: Registry | None = None, **config: object) -> dg.ExecuteInProcessResult:
        resources = {**self.resources, "registry": registry or self.registry}
        run_config = {"ops": {"tpu__floating_tag": {"config": {"action": action, **config}}}}
        return materialize(resources, ONLY_THE_MOVE, self.instance, run_config=run_config)

    def promote(self, build: str, registry: Registry | None = None) -> dg.ExecuteInProcessResult:
        return self.move("promote", registry, build=build[:8])

    def tick(self) -> str:
        sensor = defs.resolve_sensor_def("floating_tag_watch")
        with dg.build_sensor_context(instance=self.instance, resources=self.resources) as context:
            said = sensor(context)
        assert isinstance(said, dg.SkipReason), said
        return said.skip_message or ""

    def floating(self) -> str | None:
        return self.registry.resolve(repository=self.built.repository, reference=self.tag)

    def someone_tags(self, digest: str) -> None:
        """Someone's `crane tag` on our floating tag, past lockstep."""
        HttpRegistry(host=self.built.host).tag(repository=self.built.repository, digest=digest, tag=self.tag)

    def log(self) -> list[TagMove]:
        """The promotion log, oldest first."""
        return list(reversed(tag_history(self.instance)))

    def states(self) -> list[tuple[str, str | None, str | None]]:
        return [(m.action, m.from_digest, m.to_digest) for m in self.log()]

    def plan(self, **kwargs: str):  # type: ignore[no-untyped-def]
        return plan_for(self.site, self.instance, git_for(self.site, cache_dir=str(self.tmp / "cache")), self.registry, **kwargs)


def _sqlite_home(home: Path) -> None:
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump({"telemetry": {"enabled": False}}))


def _postgres_home(home: Path, server: PostgresServer) -> None:
    home.mkdir(parents=True)
    db = server.fresh_database("tag_log")
    (home / "dagster.yaml").write_text(yaml.safe_dump({
        "storage": {"postgres": {"postgres_url": db.url}}, "telemetry": {"enabled": False}}))


@contextlib.contextmanager
def _world(built: Built, tmp: Path, storage: str, postgres: PostgresServer | None = None) -> Iterator[TagWorld]:
    home = tmp / "dagster_home"
    if storage == "postgres":
        assert postgres is not None
        _postgres_home(home, postgres)
    else:
        _sqlite_home(home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield TagWorld(built, instance, home, tmp)


@pytest.fixture
def world(built: Built, tmp_path: Path) -> Iterator[TagWorld]:
    """In-process tests: an in-memory instance (its file lock lives in its temporary root directory)."""
    with dg.DagsterInstance.ephemeral() as instance:
        yield TagWorld(built, instance, Path(instance.root_directory), tmp_path)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


# -- what a PUT's answer records --------------------------------------------------------------------


def test_a_put_the_registry_applied_but_answered_500_is_recorded_and_the_next_plan_starts_from_it(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success
    applied = w.promote(w.b2, AppliedThen500(host=w.built.host))
    assert applied.success, failure_message(applied)
    assert w.floating() == w.d2
    meta = metadata(applied)
    assert meta["from_digest"] == w.d1 and meta["to_digest"] == w.d2
    assert "answered the PUT with an error" in str(meta["recorded"]) and "HTTP 500" in str(meta["recorded"])
    assert w.states() == [("promote", None, w.d1), ("promote", w.d1, w.d2)]

    plan = w.plan()
    assert plan.current_digest == w.d2 and plan.target is not None and plan.target.digest == w.d1
    again = w.promote(w.b2)  # the old scar: refused "already points at", with the move never logged
    assert not again.success and "already points at" in failure_message(again)
    assert len(w.log()) == 2 and w.tick().startswith(f":{w.tag} still at {w.d2}")


def test_a_put_that_failed_and_did_not_apply_records_nothing_and_leaves_the_tag(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success
    failed = w.promote(w.b2, FailedPut(host=w.built.host))
    assert not failed.success
    said = failure_message(failed)
    assert "did not happen and nothing was recorded" in said and "HTTP 500" in said
    assert w.floating() == w.d1 and w.states() == [("promote", None, w.d1)]
    (intent,) = log_state(w.instance).intents  # the intent stays, for the watch
    assert intent.to_digest == w.d2 and intent.run_id == failed.run_id
    assert w.tick() == f":{w.tag} still at {w.d1}, as the promotion log says"  # nothing to complete
    assert w.states() == [("promote", None, w.d1)]


def test_a_reread_that_finds_another_digest_records_our_move_then_the_outside_one(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success
    raced = w.promote(w.b2, MovedRightAfter(host=w.built.host, then_digest=w.built.hand))
    assert raced.success, failure_message(raced)
    assert w.floating() == w.built.hand
    assert w.states() == [("promote", None, w.d1), ("promote", w.d1, w.d2), ("observed", w.d2, w.built.hand)]
    assert "someone moved it again" in w.log()[1].recorded
    assert log_disagreement(w.log(), w.floating()) is None
    assert "still at" in w.tick()  # the log already ends where the registry is


# -- the watch ----------------------------------------------------------------------------------------


def test_a_move_made_outside_lockstep_is_recorded_once_by_the_watch_and_plans_start_from_it(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success and w.promote(w.b2).success
    w.someone_tags(w.built.hand)
    assert "still" not in (said := w.tick()) and f"observed {w.d2} -> {w.built.hand}" in said
    assert w.tick() == f":{w.tag} still at {w.built.hand}, as the promotion log says"
    observed = [m for m in w.log() if m.action == "observed"]
    assert len(observed) == 1 and observed[0].to_digest == w.built.hand and observed[0].hold is False
    assert "lockstep did not make this move" in observed[0].recorded
    assert log_disagreement(w.log(), w.floating()) is None

    plan = w.plan()
    assert plan.current_digest == w.built.hand and plan.target is not None and plan.target.digest == w.d2
    hand = next(c for c in plan.considered if c.digest == w.built.hand)
    assert "points at now" in (hand.refused or "")
    rolled = w.move("rollback")
    assert rolled.success, failure_message(rolled)
    assert metadata(rolled)["from_digest"] == w.built.hand and w.floating() == w.d2


def test_a_hold_survives_a_hand_move_and_still_stops_promotion(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success and w.promote(w.b2).success
    assert w.move("rollback").success and w.floating() == w.d1
    w.someone_tags(w.built.hand)
    w.tick()
    assert w.log()[-1].action == "observed" and w.log()[-1].hold is True
    held = w.promote(w.b2)
    assert not held.success and "on hold" in failure_message(held) and w.floating() == w.built.hand
    w.site_file.write_text(w.site_file.read_text().replace("auto_promote = false", "auto_promote = true"))
    auto = defs.resolve_sensor_def("auto_promote_sensor")
    with dg.build_sensor_context(instance=w.instance, resources=w.resources) as context:
        skipped = auto(context)
    assert not skipped.run_requests and "on hold" in (skipped.skip_reason.skip_message or "")  # type: ignore[union-attr]


def test_a_run_records_a_hand_move_it_finds_before_it_moves(world: TagWorld) -> None:
    """No watch tick in between: the promote itself brings the log level with the registry first."""
    w = world
    assert w.promote(w.b1).success
    w.someone_tags(w.built.hand)
    assert w.promote(w.b2).success
    assert w.states() == [("promote", None, w.d1), ("observed", w.d1, w.built.hand), ("promote", w.built.hand, w.d2)]


def test_the_watch_skips_an_unreachable_registry_and_records_nothing(world: TagWorld) -> None:
    w = world
    w.someone_tags(w.d1)
    w.resources["registry"] = HttpRegistry(host="127.0.0.1:9", timeout_s=2)  # nothing listens on discard
    said = w.tick()
    assert said.startswith("cannot read the floating tag:") and "nothing recorded" in said and w.log() == []


def test_the_watch_waits_while_a_move_holds_the_lock(world: TagWorld) -> None:
    w = world
    w.someone_tags(w.d1)
    with floating_tag_lock(w.instance, name=floating_tag_lock_name(w.site), timeout_s=1, holder="test"):
        assert "a lockstep move of it is in progress" in w.tick()
    assert w.log() == []
    assert "observed nothing -> " in w.tick() and w.states() == [("observed", None, w.d1)]


# -- the lock -----------------------------------------------------------------------------------------


def test_the_record_is_stored_before_the_lock_is_released(world: TagWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dagster stores the MaterializeResult yielded inside `with lock:` before the generator resumes, so
    the next writer to take the lock reads it."""
    w = world
    seen_at_release: list[list[TagMove]] = []

    @contextlib.contextmanager
    def watched(instance: dg.DagsterInstance, **kwargs: object) -> Iterator[str]:
        with floating_tag_lock(instance, **kwargs) as where:  # type: ignore[arg-type]
            try:
                yield where
            finally:
                seen_at_release.append(tag_history(instance))

    monkeypatch.setattr(promotion_assets, "floating_tag_lock", watched)
    assert w.promote(w.b1).success
    w.someone_tags(w.built.hand)
    raced = w.promote(w.b2, MovedRightAfter(host=w.built.host, then_digest=w.d1))
    assert raced.success, failure_message(raced)
    first, second = seen_at_release
    assert [m.to_digest for m in first] == [w.d1]
    # Everything the second run recorded (the hand move it found, its move, the move right after) is
    # stored while it still holds the lock.
    assert [m.to_digest for m in reversed(second)] == [w.d1, w.built.hand, w.d2, w.d1]


def test_dagster_stores_a_result_yielded_in_a_block_before_the_block_exits_in_a_step_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same guarantee where daemon-launched runs execute: the multiprocess executor's step process."""
    report = tmp_path / "report.json"
    monkeypatch.setenv(yield_in_lock.REPORT_ENV, str(report))
    with dg.instance_for_test() as instance:
        result = dg.execute_job(dg.reconstructable(yield_in_lock.step_process_job), instance=instance)
        assert result.success
    seen = json.loads(report.read_text())
    assert seen["pid"] != os.getpid() and seen["stored"] == [seen["run_id"]]


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
def test_a_writer_that_cannot_get_the_lock_fails_clearly_and_moves_nothing(
    built: Built, tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("postgres") if storage == "postgres" else None
    with _world(built, tmp_path, storage, server) as w:
        with floating_tag_lock(w.instance, name=floating_tag_lock_name(w.site), timeout_s=1, holder="test holder"):
            blocked = w.move("promote", build=w.b1[:8], lock_timeout_s=1)
        said = failure_message(blocked)
        assert not blocked.success and "for over 1 s: nothing was moved" in said
        assert ("Postgres advisory lock" in said and "pg_locks" in said) if storage == "postgres" else "test holder" in said
        assert "postgresql://" not in said and w.floating() is None and w.log() == []
        assert log_state(w.instance).intents == []


# -- other processes ------------------------------------------------------------------------------------


def _worker(w: TagWorld, build: str, **fields: object) -> subprocess.Popen[str]:
    args = {"home": str(w.home), "sandbox": str(w.built.sb.root), "site_file": str(w.site_file),
            "cache": str(w.tmp / f"cache-{build[:8]}"),
            "host": w.built.host, "build": build[:8], **fields}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(w.home), "LOCKSTEP_SITE": str(w.site_file)}
    return subprocess.Popen([sys.executable, "-m", "tests.tpu.race_worker", json.dumps(args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def _finish(proc: subprocess.Popen[str], timeout_s: float = 240) -> tuple[int, dict[str, object]]:
    out, err = proc.communicate(timeout=timeout_s)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else {"stderr": err[-3000:]})


def test_a_run_sigkilled_between_put_and_record_is_completed_by_the_watch(
    built: Built, tmp_path: Path, postgres: PostgresServer
) -> None:
    """On Postgres, as a team runs it: the killed run's advisory lock goes with its connection."""
    with _world(built, tmp_path, "postgres", postgres) as w:
        assert w.promote(w.b1).success
        code, said = _finish(_worker(w, w.b2, registry="KilledAfterPut"))
        assert code == -9, said  # really killed: no record, no finally
        assert w.floating() == w.d2 and w.states() == [("promote", None, w.d1)]
        (intent,) = log_state(w.instance).intents

        said_tick = w.tick()
        assert f"promote {w.d1} -> {w.d2}" in said_tick
        completed = w.log()[-1]
        assert (completed.action, completed.from_digest, completed.to_digest, completed.build) == (
            "promote", w.d1, w.d2, w.b2)
        assert f"after run {intent.run_id}" in completed.recorded and "floating_tag_watch" in completed.recorded
        assert "still at" in w.tick() and len(w.log()) == 2
        # The dead run's lock went with its Postgres session: the next move goes through.
        rolled = w.move("rollback", lock_timeout_s=5)
        assert rolled.success, failure_message(rolled)
        assert w.states()[-1] == ("rollback", w.d2, w.d1) and log_disagreement(w.log(), w.floating()) is None


@pytest.mark.parametrize(("storage", "lock"), [("sqlite", True), ("postgres", True), ("sqlite", False)])
def test_two_promotions_in_two_processes_leave_a_log_equal_to_the_registry(
    built: Built, tmp_path: Path, storage: str, lock: bool, request: pytest.FixtureRequest
) -> None:
    """Each process stops between its guard read and its PUT until the other arrives (or has waited
    2 s once the other is at the lock). With the lock the other is stuck on the lock, so the moves take turns and the log is the
    truth; without it both write from the same read and the log's account is wrong."""
    server = request.getfixturevalue("postgres") if storage == "postgres" else None
    with _world(built, tmp_path, storage, server) as w:
        box = tmp_path / "window"
        box.mkdir()
        started = time.monotonic()
        procs = {
            name: _worker(w, build, lock=lock, barrier_dir=str(box), name=name,
                          registry_fields={"barrier_dir": str(box), "name": name, "other": other, "wait_s": 2.0})
            for name, other, build in (("a", "b", w.b1), ("b", "a", w.b2))
        }
        results = {name: _finish(proc) for name, proc in procs.items()}
        elapsed = time.monotonic() - started
        puts = [json.loads(line) for line in (box / "puts.jsonl").read_text().splitlines()]
        windows = {name: (box / f"{name}.window").read_text() for name in procs}
        final = w.floating()
        log = w.log()

        assert all(code == 0 and said.get("success") for code, said in results.values()), results
        assert final in {w.d1, w.d2} and len(puts) == 2
        if lock:
            assert final == puts[-1]["digest"]
            assert sorted(windows.values()) == ["alone", "met"], windows  # one waited alone: the other was locked out
            build_of = {w.d1: w.b1, w.d2: w.b2}
            happened = [("promote", None, puts[0]["digest"], build_of[puts[0]["digest"]]),
                        ("promote", puts[0]["digest"], puts[1]["digest"], build_of[puts[1]["digest"]])]
            assert [(m.action, m.from_digest, m.to_digest, m.build) for m in log] == happened
            assert log_disagreement(log, final) is None
        else:
            assert windows == {"a": "met", "b": "met"}, windows  # both inside the window at once
            disagreement = log_disagreement(log, final)
            assert disagreement is not None, [(m.action, m.from_digest, m.to_digest) for m in log]
            assert "starts at nothing" in disagreement  # both wrote from the same read: one from-digest is false
        assert elapsed < 200
