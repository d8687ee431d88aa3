"""The verified and promoted history, read back from (and written to) the Dagster instance's event log.

These records are the audit trail a rollback is chosen from: nothing else is kept on the side. The
promotion log is `tpu/floating_tag`'s materializations; the intent a run logs before it writes the
registry is an observation of the same asset. Writers and readers of those records live here, so the
metadata keys are spelled in one place.
"""

from __future__ import annotations

import dagster as dg

from resources.links import commit_entries, digest_entries
from resources.site import SiteConfig
from tpu_assets.rollback import TagMove, VerifiedBuild
from tpu_assets.tag_log import LogState, TagIntent

VERIFIED_IMAGE = dg.AssetKey(["tpu", "verified_image"])
FLOATING_TAG = dg.AssetKey(["tpu", "floating_tag"])
_PAGE = 500
# An intent observation says so in its metadata: it is not a move, and must never be read as one.
RECORD_KIND = "lockstep_record"
INTENT = "intent"


def _records(instance: dg.DagsterInstance, key: dg.AssetKey) -> list[dg.EventLogRecord]:
    """Every materialization of `key`, newest first."""
    out: list[dg.EventLogRecord] = []
    cursor = None
    while True:
        page = instance.fetch_materializations(key, limit=_PAGE, cursor=cursor)
        out.extend(page.records)
        if not page.has_more:
            return out
        cursor = page.cursor


def _meta(event: dg.AssetMaterialization | dg.AssetObservation | None) -> dict[str, object]:
    assert event is not None
    return {k: getattr(v, "value", None) for k, v in event.metadata.items()}


def verified_history(instance: dg.DagsterInstance) -> list[VerifiedBuild]:
    builds = []
    for r in _records(instance, VERIFIED_IMAGE):
        m = _meta(r.asset_materialization)
        builds.append(VerifiedBuild(build=r.partition_key or "", digest=str(m["digest"]),
                                    harbor_commit=str(m["harbor_commit"]), verified_at=r.timestamp))
    return builds


def _move(record: dg.EventLogRecord) -> TagMove:
    m = _meta(record.asset_materialization)
    return TagMove(action=str(m["action"]), from_digest=str(m.get("from_digest") or "") or None,  # type: ignore[arg-type]
                   to_digest=str(m.get("to_digest") or "") or None, build=str(m.get("build") or "") or None,
                   hold=bool(m.get("hold")), recorded=str(m.get("recorded") or ""), at=record.timestamp)


def tag_history(instance: dg.DagsterInstance) -> list[TagMove]:
    """Every move of the floating tag, newest first: lockstep's own and the `observed` ones."""
    return [_move(r) for r in _records(instance, FLOATING_TAG)]


def log_state(instance: dg.DagsterInstance) -> LogState:
    """The log's newest record and the intents logged after it: two small reads, fit for a sensor tick."""
    (latest, *_) = instance.fetch_materializations(FLOATING_TAG, limit=1).records or [None]
    state = LogState()
    if latest is not None:
        move = _move(latest)
        state = LogState(current=move.to_digest, hold=move.hold, last_storage_id=latest.storage_id)
    observed = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=FLOATING_TAG, after_storage_id=state.last_storage_id), limit=_PAGE
    ).records
    for r in observed:  # newest first
        m = _meta(r.asset_observation)
        if m.get(RECORD_KIND) != INTENT:
            continue
        state.intents.append(TagIntent(
            run_id=str(m["run_id"]), action=str(m["action"]), from_digest=str(m.get("from_digest") or "") or None,  # type: ignore[arg-type]
            to_digest=str(m["to_digest"]), build=str(m.get("build") or "") or None, hold=bool(m.get("hold")),
            at=r.timestamp,
        ))
    return state


def move_metadata(site: SiteConfig, move: TagMove, *, note: str = "", must_contain: str = "",
                  plan_text: str = "") -> dict[str, dg.MetadataValue]:
    """One promotion-log record as metadata (what `tag_history` reads back), with a summary for the UI."""
    tpu = site.tpu
    summary = f"**{move.action}** `:{tpu.floating_tag}` {move.from_digest or 'nothing'} -> {move.to_digest or 'nothing'}"
    if move.build:
        summary += f" (build {move.build[:8]})"
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
        "summary": dg.MetadataValue.md(summary),
    }


def move_materialization(site: SiteConfig, move: TagMove, **kwargs: str) -> dg.AssetMaterialization:
    """A record logged outside the asset's own output: by the watch, or a run recording a move it found."""
    return dg.AssetMaterialization(
        asset_key=FLOATING_TAG, metadata=move_metadata(site, move, **kwargs),
        tags={"dagster/data_version": move.to_digest or "none"},
    )


def intent_observation(site: SiteConfig, intent: TagIntent) -> dg.AssetObservation:
    """The move a run is about to write, logged before its PUT (not a move: `tag_history` skips it)."""
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
                f"{intent.from_digest or 'nothing'} -> {intent.to_digest}. Logged before the registry write; "
                "the move itself is the next materialization (or floating_tag_watch records it if the run died)."
            ),
        },
    )
