"""The verified and promoted history, read back from
(and written to) the Dagster instance's event log.

These records are the audit trail a rollback is chosen from: nothing else is kept on the side. The
promotion log is `tpu/floating_tag`'s materializations; the intent a run logs before it writes the
registry is an observation of the same asset. Writers and readers of those records live here, so the
metadata keys are spelled in one place.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TypeVar, overload

import dagster as dg

from resources.links import commit_entries, digest_entries
from resources.site.schema import SiteConfig
from tpu_assets.keys import FLOATING_TAG, VERIFIED_IMAGE
from tpu_assets.partitions import tpu_builds
from tpu_assets.rollback import TagMove, VerifiedBuild
from tpu_assets.tag_log import LogState, TagIntent

_PAGE = 500
# A plan needs the newest record or two (where the tag
# is, what it was before): the first read is small.
FIRST_PAGE = 4
# A promote judges the newest verified build, and its changelog and attestation look up the build it
# moves the tag from, normally the one verified before it: two records (each costs its
# deserialization) instead of one, because with one the changelog's lookup of the current digest
# costs two more reads (its data-version index, then the
# next page). A rejected newest build reads on, page by page.
PROMOTE_FIRST = 2
# Dagster indexes this tag of every asset event: verified_image sets it to the digest, floating_tag
# to the digest a move left the tag at.
DATA_VERSION_TAG = "dagster/data_version"
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
T = TypeVar("T")
# An intent observation says so in its metadata: it is not a move, and must never be read as one.
RECORD_KIND = "lockstep_record"
# Who acted on a move or a hold, as a run tag (a launcher
# that knows the person sets it) and metadata key.
BY_TAG = "lockstep/by"
USER_TAG = "dagster/user"
BY = "by"
MAX_BY = 100
INTENT = "intent"


class Newest(Sequence[T]):
    """A history newest first, read a page at a time and only as far back as it is used.

    The first page (small: a plan usually stops within the newest few records) is read when it is
    made (`eager=False`: when first used); later pages only go further back, so it is the history as
    of that first read.
    """

    def __init__(
        self,
        fetch: Callable[[int, str | None], dg.EventRecordsResult],
        convert: Callable[[dg.EventLogRecord], T],
        *,
        first: int = FIRST_PAGE,
        eager: bool = True,
    ) -> None:
        self._fetch, self._convert = fetch, convert
        self.records: list[dg.EventLogRecord] = []
        self._items: list[T] = []
        self._cursor: str | None = None
        self._limit, self._more, self._started = first, True, False
        if eager:
            self._read()

    def _read(self) -> None:
        self._started = True
        page = self._fetch(self._limit, self._cursor)
        self.records.extend(page.records)
        self._items.extend(self._convert(r) for r in page.records)
        self._cursor, self._more = page.cursor, page.has_more
        self._limit = min(self._limit * 4, _PAGE)

    def _upto(self, n: int | None) -> None:
        while self._more and (n is None or len(self._items) < n):
            self._read()

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            bounded = index.stop is not None and index.stop >= 0 and (index.start or 0) >= 0
            self._upto(index.stop if bounded else None)
        else:
            self._upto(index + 1 if index >= 0 else None)
        return self._items[index]

    def __len__(self) -> int:
        self._upto(None)
        return len(self._items)

    def __bool__(self) -> bool:
        if not self._started:
            self._read()
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        i = 0
        while True:
            self._upto(i + 1)
            if i >= len(self._items):
                return
            yield self._items[i]
            i += 1

    def __reversed__(self) -> Iterator[T]:
        self._upto(None)
        return reversed(self._items)


def _newest(
    instance: dg.DagsterInstance,
    records: dg.AssetRecordsFilter,
    convert: Callable[[dg.EventLogRecord], T],
    *,
    first: int = FIRST_PAGE,
) -> Newest[T]:
    return Newest(
        lambda limit, cursor: instance.fetch_materializations(records, limit=limit, cursor=cursor),
        convert,
        first=first,
    )


def _meta(event: dg.AssetMaterialization | dg.AssetObservation | None) -> dict[str, object]:
    assert event is not None
    return {k: getattr(v, "value", None) for k, v in event.metadata.items()}


def _verified(r: dg.EventLogRecord) -> VerifiedBuild:
    m = _meta(r.asset_materialization)
    return VerifiedBuild(
        build=r.partition_key or "",
        digest=str(m["digest"]),
        harbor_commit=str(m["harbor_commit"]),
        verified_at=r.timestamp,
    )


def _has_data_version(instance: dg.DagsterInstance, key: dg.AssetKey, digest: str) -> bool:
    """Whether any record of `key` has `digest` as its data version: one indexed read, no walk."""
    return bool(instance.get_event_tags_for_asset(key, filter_tags={DATA_VERSION_TAG: digest}))


class VerifiedHistory(Newest[VerifiedBuild]):
    """`tpu/verified_image` newest first (VerifiedRecords): a build's records are read by its
    partition, a digest by the data-version index, so a
    lookup costs the same at 10 records as at 10,000. The
    first page is twice the log's: builds are verified that are never promoted."""

    def __init__(self, instance: dg.DagsterInstance, *, first: int = 2 * FIRST_PAGE) -> None:
        self._instance = instance
        # Not read until used: a plan may look its builds
        # up by partition and never walk this at all.
        super().__init__(
            lambda limit, cursor: instance.fetch_materializations(
                VERIFIED_IMAGE, limit=limit, cursor=cursor
            ),
            _verified,
            first=first,
            eager=False,
        )

    def _of_builds(
        self, builds: Sequence[str], *, first: int = FIRST_PAGE
    ) -> Newest[VerifiedBuild]:
        return _newest(
            self._instance,
            dg.AssetRecordsFilter(asset_key=VERIFIED_IMAGE, asset_partitions=list(builds)),
            _verified,
            first=first,
        )

    def prefetch(self, builds: Sequence[str]) -> None:
        # The builds a plan asks about are mostly among the newest verified ones: one read of those.
        # Not one read by all their partitions: SQLite's planner answers that by walking every
        # record of the asset. A build not among them is read
        # alone, by its partition, when it is looked up.
        if builds and not self._started:
            self._read()

    def named(self, prefix: str) -> Iterator[VerifiedBuild]:
        if _FULL_SHA.match(prefix):
            # Read already (the newest part of the history): that is the build's newest record.
            if (hit := next((v for v in self._items if v.build == prefix), None)) is not None:
                yield hit
                # The rest only when asked for: past that record in the build's own, newest first.
                yield from itertools.islice(
                    itertools.dropwhile(lambda v: v != hit, self._of_builds([prefix])), 1, None
                )
                return
            builds = [prefix]
        # a person's short prefix: the partition names
        # (one read of short strings), then their records
        else:
            builds = [
                p
                for p in self._instance.get_dynamic_partitions(tpu_builds.name)
                if p.startswith(prefix)
            ]
        if builds:
            yield from self._of_builds(builds)

    def with_digest(self, digest: str, *, build: str | None = None) -> VerifiedBuild | None:
        def match(v: VerifiedBuild) -> bool:
            return v.digest == digest and (build is None or v.build == build)

        # What is read already is the newest part of the history: its first match is the newest one.
        if (found := next((v for v in self._items if match(v)), None)) is not None:
            return found
        if build is not None:
            return next((v for v in self._of_builds([build]) if match(v)), None)
        if not _has_data_version(self._instance, VERIFIED_IMAGE, digest):
            return None  # never verified (a hand move, a digest from before lockstep): no walk
        return next((v for v in self if match(v)), None)


