"""floating_tag_watch: one registry read per tick; a
state of the floating tag the log lacks is recorded.

(A tick that finds a difference reads the tag once more, under the lock, before it records.)

Two ways the registry gets ahead of the promotion log: a run that wrote the tag and died before its
record (its intent is logged), and a move made outside lockstep (someone's `crane tag`). Either way
the watch records the state it found as a materialization of `tpu/floating_tag`, so the one history
holds every state and a rollback plan starts from where the tag really is.

Why the watch writes its records itself (`instance.report_runless_asset_event`, inside the
floating-tag lock) instead of returning them in `SensorResult(asset_events=...)`: Dagster 1.13.27
accepts an AssetMaterialization there and the daemon makes exactly that call, but only after the
evaluation has returned, i.e. after the lock is released. A promote run could then take the lock,
read a log without the watch's record, move the tag, and have the daemon's late write land after
its own, leaving the log's newest record wrong. Writing under the lock keeps every writer in turn.
"""

from __future__ import annotations

import dagster as dg

from resources.errors import LockstepError
from resources.registry import ImageRef, Registry
from resources.site.resource import SiteResource
from sensors.tick_resources import default_sensor_status, tick_budget
from tpu_assets.history import log_state, move_materialization
from tpu_assets.promotion import floating_tag_lock_name, served
from tpu_assets.tag_lock import TagLockTimeout, floating_tag_lock
from tpu_assets.tag_log import WATCH_NAME, unrecorded_moves


def build_floating_tag_watch(*, minimum_interval_seconds: int = 30) -> dg.SensorDefinition:
    @dg.sensor(
        name=WATCH_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_sensor_status(),
        description=(
            "Reads the floating tag's digest once per tick and compares it with the promotion log "
            "(tpu/floating_tag). When they differ it records the state it found: the move of a "
            "run that "
            "died after its write (from the run's logged intent), or an `observed` move made "
            "outside "
            "lockstep, with the hold unchanged. Unchanged: a skip reason naming the digest. "
            "Registry "
            "unreachable or a move in progress: a skip reason, nothing recorded. Starts no runs."
        ),
    )
    def floating_tag_watch(
        context: dg.SensorEvaluationContext, site: SiteResource, registry: Registry
    ) -> dg.SkipReason:
        with tick_budget(site):
            return _tick(context, site, registry)

    return floating_tag_watch


def _tick(
    context: dg.SensorEvaluationContext, site: SiteResource, registry: Registry
) -> dg.SkipReason:
    """One tick of floating_tag_watch, inside its budget."""
    try:
        cfg = site.config()
        repository, tag = ImageRef.parse(cfg.tpu.image).repository, cfg.tpu.floating_tag
        found = registry.resolve(repository=repository, reference=tag)
    except LockstepError as exc:
        return dg.SkipReason(f"cannot read the floating tag: {exc} (nothing recorded)")
    state = log_state(context.instance)
    if found == state.current:
        return dg.SkipReason(f":{tag} still at {found or 'nothing'}, as the promotion log says")
    try:
        # Try once: a writer holding the lock is mid-move and records its own result.
        with floating_tag_lock(
            context.instance, name=floating_tag_lock_name(cfg), timeout_s=0, holder=WATCH_NAME
        ):
            # Read both again under the lock: the run that
            # held it may have just recorded this very state.
            found = registry.resolve(repository=repository, reference=tag)
            state = log_state(context.instance)
            if found != state.current:  # about to record it: only a digest the registry serves
                served(registry, repository=repository, tag=tag, digest=found)
            moves = unrecorded_moves(state, found, recorder=WATCH_NAME)
            for move in moves:
                context.instance.report_runless_asset_event(move_materialization(cfg, move))
    except TagLockTimeout:
        return dg.SkipReason(
            f":{tag} is at {found or 'nothing'} and a lockstep move of it is in progress "
            "(the floating-tag lock is held): nothing recorded, the next tick looks again"
        )
    except LockstepError as exc:
        return dg.SkipReason(f"cannot read the floating tag: {exc} (nothing recorded)")
    if not moves:
        return dg.SkipReason(
            f":{tag} at {found or 'nothing'}: recorded meanwhile by the writer that moved it"
        )
    said = "; ".join(
        f"{m.action} {m.from_digest or 'nothing'} -> {m.to_digest or 'nothing'}" for m in moves
    )
    return dg.SkipReason(f"recorded in tpu/floating_tag: {said}")
