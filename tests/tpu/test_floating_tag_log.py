"""Every state of the floating tag is in the promotion
log, and moves hold across every lockstep writer.

Against a real docker-registry (started once for the module) with two verified builds made once by
the sandbox TPU pipeline; each test gets its own floating tag (a copy of the site file naming
another tag) and a fresh instance that holds copies of the two real `tpu/verified_image` records.
The scars: a PUT the registry applied but answered 500, a PUT that failed, another writer right
after our PUT, a move made by hand, a run SIGKILLed between its PUT and its record, and two promote
runs in two processes racing on one instance (SQLite: a file lock; Postgres: an advisory lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import dagster as dg
import pytest
import yaml

from lockstep.pools import apply_pools
from lockstep.run_launcher import worker_started
from resources.git import git_for
from resources.registry import HttpRegistry, Registry
from resources.site.load import load_site
from resources.site.resource import SiteResource
from tests.conftest import sandbox_resources
from tests.support.postgres_server import PostgresServer, running_postgres
from tests.support.registry_proxy import Fault, RegistryProxy
from tests.support.registry_server import RegistryServer
from tests.support.report import count
from tests.support.runs import failure_message, materialize, metadata
from tests.support.servers import log_tail
from tests.support.tpu import yield_in_lock
from tests.support.tpu.daemon import kill_hard, start_daemon, stop_daemon, wait_for, write_demo_home
from tests.support.tpu.registries import (
    ARM_ENV,
    AppliedThen500,
    AppliedThen500ThenGone,
    FailedPut,
    MovedRightAfter,
    push_hand_made_image,
)
from tests.support.two_builds import Built as TwoBuilds
from tests.support.two_builds import record_builds, site_with_own_tag, two_builds
from tpu_assets import promotion_assets
from tpu_assets.definitions import defs
from tpu_assets.history import FLOATING_TAG, log_state, tag_history
from tpu_assets.promotion import TAG_MOVES_POOL, floating_tag_lock_name, plan_for
from tpu_assets.rollback import TagMove
from tpu_assets.tag_lock import floating_tag_lock
from tpu_assets.tag_log import log_disagreement

pytestmark = pytest.mark.heavy(120)  # seconds, about: the order parallel workers take modules in

ROOT = Path(__file__).resolve().parents[2]
DAEMON_TIMEOUT_S = 180.0
# The move alone: the WARN check on the image at the tag reads its layers; it is tested elsewhere.
ONLY_THE_MOVE = dg.AssetSelection.assets(FLOATING_TAG).without_checks()
_TAGS = itertools.count(1)


@dataclass(frozen=True)
class Built(TwoBuilds):
    host: str  # the shared registry server's
    hand: str  # a digest on the server that lockstep never built or verified


@pytest.fixture(scope="module")
def built(
    registry_server: RegistryServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Built]:
    """Two verified builds on the shared server, made once, and an image pushed there by hand."""
    with two_builds(tmp_path_factory.mktemp("tag-log"), registry=registry_server.host) as two:
        hand = push_hand_made_image(
            HttpRegistry(host=registry_server.host), repository=two.repository
        )
        yield Built(
            **{f.name: getattr(two, f.name) for f in fields(two)},
            host=registry_server.host,
            hand=hand,
        )


class TagWorld:
    """One floating tag of its own on the shared server,
    and an instance that knows the two builds."""

    def __init__(self, built: Built, instance: dg.DagsterInstance, home: Path, tmp: Path) -> None:
        self.built, self.instance, self.home, self.tmp = built, instance, home, tmp
        self.tag = f"floating-{os.getpid()}-{next(_TAGS)}"
        self.site_file = site_with_own_tag(built, self.tag)
        self.site = load_site(self.site_file)
        self.registry = HttpRegistry(host=built.host)
        self.resources: dict[str, object] = {
            **sandbox_resources(built.sb, tmp / "cache"),
            "site": SiteResource(path=str(self.site_file)),
            "registry": self.registry,
        }
        record_builds(instance, built)
        self.b1, self.b2 = built.builds
        self.d1, self.d2 = built.digests[self.b1], built.digests[self.b2]

    def move(
        self, action: str, registry: Registry | None = None, **config: object
    ) -> dg.ExecuteInProcessResult:
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
        HttpRegistry(host=self.built.host).tag(
            repository=self.built.repository, digest=digest, tag=self.tag
        )

    def log(self) -> list[TagMove]:
        """The promotion log, oldest first."""
        return list(reversed(tag_history(self.instance)))

    def states(self) -> list[tuple[str, str | None, str | None]]:
        return [(m.action, m.from_digest, m.to_digest) for m in self.log()]

    def plan(self, **kwargs: str):  # type: ignore[no-untyped-def]
        return plan_for(
            self.site,
            self.instance,
            git_for(self.site, cache_dir=str(self.tmp / "cache")),
            self.registry,
            **kwargs,
        )


def _sqlite_home(home: Path) -> None:
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump({"telemetry": {"enabled": False}}))


def _postgres_home(home: Path, server: PostgresServer) -> None:
    home.mkdir(parents=True)
    db = server.fresh_database("tag_log")
    (home / "dagster.yaml").write_text(
        yaml.safe_dump(
            {"storage": {"postgres": {"postgres_url": db.url}}, "telemetry": {"enabled": False}}
        )
    )


@contextlib.contextmanager
def _world(
    built: Built, tmp: Path, storage: str, postgres: PostgresServer | None = None
) -> Iterator[TagWorld]:
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
    """In-process tests: an in-memory instance (its
    file lock lives in its temporary root directory)."""
    with dg.DagsterInstance.ephemeral() as instance:
        yield TagWorld(built, instance, Path(instance.root_directory), tmp_path)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


def fault(n: int = 1) -> None:
    """Count a fault a test injects (the suite prints the total)."""
    count("faults injected (promotion log)", n)


def assert_log_is_the_registry(w: TagWorld) -> None:
    """The promotion log's promise: a true account (each record starts where the one before ended)
    whose newest record is where the registry has the tag."""
    log, now = w.log(), w.floating()
    assert log_disagreement(log, now) is None, log_disagreement(log, now)
    assert log and log[-1].to_digest == now, [(m.action, m.from_digest, m.to_digest) for m in log]


# -- what a PUT's answer records -------------------------------------------------------------------


def test_a_put_the_registry_applied_but_answered_500_is_recorded_and_the_next_plan_starts_from_it(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success
    fault()
    applied = w.promote(w.b2, AppliedThen500(host=w.built.host))
    assert applied.success, failure_message(applied)
    assert w.floating() == w.d2
    meta = metadata(applied)
    assert meta["from_digest"] == w.d1 and meta["to_digest"] == w.d2
    assert "answered the PUT with an error" in str(meta["recorded"]) and "HTTP 500" in str(
        meta["recorded"]
    )
    assert w.states() == [("promote", None, w.d1), ("promote", w.d1, w.d2)]
    assert_log_is_the_registry(w)  # at once: no reconciling run needed

    plan = w.plan()
    assert plan.current_digest == w.d2 and plan.target is not None and plan.target.digest == w.d1
    again = w.promote(w.b2)  # the log already says so: refused, and nothing new recorded
    assert not again.success and "already points at" in failure_message(again)
    assert len(w.log()) == 2 and w.tick().startswith(f":{w.tag} still at {w.d2}")


def test_a_put_that_failed_and_did_not_apply_records_nothing_and_leaves_the_tag(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success
    fault()
    failed = w.promote(w.b2, FailedPut(host=w.built.host))
    assert not failed.success
    said = failure_message(failed)
    assert "did not happen and nothing was recorded" in said and "HTTP 500" in said
    assert w.floating() == w.d1 and w.states() == [("promote", None, w.d1)]
    (intent,) = log_state(w.instance).intents  # the intent stays, for the watch
    assert intent.to_digest == w.d2 and intent.run_id == failed.run_id
    assert w.tick() == f":{w.tag} still at {w.d1}, as the promotion log says"  # nothing to complete
    assert w.states() == [("promote", None, w.d1)]
    assert_log_is_the_registry(w)


def test_a_reread_that_finds_another_digest_records_our_move_then_the_outside_one(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success
    fault()
    raced = w.promote(w.b2, MovedRightAfter(host=w.built.host, then_digest=w.built.hand))
    assert raced.success, failure_message(raced)
    assert w.floating() == w.built.hand
    assert w.states() == [
        ("promote", None, w.d1),
        ("promote", w.d1, w.d2),
        ("observed", w.d2, w.built.hand),
    ]
    assert "someone moved it again" in w.log()[1].recorded
    assert_log_is_the_registry(w)
    assert "still at" in w.tick()  # the log already ends where the registry is


def test_a_promote_against_a_registry_whose_head_names_a_digest_it_cannot_serve_fails_and_records_nothing(  # noqa: E501
    world: TagWorld,
) -> None:
    """The phantom record: the HEAD of the tag names a
    digest the registry does not hold (a lying proxy in
    front of the real registry). Before, the promote
    succeeded and logged an `observed` move to it."""
    w = world
    assert w.promote(w.b1).success
    phantom = "sha256:" + hashlib.sha256(b"a manifest no registry was ever given").hexdigest()
    fault()
    with RegistryProxy(upstream=w.built.host) as proxy:
        proxy.fail("HEAD", rf"/manifests/{w.tag}$", Fault.head_digest(phantom), times=1000)
        lied_to = w.promote(w.b2, HttpRegistry(host=proxy.host))
        asked = [s.status for s in proxy.requests("GET", rf"/manifests/{phantom}$")]
    assert not lied_to.success
    said = failure_message(lied_to)
    assert f":{w.tag}" in said and phantom in said and "Nothing was recorded" in said, said
    assert asked == [404]  # the manifest was asked for by that digest, and the registry has none
    assert w.states() == [("promote", None, w.d1)] and w.floating() == w.d1  # no phantom, no move
    # refused before any intent
    assert all(i.run_id != lied_to.run_id for i in log_state(w.instance).intents)
    assert_log_is_the_registry(w)


# -- the next run heals the log: a promote or rollback whose target the registry already has -------


def test_a_put_applied_then_500_by_a_run_that_died_is_recorded_by_the_next_promote_which_writes_nothing(  # noqa: E501
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success
    fault()
    died = w.promote(w.b2, AppliedThen500ThenGone(host=w.built.host))
    assert not died.success and "whether it moved is unknown" in failure_message(died)
    # the scar: the log is behind
    assert w.floating() == w.d2 and w.states() == [("promote", None, w.d1)]
    again = w.promote(w.b2)  # was: refused "already points at", and the move never logged
    assert again.success, failure_message(again)
    meta = metadata(again)
    assert (meta["action"], meta["from_digest"], meta["to_digest"]) == ("promote", w.d1, w.d2)
    assert f"after run {died.run_id}" in str(meta["recorded"]) and "nothing to write" in str(
        meta["recorded"]
    )
    assert w.states() == [("promote", None, w.d1), ("promote", w.d1, w.d2)]
    assert_log_is_the_registry(w)
    third = w.promote(w.b2)  # now the log says so: refused, nothing new
    assert not third.success and "already points at" in failure_message(third) and len(w.log()) == 2


def test_a_hand_move_to_a_verified_build_is_recorded_by_the_promote_of_that_build(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success
    fault()
    w.someone_tags(w.d2)
    again = w.promote(w.b2)
    assert again.success, failure_message(again)
    meta = metadata(again)
    assert (meta["action"], meta["from_digest"], meta["to_digest"]) == ("observed", w.d1, w.d2)
    assert "lockstep did not make this move" in str(meta["recorded"]) and "nothing to write" in str(
        meta["recorded"]
    )
    assert w.states() == [("promote", None, w.d1), ("observed", w.d1, w.d2)]
    assert_log_is_the_registry(w)
    third = w.promote(w.b2)
    assert not third.success and "already points at" in failure_message(third) and len(w.log()) == 2


def test_a_rollback_run_again_after_its_run_died_records_that_rollback_and_goes_no_further_back(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success and w.promote(w.b2).success
    fault()
    died = w.move("rollback", AppliedThen500ThenGone(host=w.built.host))
    assert not died.success and w.floating() == w.d1 and len(w.log()) == 2
    again = w.move("rollback")
    assert again.success, failure_message(again)
    meta = metadata(again)
    assert (meta["action"], meta["from_digest"], meta["to_digest"], meta["hold"]) == (
        "rollback",
        w.d2,
        w.d1,
        True,
    )
    assert f"after run {died.run_id}" in str(meta["recorded"]) and "nothing to write" in str(
        meta["recorded"]
    )
    assert w.floating() == w.d1 and w.states()[-1] == ("rollback", w.d2, w.d1) and len(w.log()) == 3
    assert_log_is_the_registry(w)
    held = w.promote(w.b2)  # the dead rollback's hold holds
    assert not held.success and "on hold" in failure_message(held)


def test_a_rollback_after_a_promote_that_died_rolls_back_from_where_the_tag_really_is(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success
    fault()
    assert not w.promote(w.b2, AppliedThen500ThenGone(host=w.built.host)).success
    rolled = w.move("rollback")
    assert rolled.success, failure_message(rolled)
    assert w.states() == [
        ("promote", None, w.d1),
        ("promote", w.d1, w.d2),
        ("rollback", w.d2, w.d1),
    ]
    assert w.floating() == w.d1
    assert_log_is_the_registry(w)


def test_a_refused_promote_still_records_the_move_it_found(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success and w.promote(w.b2).success and w.move("rollback").success
    fault()
    w.someone_tags(w.built.hand)
    held = w.promote(w.b2)
    assert not held.success and "on hold" in failure_message(held)
    assert w.states()[-1] == ("observed", w.d1, w.built.hand) and w.log()[-1].hold is True
    assert_log_is_the_registry(w)


# -- the watch -------------------------------------------------------------------------------------


def test_a_move_made_outside_lockstep_is_recorded_once_by_the_watch_and_plans_start_from_it(
    world: TagWorld,
) -> None:
    w = world
    assert w.promote(w.b1).success and w.promote(w.b2).success
    fault()
    w.someone_tags(w.built.hand)
    assert "still" not in (said := w.tick()) and f"observed {w.d2} -> {w.built.hand}" in said
    assert w.tick() == f":{w.tag} still at {w.built.hand}, as the promotion log says"
    observed = [m for m in w.log() if m.action == "observed"]
    assert (
        len(observed) == 1 and observed[0].to_digest == w.built.hand and observed[0].hold is False
    )
    assert "lockstep did not make this move" in observed[0].recorded
    assert_log_is_the_registry(w)

    plan = w.plan()
    assert (
        plan.current_digest == w.built.hand
        and plan.target is not None
        and plan.target.digest == w.d2
    )
    hand = next(c for c in plan.considered if c.digest == w.built.hand)
    assert "points at now" in (hand.refused or "")
    rolled = w.move("rollback")
    assert rolled.success, failure_message(rolled)
    assert metadata(rolled)["from_digest"] == w.built.hand and w.floating() == w.d2


def test_a_hold_survives_a_hand_move_and_still_stops_promotion(world: TagWorld) -> None:
    w = world
    assert w.promote(w.b1).success and w.promote(w.b2).success
    assert w.move("rollback").success and w.floating() == w.d1
    fault()
    w.someone_tags(w.built.hand)
    w.tick()
    assert w.log()[-1].action == "observed" and w.log()[-1].hold is True
    held = w.promote(w.b2)
    assert not held.success and "on hold" in failure_message(held) and w.floating() == w.built.hand
    w.site_file.write_text(
        w.site_file.read_text().replace("auto_promote = false", "auto_promote = true")
    )
    auto = defs.resolve_sensor_def("auto_promote_sensor")
    with dg.build_sensor_context(instance=w.instance, resources=w.resources) as context:
        skipped = auto(context)
    assert not skipped.run_requests and "on hold" in (skipped.skip_reason.skip_message or "")  # type: ignore[union-attr]


def test_a_run_records_a_hand_move_it_finds_before_it_moves(world: TagWorld) -> None:
    """No watch tick in between: the promote itself brings the log level with the registry first."""
    w = world
    assert w.promote(w.b1).success
    fault()
    w.someone_tags(w.built.hand)
    assert w.promote(w.b2).success
    assert w.states() == [
        ("promote", None, w.d1),
        ("observed", w.d1, w.built.hand),
        ("promote", w.built.hand, w.d2),
    ]
    assert_log_is_the_registry(w)


def test_the_watch_skips_an_unreachable_registry_and_records_nothing(world: TagWorld) -> None:
    w = world
    fault(2)  # a hand move, and a registry that does not answer
    w.someone_tags(w.d1)
    # nothing listens on discard
    w.resources["registry"] = HttpRegistry(host="127.0.0.1:9", timeout_s=2)
    said = w.tick()
    assert (
        said.startswith("cannot read the floating tag:")
        and "nothing recorded" in said
        and w.log() == []
    )


def test_the_watch_waits_while_a_move_holds_the_lock(world: TagWorld) -> None:
    w = world
    fault(2)  # a hand move, and the lock held by another writer
    w.someone_tags(w.d1)
    with floating_tag_lock(
        w.instance, name=floating_tag_lock_name(w.site), timeout_s=1, holder="test"
    ):
        assert "a lockstep move of it is in progress" in w.tick()
    assert w.log() == []
    assert "observed nothing -> " in w.tick() and w.states() == [("observed", None, w.d1)]


# -- the lock --------------------------------------------------------------------------------------


def test_the_record_is_stored_before_the_lock_is_released(
    world: TagWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster stores the MaterializeResult yielded
    inside `with lock:` before the generator resumes, so
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
    fault(2)  # a hand move, and another writer right after our PUT
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
    """The same guarantee where daemon-launched runs
    execute: the multiprocess executor's step process."""
    report = tmp_path / "report.json"
    monkeypatch.setenv(yield_in_lock.REPORT_ENV, str(report))
    with dg.instance_for_test() as instance:
        result = dg.execute_job(
            dg.reconstructable(yield_in_lock.step_process_job), instance=instance
        )
        assert result.success
    seen = json.loads(report.read_text())
    assert seen["pid"] != os.getpid() and seen["stored"] == [seen["run_id"]]


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
def test_a_writer_that_cannot_get_the_lock_fails_clearly_and_moves_nothing(
    built: Built, tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("postgres") if storage == "postgres" else None
    with _world(built, tmp_path, storage, server) as w:
        fault()
        with floating_tag_lock(
            w.instance, name=floating_tag_lock_name(w.site), timeout_s=1, holder="test holder"
        ):
            blocked = w.move("promote", build=w.b1[:8], lock_timeout_s=1)
        said = failure_message(blocked)
        assert not blocked.success and "for over 1 s: nothing was moved" in said
        assert (
            ("Postgres advisory lock" in said and "pg_locks" in said)
            if storage == "postgres"
            else "test holder" in said
        )
        assert "postgresql://" not in said and w.floating() is None and w.log() == []
        assert log_state(w.instance).intents == []


# -- other processes -------------------------------------------------------------------------------


def _worker(w: TagWorld, build: str, **fields: object) -> subprocess.Popen[str]:
    args = {
        "home": str(w.home),
        "sandbox": str(w.built.sb.root),
        "site_file": str(w.site_file),
        "cache": str(w.tmp / f"cache-{build[:8]}"),
        "host": w.built.host,
        "build": build[:8],
        **fields,
    }
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DAGSTER_HOME": str(w.home),
        "LOCKSTEP_SITE": str(w.site_file),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.tpu.race_worker", json.dumps(args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


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
        fault()
        code, said = _finish(_worker(w, w.b2, registry="KilledAfterPut"))
        assert code == -9, said  # really killed: no record, no finally
        assert w.floating() == w.d2 and w.states() == [("promote", None, w.d1)]
        (intent,) = log_state(w.instance).intents

        said_tick = w.tick()
        assert f"promote {w.d1} -> {w.d2}" in said_tick
        completed = w.log()[-1]
        assert (completed.action, completed.from_digest, completed.to_digest, completed.build) == (
            "promote",
            w.d1,
            w.d2,
            w.b2,
        )
        assert (
            f"after run {intent.run_id}" in completed.recorded
            and "floating_tag_watch" in completed.recorded
        )
        assert_log_is_the_registry(w)  # after one reconciling pass (the watch's tick)
        assert "still at" in w.tick() and len(w.log()) == 2
        # The dead run's lock went with its Postgres session: the next move goes through.
        rolled = w.move("rollback", lock_timeout_s=5)
        assert rolled.success, failure_message(rolled)
        assert (
            w.states()[-1] == ("rollback", w.d2, w.d1)
            and log_disagreement(w.log(), w.floating()) is None
        )


@pytest.mark.parametrize(
    ("storage", "lock"), [("sqlite", True), ("postgres", True), ("sqlite", False)]
)
def test_two_promotions_in_two_processes_leave_a_log_equal_to_the_registry(
    built: Built, tmp_path: Path, storage: str, lock: bool, request: pytest.FixtureRequest
) -> None:
    """Each process stops between its guard read and its PUT until the other arrives (or has waited
    2 s once the other is at the lock). With the lock the other is stuck on the lock, so the moves
    take turns and the log is the
    truth; without it both write from the same read and the log's account is wrong."""
    server = request.getfixturevalue("postgres") if storage == "postgres" else None
    with _world(built, tmp_path, storage, server) as w:
        fault()  # two writers inside one window
        box = tmp_path / "window"
        box.mkdir()
        started = time.monotonic()
        procs = {
            name: _worker(
                w,
                build,
                lock=lock,
                barrier_dir=str(box),
                name=name,
                registry_fields={
                    "barrier_dir": str(box),
                    "name": name,
                    "other": other,
                    "wait_s": 2.0,
                },
            )
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
            # one waited alone: the other was locked out
            assert sorted(windows.values()) == ["alone", "met"], windows
            build_of = {w.d1: w.b1, w.d2: w.b2}
            happened = [
                ("promote", None, puts[0]["digest"], build_of[puts[0]["digest"]]),
                ("promote", puts[0]["digest"], puts[1]["digest"], build_of[puts[1]["digest"]]),
            ]
            assert [(m.action, m.from_digest, m.to_digest, m.build) for m in log] == happened
            assert_log_is_the_registry(w)
        else:
            assert windows == {"a": "met", "b": "met"}, windows  # both inside the window at once
            disagreement = log_disagreement(log, final)
            assert disagreement is not None, [(m.action, m.from_digest, m.to_digest) for m in log]
            # both wrote from the same read: one from-digest is false
            assert "starts at nothing" in disagreement
        assert elapsed < 200


# -- under the daemon: a dead run is failed, frees `tag_moves`, and the log heals ------------------


def _worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    return next(
        (
            pid
            for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
            if (pid := worker_started(e.message or "")) is not None
        ),
        None,
    )


def test_a_promote_killed_with_its_code_server_is_failed_by_run_monitoring_and_the_next_run_heals_the_log(  # noqa: E501
    built: Built, tmp_path: Path
) -> None:
    """The demo killed -9 mid-promotion, then started again: the scar where a run stayed STARTED for
    ever and held `tag_moves`. (A run worker killed alone is failed by its code server, which sees
    its child die; with the code server gone too, only
    run monitoring can, through LocalRunLauncher.)

    `dagster-daemon run` on the demo's instance config (tests/support/tpu/crash_location.py's
    workspace) queues two promotes of b2; the first runs in its run worker and HeldAfterPut holds it
    between its PUT and its record; the second waits for `tag_moves`. The daemon, its code server
    and the run worker are SIGKILLed. A new `dagster-daemon run` starts: run monitoring fails the
    dead run, the queued promote dequeues, records the
    dead run's move from its intent, finds nothing left to
    write, and succeeds; the log ends where the registry is."""
    home, arm = tmp_path / "dagster_home", tmp_path / "arm"
    write_demo_home(home)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {
                        "python_module": {
                            "module_name": "tests.support.tpu.crash_location",
                            "location_name": "tpu",
                            "working_directory": str(ROOT),
                        }
                    }
                ]
            }
        )
    )
    log = tmp_path / "dagster-daemon.log"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert (
            type(instance.run_launcher).__name__ == "LocalRunLauncher"
            and instance.run_monitoring_enabled
        )
        w = TagWorld(built, instance, home, tmp_path)
        apply_pools(instance, {TAG_MOVES_POOL: 1})
        assert w.promote(w.b1).success
        # lockstep's sensors stay stopped
        env = {k: v for k, v in os.environ.items() if k != "LOCKSTEP_SENSORS_RUNNING"}
        env |= {
            "DAGSTER_HOME": str(home),
            "LOCKSTEP_SITE": str(w.site_file),
            "LOCKSTEP_CACHE": str(tmp_path / "cache"),
            ARM_ENV: str(arm),
            "PYTHONPATH": str(ROOT),
        }
        arm.touch()
        fault()
        Path(f"{arm}.submit").write_text(w.b2[:8])
        daemon = start_daemon(workspace, env, log)
        try:
            put = Path(f"{arm}.put")
            worker = int(
                wait_for(
                    "a promote's PUT",
                    lambda: put.exists() and put.read_text(),
                    log,
                    DAEMON_TIMEOUT_S,
                )
            )
            runs = [r.run_id for r in instance.get_runs(dg.RunsFilter(job_name="promote_tpu"))]
            (dead,) = [r for r in runs if _worker_pid(instance, r) == worker]
            (again,) = [r for r in runs if r != dead]
            # Held by a live run, `tag_moves` keeps the other in the queue.
            assert (_status(instance, dead), _status(instance, again)) == (
                dg.DagsterRunStatus.STARTED,
                dg.DagsterRunStatus.QUEUED,
            )
            kill_hard(daemon, also=worker, log=log)
        finally:
            stop_daemon(daemon, log)
        # the PUT landed, no record
        assert w.floating() == w.d2 and w.states() == [("promote", None, w.d1)]
        assert (_status(instance, dead), _status(instance, again)) == (
            dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.QUEUED,
        )

        daemon = start_daemon(workspace, env, log)
        try:
            wait_for(
                "both runs to finish",
                lambda: all(instance.get_run_by_id(r).is_finished for r in (dead, again)),
                log,
                DAEMON_TIMEOUT_S,
            )  # type: ignore[union-attr]
        finally:
            stop_daemon(daemon, log)

        records = {
            r.dagster_run.run_id: r
            for r in instance.get_run_records(dg.RunsFilter(run_ids=[dead, again]))
        }
        assert records[dead].dagster_run.status == dg.DagsterRunStatus.FAILURE
        failed = [
            e for e in instance.all_logs(dead) if e.dagster_event and e.dagster_event.is_run_failure
        ]
        assert f"the run worker process (pid {worker}) is gone" in failed[-1].message, failed[
            -1
        ].message
        assert records[again].dagster_run.status == dg.DagsterRunStatus.SUCCESS, log_tail(log, 4000)
        assert records[again].start_time is not None and records[dead].end_time is not None
        # it waited for the slot the dead run held
        assert records[again].start_time >= records[dead].end_time

        healed = w.log()[-1]
        assert w.states() == [("promote", None, w.d1), ("promote", w.d1, w.d2)]
        assert (
            f"recorded by run {again} after run {dead}" in healed.recorded
            and "nothing to write" in healed.recorded
        )
        assert_log_is_the_registry(w)
        assert healed.to_digest == w.d2


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status
