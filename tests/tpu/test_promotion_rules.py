"""The promotion rules and the log's bookkeeping as plain functions: no Dagster run, no registry."""

from __future__ import annotations

import pytest

from tpu_assets.promotion import PromotionRefused, promote_move, release_move, rollback_move
from tpu_assets.rollback import TagMove, VerifiedBuild, current_state, plan_rollback
from tpu_assets.tag_log import (
    LogState,
    TagIntent,
    TagNotMoved,
    TagWrite,
    log_disagreement,
    records_after_write,
    unrecorded_moves,
)

B1 = VerifiedBuild(build="c1" * 20, digest="sha256:" + "1" * 64, harbor_commit="h1", verified_at=1)
B2 = VerifiedBuild(build="c2" * 20, digest="sha256:" + "2" * 64, harbor_commit="h2", verified_at=2)
HAND = "sha256:" + "9" * 64  # someone's `crane tag`, never built or verified by lockstep
VERIFIED = [B2, B1]  # newest first, as verified_history returns them


def no_ancestry(commit: str, required: str) -> bool:
    return True


# -- the rules ------------------------------------------------------------------------------------


def test_promote_takes_the_newest_verified_build_and_records_the_pre_promote_digest() -> None:
    move = promote_move(verified=VERIFIED, build="", current=B1.digest, hold=False, tag="tpu")
    assert (move.action, move.from_digest, move.to_digest, move.build, move.hold) == (
        "promote",
        B1.digest,
        B2.digest,
        B2.build,
        False,
    )


def test_promote_refuses_over_a_hold() -> None:
    with pytest.raises(PromotionRefused, match="on hold after a rollback: run release_tpu_hold"):
        promote_move(verified=VERIFIED, build="", current=B1.digest, hold=True, tag="tpu")


def test_promote_refuses_a_build_that_was_never_verified() -> None:
    with pytest.raises(PromotionRefused, match="build deadbeef has no tpu/verified_image record"):
        promote_move(verified=VERIFIED, build="deadbeef", current=None, hold=False, tag="tpu")
    with pytest.raises(PromotionRefused, match=r"build \(newest\) has no tpu/verified_image"):
        promote_move(verified=[], build="", current=None, hold=False, tag="tpu")


def test_promote_refuses_the_digest_already_on_the_tag() -> None:
    with pytest.raises(PromotionRefused, match=f":tpu already points at {B2.digest}"):
        promote_move(
            verified=VERIFIED, build=B2.build[:8], current=B2.digest, hold=False, tag="tpu"
        )


def test_rollback_sets_the_hold_and_refuses_without_a_target() -> None:
    moves = [TagMove(action="promote", from_digest=B1.digest, to_digest=B2.digest, build=B2.build)]
    plan = plan_rollback(
        verified=VERIFIED, moves=moves, current_digest=B2.digest, contains=no_ancestry
    )
    move = rollback_move(plan=plan, current=B2.digest)
    assert (move.from_digest, move.to_digest, move.hold) == (B2.digest, B1.digest, True)
    none = plan_rollback(verified=[B2], moves=[], current_digest=B2.digest, contains=no_ancestry)
    with pytest.raises(PromotionRefused, match="rollback refused, nothing was moved"):
        rollback_move(plan=none, current=B2.digest)


def test_release_needs_a_hold_and_leaves_the_tag_where_it_is() -> None:
    with pytest.raises(PromotionRefused, match="no hold to release"):
        release_move(current=B1.digest, hold=False)
    move = release_move(current=B1.digest, hold=True)
    assert (move.from_digest, move.to_digest, move.hold) == (B1.digest, B1.digest, False)


# -- what a write records, decided by the re-read -------------------------------------------------

OURS = TagMove(action="promote", from_digest=B1.digest, to_digest=B2.digest, build=B2.build)


def test_a_500_that_the_registry_applied_is_recorded_saying_so() -> None:
    (move,) = records_after_write(
        OURS, TagWrite(target=B2.digest, after=B2.digest, put_error="HTTP 500"), tag="tpu"
    )
    assert (
        move.to_digest == B2.digest
        and "answered the PUT with an error (HTTP 500) but applied it" in move.recorded
    )


def test_a_failed_put_that_did_not_apply_records_nothing() -> None:
    with pytest.raises(TagNotMoved, match="did not happen and nothing was recorded"):
        records_after_write(
            OURS, TagWrite(target=B2.digest, after=B1.digest, put_error="HTTP 500"), tag="tpu"
        )


def test_a_reread_that_finds_another_digest_records_our_move_then_the_outside_one() -> None:
    ours, outside = records_after_write(OURS, TagWrite(target=B2.digest, after=HAND), tag="tpu")
    assert ours.to_digest == B2.digest and "someone moved it again" in ours.recorded
    assert (outside.action, outside.from_digest, outside.to_digest) == ("observed", B2.digest, HAND)
    assert log_disagreement([ours, outside], HAND) is None


