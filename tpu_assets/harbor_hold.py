"""The harbor hold: after a runtime rollback, no
automation re-locks harbor until a person releases it.

The hold lives on `tpu/harbor_lock`'s materializations, beside the consumer commit it protects: the
runtime pin is a materialization of that asset (the lock's state lockstep pushed) with `harbor_hold`
true; `release_harbor_hold` records the re-lock to the tip with it false; an ordinary re-lock is
refused while it is set. The newest materialization says whether it is set: one read, fit for a
sensor tick.
"""

from __future__ import annotations

import dagster as dg

from resources.model import Model

HOLD = "harbor_hold"
HOLD_REASON = "harbor_hold_reason"
LOCK_ACTION = "lock_action"  # relock | runtime_pin | release_hold


class HarborHold(Model):
    held: bool
    reason: str = ""


def hold_entries(*, action: str, held: bool, reason: str) -> dict[str, dg.MetadataValue]:
    return {
        LOCK_ACTION: dg.MetadataValue.text(action),
        HOLD: dg.MetadataValue.bool(held),
        HOLD_REASON: dg.MetadataValue.text(reason),
    }


def read_hold(instance: dg.DagsterInstance, lock_key: dg.AssetKey) -> HarborHold:
    """Whether the newest `tpu/harbor_lock` materialization holds harbor where it is."""
    records = instance.fetch_materializations(lock_key, limit=1).records
    if not records or records[0].asset_materialization is None:
        return HarborHold(held=False)
    meta = records[0].asset_materialization.metadata
    held = getattr(meta.get(HOLD), "value", False)
    return HarborHold(
        held=bool(held), reason=str(getattr(meta.get(HOLD_REASON), "value", "") or "")
    )
