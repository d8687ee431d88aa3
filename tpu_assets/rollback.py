"""Rollback planning over the verified and promoted history: pure functions, no Dagster, no network.

Runbook §5: a rollback to a digest that PREDATES the fix is a no-op (it dies identically); roll back
to the last digest that actually worked. Kargo's lesson: a rollback is a promotion of older freight
plus a hold, so automation does not undo it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal, NamedTuple, Protocol, runtime_checkable

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
    # who recorded it, and anything unusual (an error the registry answered, a dead run)
    recorded: str = ""
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
            name = (
                f"build {c.build[:8]}"
                if c.build
                else "a digest moved in outside lockstep"
                if c.outside
                else "a digest from before lockstep"
            )
            mark = (
                "-> TARGET"
                if c is self.target
                else f"refused: {c.refused}"
                if c.refused
                else "also possible (older)"
            )
            harbor = f", harbor {c.harbor_commit[:8]}" if c.harbor_commit else ""
            lines.append(
                f"  {name} {c.digest[:19]}{harbor}{', was on :tpu' if c.was_promoted else ''}: "
                f"{mark}"
            )
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


# After the target, a plan judges this many older candidates (so a person sees what else was
# possible, or why not) and stops: how far it reads is set by
# where the target is, not by the history's length.
OLDER_SHOWN = 2


@runtime_checkable
class VerifiedRecords(Protocol):
    """The `tpu/verified_image` records a plan reads, newest first, looked up as far as it needs."""

    def __iter__(self) -> Iterator[VerifiedBuild]: ...

    def with_digest(self, digest: str, *, build: str | None = None) -> VerifiedBuild | None:
        """The newest record of `digest` (of `build`'s records,
        when the move that put it on the tag names one)."""
        ...

    def named(self, prefix: str) -> Iterator[VerifiedBuild]:
        """The records of the builds `prefix` names, newest first."""
        ...

    def prefetch(self, builds: Sequence[str]) -> None:
        """A hint: these builds are about to be looked up (one read for all of them)."""
        ...


class ListedVerified:
    """VerifiedRecords over records already in memory (any order)."""

    def __init__(self, verified: Iterable[VerifiedBuild]) -> None:
        self._all = sorted(verified, key=lambda v: v.verified_at, reverse=True)

    def __iter__(self) -> Iterator[VerifiedBuild]:
        return iter(self._all)

    def with_digest(self, digest: str, *, build: str | None = None) -> VerifiedBuild | None:
        return next((v for v in self._all if v.digest == digest and build in (None, v.build)), None)

    def named(self, prefix: str) -> Iterator[VerifiedBuild]:
        return (v for v in self._all if v.build.startswith(prefix))

    def prefetch(self, builds: Sequence[str]) -> None:
        return None


def as_records(verified: Iterable[VerifiedBuild] | VerifiedRecords) -> VerifiedRecords:
    return verified if isinstance(verified, VerifiedRecords) else ListedVerified(verified)


class NewestFirst:
    """`first` (newest first), then `log`: the log with the records a run is about to add, read no
    further back than a plan asks."""

    def __init__(self, first: Sequence[TagMove], log: Iterable[TagMove]) -> None:
        self.first, self.log = first, log

    def __iter__(self) -> Iterator[TagMove]:
        yield from self.first
        yield from self.log

    def was_on_tag(self, digest: str) -> bool:
        return any(digest in (m.to_digest, m.from_digest) for m in self.first) or _was_on_tag(
            self.log, digest
        )


class _Seen(NamedTuple):
    digest: str
    build: str | None  # the build the move that put it on the tag names
    outside: bool  # put there by a move lockstep did not make


def _promoted(moves: Iterable[TagMove], seen: set[str]) -> Iterator[_Seen]:
    """Every digest that was on the tag, newest first, each once. A move's from-digest is the older
    move's to-digest (the log is a chain), so that older
    move says which build (or whose hand) put it there."""
    it = iter(moves)
    move = next(it, None)
    while move is not None:
        older = next(it, None)
        for digest in (move.to_digest, move.from_digest):
            if not digest or digest in seen:
                continue
            seen.add(digest)
            putters = [m for m in (move, older) if m is not None and m.to_digest == digest]
            yield _Seen(
                digest,
                next((m.build for m in putters if m.build), None),
                any(m.action == "observed" for m in putters),
            )
        move = older


def _candidates(
    records: VerifiedRecords, moves: Iterable[TagMove], explicit_build: str | None, batch: int
) -> Iterator[tuple[Candidate, VerifiedBuild | None]]:
    """Newest first: the digests that were on the tag, then the verified builds never promoted."""
    seen: set[str] = set()
    if explicit_build:  # only that build's records: its digests are looked up, not walked to
        for v in records.named(explicit_build):
            if v.digest not in seen:
                seen.add(v.digest)
                yield (
                    Candidate(
                        build=v.build,
                        digest=v.digest,
                        harbor_commit=v.harbor_commit,
                        was_promoted=_was_on_tag(moves, v.digest),
                    ),
                    v,
                )
        return
    promoted = _promoted(moves, seen)
    while chunk := list(itertools.islice(promoted, batch)):
        records.prefetch([s.build for s in chunk if s.build])
        for s in chunk:
            v = records.with_digest(s.digest, build=s.build)
            yield (
                Candidate(
                    build=v.build if v else None,
                    digest=s.digest,
                    harbor_commit=v.harbor_commit if v else None,
                    was_promoted=True,
                    outside=s.outside and v is None,
                ),
                v,
            )
    for v in records:
        if v.digest not in seen:
            seen.add(v.digest)
            yield Candidate(build=v.build, digest=v.digest, harbor_commit=v.harbor_commit), v


@runtime_checkable
class MoveLog(Protocol):
    """The floating tag's moves, newest first, that can
    say without a walk whether a digest was on the tag."""

    def __iter__(self) -> Iterator[TagMove]: ...

    def was_on_tag(self, digest: str) -> bool: ...


def _was_on_tag(moves: Iterable[TagMove], digest: str) -> bool:
    if isinstance(moves, MoveLog):
        return moves.was_on_tag(digest)
    return any(digest in (m.to_digest, m.from_digest) for m in moves)


def plan_rollback(
    *,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    moves: Iterable[TagMove],
    current_digest: str | None,
    must_contain: str | None = None,
    explicit_build: str | None = None,
    contains: Callable[[str, str], bool],
    older: int = OLDER_SHOWN,
) -> RollbackPlan:
    """Choose the rollback target: newest first, digests that were on the floating tag before the
    verified-but-never-promoted ones; each must be verified, not the current digest, and (when
    asked) carry `must_contain` in its baked harbor (git ancestry via `contains(harbor_commit,
    required)`). The walk stops `older` candidates past the target, so the plan shows why each newer
    build was refused and what the next older ones would have been, and reads no further back.
    """
    considered: list[Candidate] = []
    target: Candidate | None = None
    past = 0
    for c, v in _candidates(as_records(verified), moves, explicit_build, batch=older + 2):
        c.refused = _refusal(c, v, current_digest, must_contain, contains)
        considered.append(c)
        if target is not None:
            past += 1
        elif c.refused is None:
            target = c
        if target is not None and past >= older:
            break  # before the next candidate is asked for: nothing older is read
    if explicit_build and not considered:
        considered.append(
            Candidate(
                build=explicit_build,
                digest="(none)",
                refused="not a verified build: only verified builds can be rollback targets",
            )
        )
    return RollbackPlan(
        current_digest=current_digest,
        must_contain=must_contain,
        explicit_build=explicit_build,
        considered=considered,
        target=target,
    )


def _refusal(
    c: Candidate,
    v: VerifiedBuild | None,
    current: str | None,
    must_contain: str | None,
    contains: Callable[[str, str], bool],
) -> str | None:
    if c.digest == current:
        return "it is what the floating tag points at now: rolling back to it changes nothing"
    if v is None:
        how = "put on the tag outside lockstep and " if c.outside else ""
        return (
            f"{how}not verified by lockstep (no tpu/verified_image record): it cannot be shown "
            "to have worked"
        )
    if must_contain and not contains(v.harbor_commit, must_contain):
        return (
            f"its harbor {v.harbor_commit[:8]} predates {must_contain[:8]}: rolling back to it "
            "is a no-op "
            "for that fix (it dies identically)"
        )
    return None
