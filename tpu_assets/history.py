"""The verified and promoted history, read back from the Dagster instance's event log.

These records are the audit trail a rollback is chosen from: nothing else is kept on the side.
"""

from __future__ import annotations

import dagster as dg

from tpu_assets.rollback import TagMove, VerifiedBuild

VERIFIED_IMAGE = dg.AssetKey(["tpu", "verified_image"])
FLOATING_TAG = dg.AssetKey(["tpu", "floating_tag"])
_PAGE = 500


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


def _meta(record: dg.EventLogRecord) -> dict[str, object]:
    mat = record.asset_materialization
    assert mat is not None
    return {k: getattr(v, "value", None) for k, v in mat.metadata.items()}


def verified_history(instance: dg.DagsterInstance) -> list[VerifiedBuild]:
    builds = []
    for r in _records(instance, VERIFIED_IMAGE):
        m = _meta(r)
        builds.append(VerifiedBuild(build=r.partition_key or "", digest=str(m["digest"]),
                                    harbor_commit=str(m["harbor_commit"]), verified_at=r.timestamp))
    return builds


def tag_history(instance: dg.DagsterInstance) -> list[TagMove]:
    moves = []
    for r in _records(instance, FLOATING_TAG):
        m = _meta(r)
        moves.append(TagMove(action=str(m["action"]), from_digest=str(m["from_digest"]) or None,  # type: ignore[arg-type]
                             to_digest=str(m["to_digest"]) or None, build=str(m.get("build") or "") or None,
                             hold=bool(m["hold"]), at=r.timestamp))
    return moves