def verified_history(
    instance: dg.DagsterInstance, *, first: int = 2 * FIRST_PAGE
) -> VerifiedHistory:
    """Every verified build, newest first, read only as
    far back as it is used (`first` records at first)."""
    return VerifiedHistory(instance, first=first)


def _move(record: dg.EventLogRecord) -> TagMove:
    m = _meta(record.asset_materialization)
    return TagMove(
        action=str(m["action"]),
        from_digest=str(m.get("from_digest") or "") or None,  # type: ignore[arg-type]
        to_digest=str(m.get("to_digest") or "") or None,
        build=str(m.get("build") or "") or None,
        hold=bool(m.get("hold")),
        recorded=str(m.get("recorded") or ""),
        at=record.timestamp,
    )


class TagHistory(Newest[TagMove]):
    """`tpu/floating_tag`'s moves newest first (MoveLog):
    the current state and hold are its first record."""

    def __init__(self, instance: dg.DagsterInstance, *, first: int = FIRST_PAGE) -> None:
        self._instance = instance
        super().__init__(
            lambda limit, cursor: instance.fetch_materializations(
                FLOATING_TAG, limit=limit, cursor=cursor
            ),
            _move,
            first=first,
        )

    def was_on_tag(self, digest: str) -> bool:
        # Each record's data version is the digest it left the tag at; the first record's
        # from-digest (the tag before lockstep) is recorded as an observed move's to-digest.
        return _has_data_version(self._instance, FLOATING_TAG, digest)


