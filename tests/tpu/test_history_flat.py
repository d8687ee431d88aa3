"""A promotion and a rollback plan read the newest few records, whatever the history's length.

Nothing here is timed: the instance's reads are counted (calls and records returned), and a plan
over a long history must read exactly what it reads over a short one. The history is written by
history_fill.py (the records lockstep writes, stored in batches).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest

from resources.git import GitRemotes
from resources.site.promotion import PromotionSection
from tests.support.postgres_server import running_postgres
from tests.support.tpu import history_fill as hf
from tpu_assets.history import (
    FLOATING_TAG,
    PROMOTE_FIRST,
    VERIFIED_IMAGE,
    log_state,
    move_materialization,
    read_ahead,
    tag_history,
    verified_history,
)
from tpu_assets.promotion import decide_move
from tpu_assets.rejection import now_utc, policy_gate
from tpu_assets.rollback import ListedVerified, TagMove, current_state, plan_rollback


@dataclass
class Reads:
    """Every event-log read the code under test makes, counted where the instance answers it."""

    calls: list[str] = field(default_factory=list)
    records: int = 0

    def reset(self) -> None:
        self.calls, self.records = [], 0


def counted(instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> Reads:
    reads = Reads()
    for name in ("fetch_materializations", "fetch_observations", "get_event_tags_for_asset"):
        real = getattr(instance, name)

        def read(*args: object, _real=real, _name=name, **kwargs: object):  # type: ignore[no-untyped-def]
            result = _real(*args, **kwargs)
            reads.calls.append(_name)
            reads.records += (
                len(result) if isinstance(result, list) else len(getattr(result, "records", result))
            )
            return result

        monkeypatch.setattr(instance, name, read)
    return reads


@pytest.fixture
def instances(tmp_path: Path) -> Iterator[list[dg.DagsterInstance]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        dg.instance_for_test(temp_dir=str(tmp_path / "a")) as a,
        dg.instance_for_test(temp_dir=str(tmp_path / "b")) as b,
    ):
        yield [a, b]


@pytest.fixture(scope="module")
def promoted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[tuple[dg.DagsterInstance, hf.Filled]]]:
    """Two histories only read by the tests that use them:
    12 and 500 builds, each verified and promoted in turn."""
    with (
        dg.instance_for_test(temp_dir=str(tmp_path_factory.mktemp("short"))) as short,
        dg.instance_for_test(temp_dir=str(tmp_path_factory.mktemp("long"))) as long,
    ):
        yield [(short, hf.fill(short, hf.site(), 12)), (long, hf.fill(long, hf.site(), 500))]


def no_fix(commit: str, required: str) -> bool:
    return True


def test_a_rollback_plan_reads_as_much_after_500_promotions_as_after_12(
    promoted: list[tuple[dg.DagsterInstance, hf.Filled]], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    for instance, filled in promoted:
        n = len(filled.builds)
        reads = counted(instance, monkeypatch)
        plan = plan_rollback(
            verified=verified_history(instance),
            moves=tag_history(instance),
            current_digest=filled.digests[-1],
            contains=no_fix,
        )
        assert plan.target is not None and plan.target.digest == filled.digests[-2]
        assert plan.target.build == filled.builds[-2] and plan.target.harbor_commit == hf.harbor(
            n - 2
        )
        # The current digest refused, the target, and the
        # two older ones a person is shown: no further.
        assert [c.digest for c in plan.considered] == filled.digests[-1:-5:-1]
        seen.append((list(reads.calls), reads.records))
    assert seen[0] == seen[1]
    calls, records = seen[1]
    # the newest page of moves; the newest verified builds
    assert len(calls) == 2 and records <= 4 + 8


def test_a_plan_walks_back_past_hand_moves_only_as_far_as_the_first_verified_digest(
    instances: list[dg.DagsterInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = instances[0]
    cfg = hf.site()
    filled = hf.fill(instance, cfg, 500)
    hands = [f"sha256:{'e' * 60}{i:04d}" for i in range(6)]
    before = filled.digests[-1]
    for hand in hands:  # someone crane-tags six test images in a row; the watch records each
        instance.report_runless_asset_event(
            move_materialization(
                cfg, TagMove(action="observed", from_digest=before, to_digest=hand, recorded="test")
            )
        )
        before = hand
    reads = counted(instance, monkeypatch)
    plan = plan_rollback(
        verified=verified_history(instance),
        moves=tag_history(instance),
        current_digest=hands[-1],
        contains=no_fix,
    )
    assert plan.target is not None and plan.target.build == filled.builds[-1]
    refused = [c for c in plan.considered if c.refused]
    assert [c.digest for c in refused] == hands[::-1]
    assert all(c.outside for c in refused[1:]) and "outside lockstep and not verified" in (
        refused[1].refused or ""
    )
    # Each hand digest is looked up in the data-version
    # index (no rows), never by walking the 500 builds.
    assert reads.calls.count("get_event_tags_for_asset") == len(hands) and reads.records <= 30


def test_an_explicit_old_build_is_looked_up_by_its_partition(
    promoted: list[tuple[dg.DagsterInstance, hf.Filled]], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    for instance, filled in promoted:
        reads = counted(instance, monkeypatch)
        plan = plan_rollback(
            verified=verified_history(instance),
            moves=tag_history(instance),
            current_digest=filled.digests[-1],
            explicit_build=filled.builds[1],
            contains=no_fix,
        )
        assert (
            plan.target is not None
            and plan.target.digest == filled.digests[1]
            and plan.target.was_promoted
        )
        seen.append((list(reads.calls), reads.records))
    # the newest moves (made eagerly), the build's record, one index row
    assert seen[0] == seen[1] and seen[1][1] <= 6


def test_a_promote_reads_the_newest_records_and_one_rejection_per_build_it_judges(
    instances: list[dg.DagsterInstance], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = hf.site()
    git = GitRemotes(cache_dir=str(tmp_path / "git"))
    seen = []
    for instance, n in zip(instances, (6, 500), strict=True):
        # the newest two builds are not promoted yet
        filled = hf.fill(instance, cfg, n, promotions=n - 2)
        # The newest build is rejected, and so are most
        # of the old ones (rejections are never all read).
        hf.reject(instance, cfg, [*filled.builds[: max(1, n - 100)], filled.builds[-1]])
        reads = counted(instance, monkeypatch)
        logged = tag_history(instance, first=1)  # as floating_tag reads for a promote
        # the registry agrees with the log
        state = log_state(instance, logged, registry_at=filled.digests[-3])
        assert (state.current, state.hold) == (filled.digests[-3], False) == current_state(logged)
        verified = verified_history(instance, first=PROMOTE_FIRST)
        build, _ = policy_gate(
            instance, PromotionSection(), verified=verified, build="", now=now_utc()
        )
        move, _ = decide_move(
            "promote",
            site=cfg,
            git=git,
            verified=verified,
            logged=logged,
            found=[],
            current=state.current,
            build=build,
        )
        assert move is not None and (move.from_digest, move.to_digest, move.build) == (
            filled.digests[-3],
            filled.digests[-2],
            filled.builds[-2],
        )
        seen.append((list(reads.calls), reads.records))
    assert seen[0] == seen[1]
    calls, records = seen[1]
    # the newest move, the newest two verified builds (one page), the newest one's rejection and the
    # second one's (none); no intents: the registry is where the log says, so none can change what
    # is recorded
    assert calls == [
        "fetch_materializations",
        "fetch_materializations",
        "fetch_observations",
        "fetch_observations",
    ], calls
    assert records == 1 + 2 + 1, records


def test_the_plan_over_the_instance_is_the_plan_over_the_whole_history_in_memory(
    tmp_path: Path,
) -> None:
    """The lazy reads change how much is read, not what is decided: rollbacks, holds, hand moves
    (of a verified digest too), re-verified builds, explicit builds and a required fix."""
    cfg = hf.site()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        filled = hf.fill(instance, cfg, 12)
        # build 3 verified again, newest
        hf.store(instance, [hf._entry(hf.verified_record(cfg, 3), time.time())])
        d = filled.digests
        for move in (
            TagMove(
                action="rollback",
                from_digest=d[11],
                to_digest=d[9],
                build=filled.builds[9],
                hold=True,
            ),
            TagMove(action="observed", from_digest=d[9], to_digest="sha256:" + "f" * 64, hold=True),
            # a verified one
            TagMove(action="observed", from_digest="sha256:" + "f" * 64, to_digest=d[5], hold=True),
            TagMove(action="release_hold", from_digest=d[5], to_digest=d[5]),
        ):
            instance.report_runless_asset_event(move_materialization(cfg, move))
        moves_all, verified_all = list(tag_history(instance)), list(verified_history(instance))
        assert len(moves_all) == 16 and len(verified_all) == 13
        walked = verified_history(instance)
        # its newest record is read: the rest come from its partition
        assert walked[0].build == filled.builds[3]
        assert list(walked.named(filled.builds[3])) == [
            v for v in verified_all if v.build == filled.builds[3]
        ]

        def fixed_in(at: int):  # type: ignore[no-untyped-def]
            return lambda commit, required: int(commit, 16) - 0xA0000 >= at

        for current in (d[5], d[11], "sha256:" + "f" * 64, None):
            for explicit in (None, filled.builds[3], filled.builds[7][:6], "abcdef"):
                for fix in (0, 11):
                    kwargs = {
                        "current_digest": current,
                        "explicit_build": explicit,
                        "must_contain": f"fix{fix}",
                        "contains": fixed_in(fix),
                    }
                    lazy = plan_rollback(
                        verified=verified_history(instance), moves=tag_history(instance), **kwargs
                    )
                    whole = plan_rollback(
                        verified=ListedVerified(verified_all), moves=moves_all, **kwargs
                    )
                    assert lazy == whole, (current, explicit, fix)


def promote_reads(instance: dg.DagsterInstance, *, registry_at: str, git: GitRemotes) -> TagMove:
    """What floating_tag reads for a promote before its registry write, the registry at
    `registry_at`: the log, the policy gate, the rules, then the
    verified records of the move's target (attestation)
    and of both its ends (the changelog's baked harbors)."""
    cfg = hf.site()
    verified = verified_history(instance, first=PROMOTE_FIRST)
    gate = read_ahead(
        instance,
        lambda: policy_gate(
            instance, PromotionSection(), verified=verified, build="", now=now_utc()
        ),
    )
    logged = tag_history(instance, first=1)
    state = log_state(instance, logged, registry_at=registry_at)
    build, _ = gate.result()
    move, _ = decide_move(
        "promote",
        site=cfg,
        git=git,
        verified=verified,
        logged=logged,
        found=[],
        current=state.current,
        build=build,
    )
    assert move is not None and move.to_digest is not None and move.from_digest is not None
    target = verified.with_digest(move.to_digest, build=move.build)
    came_from, going_to = (
        verified.with_digest(move.from_digest),
        verified.with_digest(move.to_digest),
    )
    assert target is not None and target == going_to and came_from is not None
    assert came_from.digest == move.from_digest
    return move.model_copy(update={"recorded": came_from.harbor_commit})


def test_a_promote_of_an_unrejected_newest_build_makes_three_reads_its_changelog_included(
    instances: list[dg.DagsterInstance], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = hf.site()
    git = GitRemotes(cache_dir=str(tmp_path / "git"))
    for instance, n in zip(instances, (6, 500), strict=True):
        # the newest build is verified, not promoted yet
        filled = hf.fill(instance, cfg, n, promotions=n - 1)
        reads = counted(instance, monkeypatch)
        move = promote_reads(instance, registry_at=filled.digests[-2], git=git)
        assert (move.from_digest, move.build) == (filled.digests[-2], filled.builds[-1])
        # the harbor the tag bakes now, from the build's record
        assert move.recorded == hf.harbor(n - 2)
        # the newest two verified builds (the target, and the build on the tag, which the changelog
        # reads its harbor from); whether anyone rejected the target; where the tag is: nothing
        # older, and no lookup by the data-version index
        assert reads.calls == [
            "fetch_materializations",
            "fetch_observations",
            "fetch_materializations",
        ], reads.calls
        assert reads.records == 1 + 2, reads.records


def test_a_promote_over_builds_the_tag_skipped_finds_the_current_one_by_its_index_as_far_back_at_500(  # noqa: E501
    instances: list[dg.DagsterInstance], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = hf.site()
    git = GitRemotes(cache_dir=str(tmp_path / "git"))
    seen = []
    for instance, n in zip(instances, (12, 500), strict=True):
        # three builds verified since the last promote
        filled = hf.fill(instance, cfg, n, promotions=n - 3)
        reads = counted(instance, monkeypatch)
        move = promote_reads(instance, registry_at=filled.digests[-4], git=git)
        assert (move.from_digest, move.build, move.recorded) == (
            filled.digests[-4],
            filled.builds[-1],
            hf.harbor(n - 4),
        )
        seen.append((list(reads.calls), reads.records))
    assert seen[0] == seen[1]
    # the current digest is not among the newest two:
    # its index row, then the next page (8) of builds
    assert seen[1][0][3:] == ["get_event_tags_for_asset", "fetch_materializations"], seen[1]


@pytest.fixture(scope="module")
def on_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dg.DagsterInstance]:
    with (
        running_postgres() as server,
        dg.instance_for_test(
            temp_dir=str(tmp_path_factory.mktemp("pg")),
            overrides={
                "storage": {"postgres": {"postgres_url": server.fresh_database("history_flat").url}}
            },
        ) as instance,
    ):
        yield instance


def test_on_postgres_a_promotes_policy_reads_are_in_flight_while_its_log_is_read(
    on_postgres: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    instance, cfg = on_postgres, hf.site()
    filled = hf.fill(instance, cfg, 20, promotions=19)
    # The log's read and the policy's first read each wait here for the other to be under way: two
    # threads reach it only if both reads are in flight
    # at once (sequential reads break it, and fail).
    both = threading.Barrier(2, timeout=60)
    where: dict[str, str] = {}
    real = instance.fetch_materializations

    def read(records: object, **kwargs: object) -> dg.EventRecordsResult:
        key = records if isinstance(records, dg.AssetKey) else records.asset_key  # type: ignore[attr-defined]
        if key.to_user_string() not in where:
            where[key.to_user_string()] = threading.current_thread().name
            both.wait()
        return real(records, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(instance, "fetch_materializations", read)
    move = promote_reads(
        instance, registry_at=filled.digests[-2], git=GitRemotes(cache_dir=str(tmp_path / "git"))
    )
    assert (move.from_digest, move.build, move.recorded) == (
        filled.digests[-2],
        filled.builds[-1],
        hf.harbor(18),
    )
    assert where[FLOATING_TAG.to_user_string()] == threading.main_thread().name
    assert where[VERIFIED_IMAGE.to_user_string()] == "lockstep-read-ahead"
