"""A long promotion history, written straight into an instance's event log: the tests that hold
"a plan reads the same at 5 records as at 500" and bench/history_bench.py (10,000) share it.

The records are the ones lockstep writes (`move_metadata` for a move of the floating tag; a
verified_image record with its digest, harbor commit and provenance), data version included (Dagster
indexes it), stored in batches: one transaction for many events instead of one per event, which is
what makes 20,000 records fit in seconds. Postgres has a batch write of its own
(`store_event_batch`); for SQLite the same rows are written the way its `store_event` writes an
asset event to the index shard (the shard every asset query reads).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import dagster as dg
import sqlalchemy as db
from dagster._core.events import (
    AssetObservationData,
    DagsterEvent,
    DagsterEventType,
    StepMaterializationData,
)
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
from dagster._core.storage.event_log.schema import AssetEventTagsTable, SqlEventLogStorageTable
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster_shared.serdes import deserialize_value, serialize_value

from resources.links import commit_entries, digest_entries
from resources.site.schema import SiteConfig
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE, move_metadata
from tpu_assets.partitions import tpu_builds
from tpu_assets.rejection import rejection_observation
from tpu_assets.rollback import TagMove

SITE = {
    "site": {"name": "history"},
    "tpu": {
        "harbor_repo": "https://github.com/marin-community/harbor.git",
        "harbor_branch": "penfever/working",
        "consumer_repo": "https://github.com/open-thoughts/OpenThoughts-Agent.git",
        "consumer_branch": "penfever/working",
        "image": "ghcr.io/open-thoughts/openthoughts-agent",
    },
}
_BATCH = 1000


def site() -> SiteConfig:
    return SiteConfig.model_validate(SITE)


def build(i: int) -> str:
    return hashlib.sha1(b"build %d" % i).hexdigest()


def digest(i: int) -> str:
    return "sha256:" + hashlib.sha256(b"image %d" % i).hexdigest()


def harbor(i: int) -> str:
    return f"{i + 0xA0000:040x}"


@dataclass
class Filled:
    """What is in the instance: builds 0..n-1 verified
    (oldest first), moves promoting each in turn."""

    builds: list[str]
    digests: list[str]


def _entry(event: dg.AssetMaterialization | dg.AssetObservation, ts: float) -> EventLogEntry:
    if isinstance(event, dg.AssetMaterialization):
        kind, data = DagsterEventType.ASSET_MATERIALIZATION, StepMaterializationData(event)
    else:
        kind, data = DagsterEventType.ASSET_OBSERVATION, AssetObservationData(event)
    return EventLogEntry(
        error_info=None,
        level=logging.INFO,
        user_message="",
        run_id=RUNLESS_RUN_ID,
        timestamp=ts,
        dagster_event=DagsterEvent(
            event_type_value=kind.value, event_specific_data=data, job_name=RUNLESS_JOB_NAME
        ),
    )


def store(instance: dg.DagsterInstance, events: Iterable[EventLogEntry]) -> None:
    """Store asset events (all of one kind) in batches."""
    storage = instance.event_log_storage
    batch: list[EventLogEntry] = []
    for entry in events:
        batch.append(entry)
        if len(batch) == _BATCH:
            _store_batch(storage, batch)
            batch = []
    if batch:
        _store_batch(storage, batch)


def _store_batch(storage: object, batch: Sequence[EventLogEntry]) -> None:
    if isinstance(storage, SqliteEventLogStorage):
        with storage.index_transaction() as conn:
            ids = [
                conn.execute(storage.prepare_insert_event(entry)).inserted_primary_key[0]
                for entry in batch
            ]
            storage._store_asset_event_tags(conn, batch, ids)
            # the asset's latest event, as one write per event leaves it
            storage._store_asset_event(conn, batch[-1], ids[-1])
    else:
        storage.store_event_batch(batch)  # type: ignore[attr-defined]


def verified_record(cfg: SiteConfig, i: int) -> dg.AssetMaterialization:
    """A tpu/verified_image record shaped like image_assets.verified_image's."""
    tpu = cfg.tpu
    provenance = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": tpu.image, "digest": {"sha256": digest(i)[7:]}}],
        "predicate": {
            "buildDefinition": {
                "resolvedDependencies": [
                    {"uri": tpu.consumer_repo, "digest": {"gitCommit": build(i)}},
                    {"uri": tpu.harbor_repo, "digest": {"gitCommit": harbor(i)}},
                ]
            },
            "verification": {
                name: {"passed": True} for name in ("installed", "probes", "layers", "smoke")
            },
        },
    }
    return dg.AssetMaterialization(
        asset_key=VERIFIED_IMAGE,
        partition=build(i),
        metadata={
            **digest_entries(cfg.links, "digest", tpu.image, digest(i)),
            "image": dg.MetadataValue.text(f"{tpu.image}:tpu-{build(i)[:12]}"),
            **commit_entries(cfg.links, "harbor_commit", tpu.harbor_repo, harbor(i)),
            "harbor_version": dg.MetadataValue.text("0.4.2"),
            **commit_entries(cfg.links, "consumer_commit", tpu.consumer_repo, build(i)),
            "gitsha": dg.MetadataValue.text(build(i)[:12]),
            "provenance": dg.MetadataValue.json(provenance),
        },
        tags={"dagster/data_version": digest(i)},
    )