def tag_history(instance: dg.DagsterInstance, *, first: int = FIRST_PAGE) -> TagHistory:
    """Every move of the floating tag, newest first: lockstep's own and the `observed` ones, read
    only as far back as it is used (`first` records
    at first: 1 is where the tag is and its hold)."""
    return TagHistory(instance, first=first)


def read_ahead(instance: dg.DagsterInstance, reads: Callable[[], T]) -> Future[T]:
    """`reads` (event-log reads, and what they decide) started now; `.result()` is what it returned
    or raised. With a Postgres event log it runs on a thread of its own, so the caller's next read
    is in flight meanwhile (each read is mostly waiting on the server: a new connection, then the
    statement). Otherwise it runs here, at once: SQLite's storage holds one lock around every
    connection and answers in-process, so a second thread would only queue
    behind it. The caller must not touch what `reads`
    uses until it has the result."""
    from tpu_assets.tag_lock import postgres_url

    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(reads())
        except BaseException as exc:  # noqa: BLE001
            # handed to whoever asks for the result, as if it had run there
            done.set_exception(exc)

    if postgres_url(instance) is None:
        run()
    else:  # a daemon: a caller that fails before asking for the result does not wait for it
        threading.Thread(target=run, name="lockstep-read-ahead", daemon=True).start()
    return done


_UNREAD = object()


def log_state(
    instance: dg.DagsterInstance,
    log: TagHistory | None = None,
    *,
    registry_at: str | None | object = _UNREAD,
) -> LogState:
    """The log's newest record and the intents logged after it: two small reads, fit for a sensor
    tick (one when `log`, the history this run already read, gives the newest record).
    `registry_at`: where the writer asking has just read the tag; when
    the newest record says the same, the intents are
    not read (they cannot change what unrecorded_moves records then: nothing)."""
    if log is not None:
        latest = log.records[0] if log.records else None
    else:
        (latest, *_) = instance.fetch_materializations(FLOATING_TAG, limit=1).records or [None]
    state = LogState()
    if latest is not None:
        move = _move(latest)
        state = LogState(current=move.to_digest, hold=move.hold, last_storage_id=latest.storage_id)
    if registry_at is not _UNREAD and registry_at == state.current:
        return state
    observed = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=FLOATING_TAG, after_storage_id=state.last_storage_id),
        limit=_PAGE,
    ).records
    for r in observed:  # newest first
        m = _meta(r.asset_observation)
        if m.get(RECORD_KIND) != INTENT:
            continue
        state.intents.append(
            TagIntent(
                run_id=str(m["run_id"]),
                action=str(m["action"]),
                from_digest=str(m.get("from_digest") or "") or None,  # type: ignore[arg-type]
                to_digest=str(m["to_digest"]),
                build=str(m.get("build") or "") or None,
                hold=bool(m.get("hold")),
                at=r.timestamp,
            )
        )
    return state


