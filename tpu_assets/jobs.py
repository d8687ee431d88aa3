"""Every job of the tpu location: the asset jobs (by key: naming a job loads no asset code) and the
op jobs (reject/release a build, refresh the status), whose ops hold no logic of their own.

Only tpu_assets/definitions.py puts them in the location; sensors name them by `.name`.
"""

# No `from __future__ import annotations`: Dagster
# reads the op's context annotation at definition time.
import dagster as dg

from resources.git import GitRemotes
from resources.registry import Registry
from resources.site.resource import SiteResource
from tpu_assets.keys import FLOATING_TAG, HARBOR_LOCK, IMAGE, SMOKE, VERIFIED_IMAGE
from tpu_assets.promotion_policy import utc
from tpu_assets.rejection import now_utc, rejection_op
from tpu_assets.status import gather_status, status_observation

relock_harbor = dg.define_asset_job(
    "relock_harbor",
    selection=dg.AssetSelection.assets(HARBOR_LOCK),
    description=(
        "Re-lock harbor in the consumer repo (uv.lock + Dockerfile HARBOR_COMMIT), checked, "
        "pushed fast-forward."
    ),
)
release_harbor_hold = dg.define_asset_job(
    "release_harbor_hold",
    selection=dg.AssetSelection.assets(HARBOR_LOCK),
    config={"ops": {"tpu__harbor_lock": {"config": {"release_hold": True}}}},
    description=(
        "Release the harbor hold a runtime rollback set: follow the harbor branch again and "
        "re-lock to its tip "
        "(uv.lock + HARBOR_COMMIT, checked, pushed fast-forward)."
    ),
)
build_tpu = dg.define_asset_job(
    "build_tpu",
    selection=dg.AssetSelection.assets(IMAGE, SMOKE, VERIFIED_IMAGE),
    description=(
        "Build :tpu-<gitsha> on iris, verify the installed files, smoke it, record it as verified."
    ),
)


def _action_job(name: str, action: str, description: str):  # type: ignore[no-untyped-def]
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(FLOATING_TAG),
        config={"ops": {"tpu__floating_tag": {"config": {"action": action}}}},
        # Never retried by the daemon: a retried rollback would walk one build further back.
        tags={"dagster/max_retries": "0"},
        description=description,
    )


promote_tpu = _action_job(
    "promote_tpu",
    "promote",
    "Move the floating tag to a verified build (newest, or `build`), compare-and-swap.",
)
rollback_tpu = _action_job(
    "rollback_tpu",
    "rollback",
    "Move the floating tag back to a verified build that contains `must_contain` (or to "
    "`build`); refuses "
    "no-op targets and sets a hold. `scope`: image, runtime (pin harbor in uv.lock to the "
    "target's, hold the "
    "harbor sensor) or both; default both when the target bakes another harbor than the lock.",
)
release_tpu_hold = _action_job(
    "release_tpu_hold", "release_hold", "Release the hold a rollback set, so promotions can resume."
)


def _rejection_job(name: str, rejected: bool, description: str) -> dg.JobDefinition:
    @dg.job(name=name, description=description, tags={"dagster/max_retries": "0"})
    def job() -> None:
        rejection_op(rejected)()

    return job


reject_tpu_build = _rejection_job(
    "reject_tpu_build",
    True,
    "Reject one build (config: build, reason, by): nothing promotes it until it is released.",
)
release_tpu_build = _rejection_job(
    "release_tpu_build", False, "Undo reject_tpu_build for one build (config: build, by)."
)


@dg.op(
    name="record_status",
    description="Gather what is deployed where now and record it (lockstep/status).",
)
def refresh_status_op(
    context: dg.OpExecutionContext, site: SiteResource, git: GitRemotes, registry: Registry
) -> None:
    status = gather_status(
        site.config(), context.instance, git, registry, now=now_utc(), source="refresh_status"
    )
    context.log_event(status_observation(status))
    context.log.info(
        f"status as of {utc(status.as_of).isoformat()}: {len(status.warnings)} warnings, "
        f"{len(status.errors)} unknown facts"
    )


@dg.job(
    name="refresh_status",
    description=(
        "Record what is deployed where now (lockstep/status), without waiting for "
        "status_sensor's next tick."
    ),
)
def refresh_status() -> None:
    refresh_status_op()
