"""consumer_rebuild_sensor and auto_promote_sensor: rebuilds
only when base layers change; promotions never over a
hold, a rejection, a soak time or a freeze window."""

import dagster as dg

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.site.resource import SiteResource
from sensors.tick_resources import (
    WatchedBranch,
    default_sensor_status,
    for_ticks,
    moved_tip,
    run_tick,
    site_config,
    skipping,
)
from tpu_assets.history import tag_history
from tpu_assets.keys import VERIFIED_IMAGE
from tpu_assets.rebuild_policy import rebuild_reason
from tpu_assets.rejection import auto_promote_refusal, now_utc
from tpu_assets.rollback import current_state


def build_consumer_rebuild_sensor(
    *, job_name: str, partitions_def: dg.DynamicPartitionsDefinition, site: object, git: object
) -> dg.SensorDefinition:
    """The sensor over the location's `site` and `git` resource objects
    (sensors/tick_resources.py)."""
    site_res, git_res = (
        for_ticks(site, SiteResource, key="site"),
        for_ticks(git, GitRemotes, key="git"),
    )

    def _tick(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        tpu = site_config(site_res).tpu
        watched = WatchedBranch(repo=tpu.consumer_repo, branch=tpu.consumer_branch)
        tip, where = moved_tip(git_res, watched, context.cursor), watched.where
        if context.cursor is None:
            if context.instance.get_dynamic_partitions(partitions_def.name):
                return dg.SensorResult(
                    cursor=tip, skip_reason=f"first tick: watching {where} from {tip}"
                )
            reason: str | None = "first build for this site"
        else:
            paths = [tpu.dockerfile, tpu.build_script, "uv.lock"]
            try:
                old = {
                    p: git_res.show_file(url=tpu.consumer_repo, sha=context.cursor, path=p)
                    for p in paths
                }
                new = {p: git_res.show_file(url=tpu.consumer_repo, sha=tip, path=p) for p in paths}
            except LockstepError as exc:
                return dg.SensorResult(skip_reason=f"cannot read {where} at {tip[:8]}: {exc}")
            reason = rebuild_reason(
                old=old,
                new=new,
                dockerfile=tpu.dockerfile,
                build_script=tpu.build_script,
                package=tpu.harbor_package,
                rebuild_on_lock_change=tpu.rebuild_on_lock_change,
            )
        if reason is None:
            return dg.SensorResult(
                cursor=tip,
                skip_reason=(
                    f"{where} moved to {tip[:8]} without a base-layer change: no rebuild (the "
                    "lock and /app ship it)"
                ),
            )
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"build:{tip}",
                    partition_key=tip,
                    tags={"lockstep/rebuild_reason": reason[:200]},
                )
            ],
            dynamic_partitions_requests=[partitions_def.build_add_request([tip])],
            cursor=tip,
        )

    @dg.sensor(
        name="consumer_rebuild_sensor",
        job_name=job_name,
        minimum_interval_seconds=30,
        default_status=default_sensor_status(),
        description=(
            "Watches the consumer branch (one ls-remote per tick). When the Dockerfile outside the "
            "HARBOR_COMMIT line or the build script changed, adds the commit as a tpu_builds "
            "partition "
            "and requests a build. A lock-only move is NOT a rebuild (the lock ships harbor to "
            "workers) "
            "unless the site sets rebuild_on_lock_change. The very first tick builds once if "
            "nothing was ever built. "
            "Reads the location's `site` and `git` resources as configured (a tick initializes "
            "no resource)."
        ),
    )
    def consumer_rebuild_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return run_tick(site_res, lambda: _tick(context))

    return consumer_rebuild_sensor


def build_auto_promote_sensor(*, job_name: str) -> dg.SensorDefinition:
    @dg.sensor(
        name="auto_promote_sensor",
        job_name=job_name,
        minimum_interval_seconds=30,
        default_status=default_sensor_status(),
        description=(
            "Promotes each newly verified build when the site sets auto_promote = true — never "
            "while a "
            "rollback hold is set (release it with release_tpu_hold), never a rejected build, "
            "and only once "
            "[tpu.promotion] allows it: a build still soaking or a freeze window keeps the "
            "cursor, so a later "
            "tick promotes it when the rule lets it (automation never overrides a freeze). "
            "Cursor: the last "
            "verified_image event seen."
        ),
    )
    def auto_promote_sensor(
        context: dg.SensorEvaluationContext, site: SiteResource
    ) -> dg.SensorResult:
        return skipping(lambda: _tick(context, site))

    def _tick(context: dg.SensorEvaluationContext, site: SiteResource) -> dg.SensorResult:
        after = int(context.cursor) if context.cursor else None
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=VERIFIED_IMAGE, after_storage_id=after),
            limit=100,
            ascending=True,
        ).records
        if not records:
            return dg.SensorResult(skip_reason="no new verified build")
        cursor = str(records[-1].storage_id)
        newest = records[-1].partition_key
        # A skip keeps the cursor: the build is judged again once the file is fixed.
        tpu = site_config(site).tpu
        if not tpu.auto_promote:
            return dg.SensorResult(
                cursor=cursor,
                skip_reason="auto_promote is off in the site file: promote with promote_tpu",
            )
        if current_state(tag_history(context.instance))[1]:
            return dg.SensorResult(
                cursor=cursor,
                skip_reason=(
                    f"build {(newest or '?')[:8]} is verified, but the floating tag is on hold "
                    "after a rollback: "
                    "nothing promotes until release_tpu_hold"
                ),
            )
        if refused := auto_promote_refusal(
            context.instance, tpu.promotion, records[-1], now=now_utc()
        ):
            # A rejection is final for automation; soak and freeze
            # end, so the next ticks judge this build again.
            return dg.SensorResult(
                cursor=cursor if refused.rule == "reject" else None,
                skip_reason=(
                    f"build {(newest or '?')[:8]} is verified, but auto_promote may not promote "
                    f"it: {refused}"
                ),
            )
        return dg.SensorResult(
            cursor=cursor,
            run_requests=[
                dg.RunRequest(
                    run_key=f"promote:{newest}",
                    run_config={
                        "ops": {
                            "tpu__floating_tag": {
                                "config": {
                                    "action": "promote",
                                    "build": newest,
                                    "note": "auto_promote",
                                }
                            }
                        }
                    },
                    # who acted, in the log and the promotion alert
                    tags={"lockstep/by": "auto_promote_sensor"},
                )
            ],
        )

    return auto_promote_sensor