def test_a_clean_write_records_just_the_move() -> None:
    assert records_after_write(OURS, TagWrite(target=B2.digest, after=B2.digest), tag="tpu") == [
        OURS
    ]


# -- making the log end where the registry is ----------------------------------------------------


def test_registry_equal_to_the_log_needs_no_record() -> None:
    assert (
        unrecorded_moves(LogState(current=B1.digest, last_storage_id=5), B1.digest, recorder="t")
        == []
    )


def test_a_move_made_outside_lockstep_is_observed_and_keeps_the_hold() -> None:
    state = LogState(current=B1.digest, hold=True, last_storage_id=5)
    (move,) = unrecorded_moves(state, HAND, recorder="floating_tag_watch")
    assert (move.action, move.from_digest, move.to_digest, move.hold) == (
        "observed",
        B1.digest,
        HAND,
        True,
    )
    assert (
        "lockstep did not make this move" in move.recorded and "floating_tag_watch" in move.recorded
    )


def test_a_tag_that_predates_the_log_is_observed_once() -> None:
    (move,) = unrecorded_moves(LogState(), HAND, recorder="t")
    assert move.from_digest is None and "before lockstep's first record" in move.recorded


def test_a_dead_runs_intent_is_recorded_as_its_move() -> None:
    intent = TagIntent(
        run_id="run-1",
        action="rollback",
        from_digest=B2.digest,
        to_digest=B1.digest,
        build=B1.build,
        hold=True,
    )
    state = LogState(current=B2.digest, last_storage_id=5, intents=[intent])
    (move,) = unrecorded_moves(state, B1.digest, recorder="floating_tag_watch")
    assert (move.action, move.from_digest, move.to_digest, move.build, move.hold) == (
        "rollback",
        B2.digest,
        B1.digest,
        B1.build,
        True,
    )
    assert (
        "after run run-1" in move.recorded
        and "died between its PUT and its record" in move.recorded
    )


def test_an_intent_for_another_digest_does_not_explain_the_move() -> None:
    intent = TagIntent(run_id="run-1", action="promote", from_digest=B1.digest, to_digest=B2.digest)
    (move,) = unrecorded_moves(
        LogState(current=B1.digest, last_storage_id=5, intents=[intent]), HAND, recorder="t"
    )
    assert move.action == "observed" and move.to_digest == HAND


def test_log_disagreement_names_a_stale_from_digest_and_a_wrong_end() -> None:
    raced = [
        TagMove(action="promote", from_digest=None, to_digest=B1.digest),
        TagMove(action="promote", from_digest=None, to_digest=B2.digest),
    ]
    assert "starts at nothing, but record 0 left the tag at" in (
        log_disagreement(raced, B2.digest) or ""
    )
    chain = [raced[0], TagMove(action="promote", from_digest=B1.digest, to_digest=B2.digest)]
    assert log_disagreement(chain, B2.digest) is None
    assert "the log ends at" in (log_disagreement(chain, B1.digest) or "")


# -- planning over observed states ----------------------------------------------------------------


def test_an_outside_digest_is_current_for_planning_and_never_a_target_unless_verified() -> None:
    moves = [  # newest first
        TagMove(action="observed", from_digest=B2.digest, to_digest=HAND),
        TagMove(action="promote", from_digest=B1.digest, to_digest=B2.digest, build=B2.build),
    ]
    plan = plan_rollback(verified=VERIFIED, moves=moves, current_digest=HAND, contains=no_ancestry)
    assert (
        plan.current_digest == HAND and plan.target is not None and plan.target.digest == B2.digest
    )
    refused = {c.digest: c for c in plan.considered}
    assert refused[HAND].refused and "points at now" in refused[HAND].refused  # current first
    away = plan_rollback(
        verified=VERIFIED, moves=moves, current_digest=B2.digest, contains=no_ancestry
    )
    hand = next(c for c in away.considered if c.digest == HAND)
    assert hand.outside and "put on the tag outside lockstep and not verified" in (
        hand.refused or ""
    )
    assert "a digest moved in outside lockstep" in away.explain()


def test_an_outside_digest_that_a_verified_build_has_is_a_target() -> None:
    moves = [
        TagMove(action="observed", from_digest=B2.digest, to_digest=B1.digest),
        TagMove(action="promote", from_digest=None, to_digest=B2.digest, build=B2.build),
    ]
    plan = plan_rollback(
        verified=VERIFIED, moves=moves, current_digest=B2.digest, contains=no_ancestry
    )
    assert (
        plan.target is not None
        and plan.target.digest == B1.digest
        and plan.target.build == B1.build
    )


def test_a_hold_survives_an_outside_move() -> None:
    moves = [
        TagMove(action="observed", from_digest=B1.digest, to_digest=HAND, hold=True),
        TagMove(action="rollback", from_digest=B2.digest, to_digest=B1.digest, hold=True),
    ]
    assert current_state(moves) == (HAND, True)