def promote_record(cfg: SiteConfig, i: int) -> dg.AssetMaterialization:
    """The record of promoting build i over build i-1 (over nothing for the first)."""
    move = TagMove(
        action="promote",
        from_digest=digest(i - 1) if i else None,
        to_digest=digest(i),
        build=build(i),
    )
    return dg.AssetMaterialization(
        asset_key=FLOATING_TAG,
        metadata=move_metadata(cfg, move, note="history fill"),
        tags={"dagster/data_version": digest(i)},
    )


def fill(
    instance: dg.DagsterInstance, cfg: SiteConfig, n: int, *, promotions: int | None = None
) -> Filled:
    """Builds 0..n-1 verified one after the other, each
    promoted in turn (the first `promotions` of them)."""
    # a day ago: well past any soak; whole seconds, see _templated
    now = float(int(time.time()) - 86400)
    builds = [build(i) for i in range(n)]
    instance.add_dynamic_partitions(tpu_builds.name, builds)
    _templated(instance, lambda i: verified_record(cfg, i), n, start=now, partitioned=True)
    _templated(
        instance,
        lambda i: promote_record(cfg, i),
        n if promotions is None else promotions,
        start=now + 0.5,
        partitioned=False,
    )
    return Filled(builds=builds, digests=[digest(i) for i in range(n)])


def _templated(
    instance: dg.DagsterInstance,
    record: Callable[[int], dg.AssetMaterialization],
    n: int,
    *,
    start: float,
    partitioned: bool,
) -> None:
    """Store record(0..n-1) at start+i: record(1) is serialized once and the others are that text
    with build 1's names replaced (serializing 20,000
    events is most of a naive fill's time). Record n-1
    is built for real and must come out the same, or the fill stops."""
    if n == 0:
        return
    storage = instance.event_log_storage
    first = _entry(record(1), start + 1)
    names = [
        (digest(1)[7:], lambda i: digest(i)[7:]),
        (digest(0)[7:], lambda i: digest(i - 1)[7:]),
        (build(1), build),
        (harbor(1), harbor),
        (digest(1)[:19], lambda i: digest(i)[:19]),
        (digest(0)[:19], lambda i: digest(i - 1)[:19]),
        (build(1)[:12], lambda i: build(i)[:12]),
        (build(1)[:8], lambda i: build(i)[:8]),
        (repr(start + 1), lambda i: repr(start + i)),
    ]
    template = serialize_value(first)
    for k, (old, _) in enumerate(names):  # placeholders first, so no value put in is replaced again
        template = template.replace(old, f"\x00{k}\x00")
    shape = _event_row(storage, first)
    rows = []
    for i in range(n):
        if i == 0:  # the first has no predecessor: written for real
            row_text = serialize_value(_entry(record(0), start))
        else:
            row_text = template
            for k, (_, new) in enumerate(names):
                row_text = row_text.replace(f"\x00{k}\x00", new(i))
        rows.append(
            {
                **shape,
                "event": row_text,
                "partition": build(i) if partitioned else None,
                "timestamp": shape["timestamp"] + timedelta(seconds=i - 1),
            }
        )
    last = _entry(record(n - 1), start + n - 1)
    if deserialize_value(rows[-1]["event"], EventLogEntry) != last:
        raise AssertionError(
            "the templated record differs from the one lockstep writes: fix history_fill.names"
        )
    key = first.get_dagster_event().asset_key
    assert key is not None
    with storage.index_transaction() as conn:  # type: ignore[attr-defined]
        for at in range(0, n, _BATCH):
            conn.execute(SqlEventLogStorageTable.insert(), rows[at : at + _BATCH])
        ids = [
            r[0]
            for r in conn.execute(
                db.select(SqlEventLogStorageTable.c.id)
                .where(SqlEventLogStorageTable.c.asset_key == key.to_string())
                .order_by(SqlEventLogStorageTable.c.id.desc())
                .limit(n)
            ).fetchall()
        ][::-1]
        conn.execute(
            AssetEventTagsTable.insert(),
            [
                {
                    "event_id": event_id,
                    "asset_key": key.to_string(),
                    "key": "dagster/data_version",
                    "value": digest(i),
                    "event_timestamp": row["timestamp"],
                }
                for i, (event_id, row) in enumerate(zip(ids, rows, strict=True))
            ],
        )
        storage._store_asset_event(conn, last, ids[-1])  # type: ignore[attr-defined]


def _event_row(storage: object, entry: EventLogEntry) -> dict[str, object]:
    return storage._event_to_row(entry)  # type: ignore[attr-defined]


def reject(instance: dg.DagsterInstance, cfg: SiteConfig, builds: Sequence[str]) -> None:
    """A rejection record on each of `builds`' partitions, as `lockstep reject` writes it."""
    now = time.time()
    store(
        instance,
        (
            _entry(
                rejection_observation(
                    cfg, build=b, rejected=True, by="history fill", reason="bench"
                ),
                now,
            )
            for b in builds
        ),
    )
