"""status_sensor: what is deployed where, recomputed each minute and recorded only when it changed.

Each tick gathers the status (tpu_assets/status.py: the instance's records, one registry resolve,
the consumer's uv.lock from git) and compares its hash with the newest recorded `lockstep/status`
observation's: equal, it skips saying so; different, it returns the new observation. So the event
log holds one record per change, and the newest one is what the webserver serves to `lockstep
status` (no dagster import, no database access on the reader's side). `refresh_status` (a job,
tpu_assets/jobs.py) records one at once, when a person will not wait for the next tick.
"""

# No `from __future__ import annotations`: Dagster reads
# the sensor's resource annotations at definition time.

import dagster as dg

from resources.git import GitRemotes
from resources.registry import Registry
from resources.site.resource import SiteResource
from sensors.tick_resources import default_sensor_status, for_ticks, run_tick, site_config
from tpu_assets.rejection import now_utc
from tpu_assets.status import fingerprint, gather_status, newest_status_hash, status_observation

STATUS_SENSOR = "status_sensor"


def build_status_sensor(*, git: object, minimum_interval_seconds: int = 60) -> dg.SensorDefinition:
    """The sensor over the location's `git` resource
    object (sensors/tick_resources.py); the site and the
    registry (its token is an EnvVar) through Dagster's
    resource init, as floating_tag_watch takes them."""
    git_res = for_ticks(git, GitRemotes, key="git")

    @dg.sensor(
        name=STATUS_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_sensor_status(),
        description=(
            "Recomputes what is deployed where (lockstep/status) each tick, inside the site's "
            "[timeouts] "
            "sensor_tick_s, and records it as an observation only when it differs from the "
            "newest recorded "
            "one (compared by hash, the time left out). Unchanged: a skip reason. Starts no runs."
        ),
    )
    def status_sensor(
        context: dg.SensorEvaluationContext, site: SiteResource, registry: Registry
    ) -> dg.SensorResult:
        return run_tick(site, lambda: _tick(context, site, registry))

    def _tick(
        context: dg.SensorEvaluationContext, site: SiteResource, registry: Registry
    ) -> dg.SensorResult:
        cfg = site_config(site)
        status = gather_status(cfg, context.instance, git_res, registry, now=now_utc())
        # Compared with the newest record, not a cursor: a refresh_status run records too.
        if fingerprint(status) == newest_status_hash(context.instance):
            return dg.SensorResult(
                skip_reason=(
                    f"unchanged ({len(status.warnings)} warnings, {len(status.errors)} unknown "
                    "facts): nothing recorded"
                )
            )
        return dg.SensorResult(asset_events=[status_observation(status)])

    return status_sensor
