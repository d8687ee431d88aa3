"""Rollback planning over the verified and promoted history: pure functions, no Dagster, no network.

Runbook §5: a rollback to a digest that PREDATES the fix is a no-op (it dies identically); roll back
to the last digest that actually worked. Kargo's lesson: a rollback is a promotion of older freight
plus a hold, so automation does not undo it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field

from resources.model import Model


class VerifiedBuild(Model):
    """A `tpu/verified_image` record: a build that passed every image check and the smoke."""

    build: str  # the tpu_builds partition: the consumer commit
    digest: str
    harbor_commit: str
    verified_at: float


# What moved the floating tag: lockstep's three actions, or `observed` for a move lockstep did not
# make (someone's `crane tag`), recorded so that every state of the tag is in the log.
MoveAction = Literal["promote", "rollback", "release_hold", "observed"]


class TagMove(Model):
    """A `tpu/floating_tag` record: one move of the floating tag (or a hold change)."""

    action: MoveAction
    from_digest: str | None
    to_digest: str | None
    build: str | None = None
    hold: bool = False
    recorded: str = ""  # who recorded it, and anything unusual (an error the registry answered, a dead run)
    at: float = 0.0


class Candidate(Model):
    build: str | None
    digest: str
    harbor_commit: str | None = None
    was_promoted: bool = False
    outside: bool = False  # put on the tag by a move lockstep did not make
    refused: str | None = Field(default=None, description="Why this one is not a rollback target.")


class RollbackPlan(Model):
    current_digest: str | None
    must_contain: str | None
    explicit_build: str | None
    considered: list[Candidate]
    target: Candidate | None

    @property
    def ok(self) -> bool:
        return self.target is not None

    def explain(self) -> str:
        head = [f":tpu is at {self.current_digest or 'nothing'}"]
        if self.must_contain:
            head.append(f"the target must contain {self.must_contain}")
        lines = ["; ".join(head) + "."]
        for c in self.considered:
            name = (f"build {c.build[:8]}" if c.build else "a digest moved in outside lockstep" if c.outside
                    else "a digest from before lockstep")
            mark = "-> TARGET" if c is self.target else f"refused: {c.refused}" if c.refused else "also possible (older)"
            harbor = f", harbor {c.harbor_commit[:8]}" if c.harbor_commit else ""
            lines.append(f"  {name} {c.digest[:19]}{harbor}{', was on :tpu' if c.was_promoted else ''}: {mark}")
        if not self.target:
            lines.append("No rollback target: nothing was changed.")
        return "\n".join(lines)


def current_state(moves: Sequence[TagMove]) -> tuple[str | None, bool]:
    """Where the floating tag is and whether a hold is set, from the newest-first move history.

    An `observed` move (made outside lockstep) is where the tag is now, and it carries the hold it
    found: moving the tag by hand does not release a hold, only `release_tpu_hold` does.
    """
    if not moves:
        return None, False
    return moves[0].to_digest, moves[0].hold


def plan_rollback(
    *,
    verified: Sequence[VerifiedBuild],
    moves: Sequence[TagMove],
    current_digest: str | None,
    must_contain: str | None = None,
    explicit_build: str | None = None,
    contains: Callable[[str, str], bool],
) -> RollbackPlan:
    """Choose the rollback target: newest first, digests that were on the floating tag before the
    verified-but-never-promoted ones; each must be verified, not the current digest, and (when asked)
    carry `must_contain` in its baked harbor (git ancestry via `contains(harbor_commit, required)`).
    Every candidate is judged, so the plan shows why each older build was or was not eligible.
    """
    by_digest: dict[str, VerifiedBuild] = {}
    for v in sorted(verified, key=lambda v: v.verified_at, reverse=True):
        by_digest.setdefault(v.digest, v)
    promoted: list[str] = []
    outside: set[str] = set()
    for m in moves:  # newest first
        if m.action == "observed" and m.to_digest:
            outside.add(m.to_digest)
        for d in (m.to_digest, m.from_digest):
            if d and d not in promoted:
                promoted.append(d)
    order = promoted + [d for d in by_digest if d not in promoted]

    considered: list[Candidate] = []
    target: Candidate | None = None
    for digest in order:
        v = by_digest.get(digest)
        c = Candidate(build=v.build if v else None, digest=digest, harbor_commit=v.harbor_commit if v else None,
                      was_promoted=digest in promoted, outside=digest in outside and v is None)
        if explicit_build and (v is None or not v.build.startswith(explicit_build)):
            continue
        c.refused = _refusal(c, v, current_digest, must_contain, contains)
        considered.append(c)
        if c.refused is None and target is None:
            target = c
    if explicit_build and not considered:
        considered.append(Candidate(build=explicit_build, digest="(none)", refused="not a verified build: only verified builds can be rollback targets"))
    return RollbackPlan(current_digest=current_digest, must_contain=must_contain, explicit_build=explicit_build,
                        considered=considered, target=target)


def _refusal(
    c: Candidate, v: VerifiedBuild | None, current: str | None, must_contain: str | None,
    contains: Callable[[str, str], bool],
) -> str | None:
    if c.digest == current:
        return "it is what the floating tag points at now: rolling back to it changes nothing"
    if v is None:
        how = "put on the tag outside lockstep and " if c.outside else ""
        return f"{how}not verified by lockstep (no tpu/verified_image record): it cannot be shown to have worked"
    if must_contain and not contains(v.harbor_commit, must_contain):
        return (f"its harbor {v.harbor_commit[:8]} predates {must_contain[:8]}: rolling back to it is a no-op "
                "for that fix (it dies identically)")
    return None
