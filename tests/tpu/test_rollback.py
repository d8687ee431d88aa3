"""Rollback planning: the runbook's 'tempting rollback' that predates the fix must be refused."""

from __future__ import annotations

from tpu_assets.rollback import TagMove, VerifiedBuild, current_state, plan_rollback

# harbor history: h1 -> h2 (the fix) -> h3
ANCESTRY = {("h1", "h1"), ("h2", "h1"), ("h2", "h2"), ("h3", "h1"), ("h3", "h2"), ("h3", "h3")}


def contains(commit: str, required: str) -> bool:
    return (commit, required) in ANCESTRY


B1 = VerifiedBuild(build="c1" * 20, digest="sha256:" + "1" * 64, harbor_commit="h1", verified_at=1)
B2 = VerifiedBuild(build="c2" * 20, digest="sha256:" + "2" * 64, harbor_commit="h2", verified_at=2)
B3 = VerifiedBuild(build="c3" * 20, digest="sha256:" + "3" * 64, harbor_commit="h3", verified_at=3)
OLD = "sha256:" + "0" * 64  # what :tpu pointed at before lockstep's first promotion
MOVES = [  # newest first
    TagMove(action="promote", from_digest=B2.digest, to_digest=B3.digest, build=B3.build, at=30),
    TagMove(action="promote", from_digest=B1.digest, to_digest=B2.digest, build=B2.build, at=20),
    TagMove(action="promote", from_digest=OLD, to_digest=B1.digest, build=B1.build, at=10),
]


def test_rollback_refuses_digest_that_predates_fix_and_picks_newest_that_carries_it() -> None:
    plan = plan_rollback(
        verified=[B1, B2, B3],
        moves=MOVES,
        current_digest=B3.digest,
        must_contain="h2",
        contains=contains,
    )
    assert plan.target is not None and plan.target.digest == B2.digest
    refused = {c.digest: c.refused for c in plan.considered}
    assert "now" in (refused[B3.digest] or "")
    # the tempting rollback, refused with the reason
    assert "predates h2" in (refused[B1.digest] or "")
    assert "not verified" in (refused[OLD] or "")
    text = plan.explain()
    assert "-> TARGET" in text and B2.build[:8] in text


def test_explicit_pre_fix_build_is_refused_with_the_reason() -> None:
    plan = plan_rollback(
        verified=[B1, B2, B3],
        moves=MOVES,
        current_digest=B3.digest,
        must_contain="h2",
        explicit_build=B1.build[:8],
        contains=contains,
    )
    assert not plan.ok
    (only,) = plan.considered
    assert (
        only.build == B1.build
        and "predates h2" in (only.refused or "")
        and "no-op" in (only.refused or "")
    )
    assert "No rollback target" in plan.explain()


def test_rollback_refuses_the_current_digest_and_unverified_digests() -> None:
    plan = plan_rollback(
        verified=[B1], moves=MOVES[2:], current_digest=B1.digest, contains=contains
    )
    assert not plan.ok
    reasons = {c.digest: c.refused for c in plan.considered}
    assert "points at now" in (reasons[B1.digest] or "") and "not verified" in (reasons[OLD] or "")


def test_without_a_fix_the_previous_promoted_digest_comes_first() -> None:
    plan = plan_rollback(
        verified=[B1, B2, B3], moves=MOVES, current_digest=B3.digest, contains=contains
    )
    assert plan.target is not None and plan.target.digest == B2.digest and plan.target.was_promoted


def test_unknown_explicit_build_is_refused() -> None:
    plan = plan_rollback(
        verified=[B1], moves=[], current_digest=None, explicit_build="deadbeef", contains=contains
    )
    assert not plan.ok and "not a verified build" in (plan.considered[0].refused or "")


def test_current_state_reads_the_newest_move() -> None:
    held = [
        TagMove(action="rollback", from_digest=B3.digest, to_digest=B2.digest, hold=True, at=40),
        *MOVES,
    ]
    assert current_state(held) == (B2.digest, True)
    assert current_state([]) == (None, False)
