"""The promotion log kept equal to the registry: what to record, given what the registry says.

Pure functions over the log's records (no Dagster, no network). The log is `tpu/floating_tag`'s
materialization history; an intent is an observation of that asset logged right before a write.
The registry is the truth: whatever it answered, the log records the state the re-read shows, and a
state lockstep did not make is recorded as `observed`, so the log's newest record is always where
the tag is (runbook §5: the pre-promote digest is the rollback target, so it must be right).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from resources.errors import LockstepError
from resources.model import Model
from tpu_assets.rollback import TagMove

WATCH_NAME = "floating_tag_watch"


class TagIntent(Model):
    """A move a run was about to write, logged BEFORE its PUT: if the run dies after the PUT, the
    watch finds the registry at `to_digest` and records the move this intent describes."""

    run_id: str
    action: Literal["promote", "rollback"]
    from_digest: str | None
    to_digest: str
    build: str | None = None
    hold: bool = False
    at: float = 0.0


class LogState(Model):
    """The log's newest record, and the intents logged after it (newest first)."""

    current: str | None = None
    hold: bool = False
    last_storage_id: int | None = None  # the newest record's; intents older than it are settled
    intents: list[TagIntent] = Field(default_factory=list)


class TagWrite(Model):
    """What one write of the floating tag found: the re-read
    after the PUT, and the PUT's error if it raised."""

    target: str
    after: str | None
    put_error: str = ""


class TagNotMoved(LockstepError):
    """The PUT failed and the re-read shows the tag is not at the target: nothing was recorded."""


def unrecorded_moves(state: LogState, found: str | None, *, recorder: str) -> list[TagMove]:
    """The records (oldest first) that make the log end where the registry is (`found`); none when
    they agree. A logged intent that targets `found` is the move a run made and did not record (it
    died, or lost its connection): it is recorded as that run's move. Anything else is a move made
    outside lockstep, recorded as `observed` with the hold it found (a hand move releases nothing).
    """
    if found == state.current:
        return []
    intent = next((i for i in state.intents if i.to_digest == found), None)  # newest first
    if intent is None:
        how = (
            "the tag was there before lockstep's first record"
            if state.last_storage_id is None
            else "lockstep did not make this move (someone moved the tag by hand, e.g. `crane tag`)"
        )
        return [
            TagMove(
                action="observed",
                from_digest=state.current,
                to_digest=found,
                hold=state.hold,
                recorded=(
                    f"recorded by {recorder}: the registry had it at {found or 'nothing'}; {how}"
                ),
            )
        ]
    moves: list[TagMove] = []
    # the run saw an outside move the log had not recorded yet
    if intent.from_digest != state.current:
        moves.append(
            TagMove(
                action="observed",
                from_digest=state.current,
                to_digest=intent.from_digest,
                hold=state.hold,
                recorded=f"recorded by {recorder}: run {intent.run_id} found the tag "
                f"at {intent.from_digest or 'nothing'}, a state lockstep did not make",
            )
        )
    moves.append(
        TagMove(
            action=intent.action,
            from_digest=intent.from_digest,
            to_digest=found,
            build=intent.build,
            hold=intent.hold,
            recorded=f"recorded by {recorder} after run {intent.run_id}, which made "
            "this move, ended without recording it (it died between its PUT and its record)",
        )
    )
    return moves


def records_after_write(move: TagMove, write: TagWrite, *, tag: str) -> list[TagMove]:
    """The records (oldest first) for `move` once its PUT is done, decided by the re-read.

    The PUT raised but the tag is at the target: the registry applied it (e.g. a 500 after storing)
    and the move is recorded, saying so. The PUT raised and the tag is elsewhere: TagNotMoved,
    nothing is recorded. The PUT succeeded but the tag is already at another digest: our move, then
    that outside move, so the log ends where the registry is.
    """
    if write.put_error:
        if write.after != move.to_digest:
            raise TagNotMoved(
                f"the PUT of :{tag} -> {move.to_digest} failed ({write.put_error}) and :{tag} is "
                "at "
                f"{write.after or 'nothing'}: the move did not happen and nothing was recorded. "
                "Check the "
                "registry, then run the job again (its intent stays logged; floating_tag_watch "
                "records the "
                "move should the registry apply it late)"
            )
        note = (
            f"the registry answered the PUT with an error ({write.put_error}) but applied it: "
            "the re-read "
            f"shows :{tag} at {move.to_digest}"
        )
        return [noted(move, note)]
    if write.after == move.to_digest:
        return [move]
    note = (
        f"the re-read right after this write found :{tag} at {write.after or 'nothing'}: someone "
        "moved it "
        "again outside lockstep (recorded next)"
    )
    outside = TagMove(
        action="observed",
        from_digest=move.to_digest,
        to_digest=write.after,
        hold=move.hold,
        recorded=f"seen by the re-read after lockstep's {move.action} to {move.to_digest}: "
        "lockstep did "
        "not make this move",
    )
    return [noted(move, note), outside]


def noted(move: TagMove, note: str) -> TagMove:
    """`move` with `note` added to what its record says about how it was recorded."""
    return move.model_copy(
        update={"recorded": f"{move.recorded}; {note}" if move.recorded else note}
    )


def log_disagreement(
    moves_oldest_first: Sequence[TagMove], registry_digest: str | None
) -> str | None:
    """Why the log is not a true account of the tag, or None: each record must start where the one
    before it ended (a record whose from-digest is stale means a writer raced another), and the
    newest must end where the registry is."""
    previous: TagMove | None = None
    for index, move in enumerate(moves_oldest_first):
        if previous is not None and move.from_digest != previous.to_digest:
            return (
                f"record {index} ({move.action} {move.from_digest} -> {move.to_digest}) starts at "
                f"{move.from_digest or 'nothing'}, but record {index - 1} left the tag at "
                f"{previous.to_digest or 'nothing'}"
            )
        previous = move
    last = previous.to_digest if previous else None
    if moves_oldest_first and last != registry_digest:
        return (
            f"the log ends at {last or 'nothing'}, but the registry has "
            f"{registry_digest or 'nothing'}"
        )
    return None
