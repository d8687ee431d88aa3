"""harbor_branch_sensor: one ls-remote per tick; a new harbor tip requests exactly one re-lock."""

import dagster as dg

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.links import commit_entries
from resources.site.resource import SiteResource
from sensors.tick_resources import (
    WatchedBranch,
    default_sensor_status,
    for_ticks,
    moved_tip,
    run_tick,
    site_config,
)
from tpu_assets.harbor_hold import read_hold

HARBOR_COMMIT_TAG = "lockstep/harbor_commit"


def build_harbor_branch_sensor(
    *,
    job_name: str,
    observed: dg.AssetKey,
    lock_key: dg.AssetKey,
    site: object,
    git: object,
    minimum_interval_seconds: int = 30,
) -> dg.SensorDefinition:
    """The sensor over the location's `site` and `git` resource objects
    (sensors/tick_resources.py)."""
    site_res, git_res = (
        for_ticks(site, SiteResource, key="site"),
        for_ticks(git, GitRemotes, key="git"),
    )

    def _tick(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cfg = site_config(site_res)
        tpu = cfg.tpu
        watched = WatchedBranch(repo=tpu.harbor_repo, branch=tpu.harbor_branch)
        tip, where = moved_tip(git_res, watched, context.cursor), watched.where

        metadata = commit_entries(cfg.links, "commit", tpu.harbor_repo, tip)
        try:
            info = git_res.commit_info(url=tpu.harbor_repo, sha=tip)
            metadata |= {
                "summary": dg.MetadataValue.text(info.summary),
                "author": dg.MetadataValue.text(info.author),
                "committed_at": dg.MetadataValue.text(info.committed_at.isoformat()),
            }
        except LockstepError as exc:
            context.log.warning(f"commit info for {tip[:8]} unavailable: {exc}")
        seen = [
            dg.AssetObservation(
                asset_key=observed, metadata=metadata, tags={"dagster/data_version": tip}
            )
        ]
        hold = read_hold(context.instance, lock_key)
        if hold.held:
            # The tip is recorded and the cursor moves: the
            # release re-locks to whatever the tip is then.
            return dg.SensorResult(
                skip_reason=f"{where} moved to {tip}, but harbor is on hold ({hold.reason}): no "
                "re-lock until "
                "release_harbor_hold runs",
                cursor=tip,
                asset_events=seen,
            )
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"harbor:{tip}", tags={HARBOR_COMMIT_TAG: tip})],
            cursor=tip,
            asset_events=seen,
        )

    @dg.sensor(
        name="harbor_branch_sensor",
        job_name=job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_sensor_status(),
        description=(
            "Watches the harbor fork branch with one `git ls-remote` per tick. A new tip is "
            "recorded "
            f"as an observation of {observed.to_user_string()} and requests `{job_name}` with "
            "run key "
            "`harbor:<sha>`, so each commit is re-locked once. Unchanged: a skip reason naming "
            "the sha. "
            f"While a runtime rollback holds harbor ({lock_key.to_user_string()} metadata "
            "`harbor_hold`), new tips "
            "are recorded and nothing is requested: `release_harbor_hold` re-locks to the tip. "
            "Reads the "
            "location's `site` and `git` resources as configured (a tick initializes no resource)."
        ),
    )
    def harbor_branch_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return run_tick(site_res, lambda: _tick(context))

    return harbor_branch_sensor