def acted_by(configured: str, tags: Mapping[str, str]) -> str:
    """Who acts on the floating tag or the harbor hold: the config's `by`, else the run's
    `lockstep/by` tag, else its `dagster/user` tag (Dagster+
    sets it), else "". One printable line: it goes into
    alerts and the run log as written."""
    who = configured.strip() or tags.get(BY_TAG, "").strip() or tags.get(USER_TAG, "").strip()
    line = who.splitlines()[0] if who else ""
    return "".join(c if c.isprintable() else "?" for c in line)[:MAX_BY]


def move_metadata(
    site: SiteConfig,
    move: TagMove,
    *,
    note: str = "",
    must_contain: str = "",
    plan_text: str = "",
    by: str = "",
) -> dict[str, dg.MetadataValue]:
    """One promotion-log record as metadata (what
    `tag_history` reads back), with a summary for the UI.
    `by`: who acted (empty for a move nobody named, e.g. one the watch found)."""
    tpu = site.tpu
    summary = (
        f"**{move.action}** `:{tpu.floating_tag}` {move.from_digest or 'nothing'} -> "
        f"{move.to_digest or 'nothing'}"
    )
    if move.build:
        summary += f" (build {move.build[:8]})"
    if by:
        summary += f" by {by}"
    if move.hold:
        summary += "\n\nHOLD set: nothing promotes until `release_tpu_hold` runs."
    if move.recorded:
        summary += f"\n\n{move.recorded}"
    if plan_text:
        summary += f"\n\n```\n{plan_text}\n```"
    return {
        "action": dg.MetadataValue.text(move.action),
        **digest_entries(site.links, "from_digest", tpu.image, move.from_digest or ""),
        **digest_entries(site.links, "to_digest", tpu.image, move.to_digest or ""),
        **commit_entries(site.links, "build", tpu.consumer_repo, move.build or ""),
        "hold": dg.MetadataValue.bool(move.hold),
        "note": dg.MetadataValue.text(note),
        "must_contain": dg.MetadataValue.text(must_contain),
        "recorded": dg.MetadataValue.text(move.recorded),
        BY: dg.MetadataValue.text(by),
        "summary": dg.MetadataValue.md(summary),
    }


def move_materialization(site: SiteConfig, move: TagMove, **kwargs: str) -> dg.AssetMaterialization:
    """A record logged outside the asset's own output:
    by the watch, or a run recording a move it found."""
    return dg.AssetMaterialization(
        asset_key=FLOATING_TAG,
        metadata=move_metadata(site, move, **kwargs),
        tags={"dagster/data_version": move.to_digest or "none"},
    )


def intent_observation(site: SiteConfig, intent: TagIntent) -> dg.AssetObservation:
    """The move a run is about to write, logged before
    its PUT (not a move: `tag_history` skips it)."""
    tpu = site.tpu
    return dg.AssetObservation(
        asset_key=FLOATING_TAG,
        metadata={
            RECORD_KIND: dg.MetadataValue.text(INTENT),
            "run_id": dg.MetadataValue.text(intent.run_id),
            "action": dg.MetadataValue.text(intent.action),
            **digest_entries(site.links, "from_digest", tpu.image, intent.from_digest or ""),
            **digest_entries(site.links, "to_digest", tpu.image, intent.to_digest),
            **commit_entries(site.links, "build", tpu.consumer_repo, intent.build or ""),
            "hold": dg.MetadataValue.bool(intent.hold),
            "summary": dg.MetadataValue.md(
                f"**intent** of run `{intent.run_id}`: {intent.action} `:{tpu.floating_tag}` "
                f"{intent.from_digest or 'nothing'} -> {intent.to_digest}. Logged before the "
                "registry write; "
                "the move itself is the next materialization (or floating_tag_watch records it "
                "if the run died)."
            ),
        },
    )
