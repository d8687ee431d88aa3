"""lane_watch_sensor: each minute, what every lane node really runs under the lane's container name.

The jovian/lane records say what lockstep put on the lane (a boot writes every node with the image
ID wait_ready saw it run). A container someone replaced by hand, or one that died, changes no
record: this sensor reads each node's `docker container inspect lockstep-<lane>`
(jovian_assets/lane.py `parse_container`, which checks the JSON) and records what it saw as an
observation of `jovian/lane` (`live_nodes`: node -> image ID, or null with the reason in
`live_why`), only when it differs from what the previous tick saw. tpu_assets/status.py `lane_facts`
compares it with the rev's distributed image.

A node that cannot be reached is a fact ("unreachable: ..."), never a failed tick; every inspect's
timeout is cut to what is left of the site's [timeouts] sensor_tick_s (sensors/tick_resources.py).
"""

# No `from __future__ import annotations`: Dagster reads
# the sensor's resource annotations at definition time.

import hashlib
import json
from collections.abc import Callable, Mapping

import dagster as dg

from jovian_assets.keys import (
    LANE,
    LANE_WATCH_SENSOR,
    LIVE_NODES,
    LIVE_WHY,
    OBSERVED_BY,
    lane_container,
)
from resources.deadline import limit
from resources.errors import LockstepError
from resources.secrets import redact, secret_values
from resources.site.jovian import LaneSection
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from resources.spark import SparkNodes
from sensors.tick_resources import default_sensor_status, run_tick, site_config

INSPECT_S = 20.0  # one `docker container inspect`; less when the tick's budget has less left
_WHY_CHARS = 300
_MAX_NODES = 64  # the site's lane; a bound on what goes into metadata whatever the site says

NodeSeen = tuple[str | None, str]  # (image ID, why there is none)


def container_name(lane: LaneSection) -> str:
    # the name lane.py starts it under, without loading the lane code
    return lane_container(lane.name)


def seen_on(spark: SparkNodes, site: SiteConfig, lane: LaneSection, node: str) -> NodeSeen:
    """What `node` runs under the lane's container name:
    its image ID when running, else None and why."""
    from jovian_assets.lane import (  # the lane code only when a tick reads a node
        LaneBootFailed,
        parse_container,
    )

    name = container_name(lane)
    try:
        seconds, _ = limit(INSPECT_S, "docker container inspect")
        result = spark.run(
            node=node, argv=["docker", "container", "inspect", name], timeout_s=seconds
        )
        if result.exit_code != 0:
            if b"No such container" in result.stderr:
                return None, f"no container {name}"
            stderr = result.stderr.decode(errors="replace").strip()[-200:]
            return None, _said(
                site,
                f"unreadable: docker container inspect {name} exited {result.exit_code}: {stderr}",
            )
        found = parse_container(node, result.stdout)
    except LockstepError as exc:  # SparkError (unreachable, timed out) or a refused inspect answer
        kind = "unreadable" if isinstance(exc, LaneBootFailed) else "unreachable"
        return None, _said(site, f"{kind}: {exc}")
    if found.status != "running":
        return None, f"container {name} is {found.status[:40]} (exit code {found.exit_code})"
    return found.image_id, ""


def _said(site: SiteConfig, text: str) -> str:
    return redact(text, secret_values(site.secret_env_names()))[:_WHY_CHARS]


def watch(
    nodes: list[str], see: Callable[[str], NodeSeen]
) -> tuple[dict[str, str | None], dict[str, str]]:
    """(node -> image ID or None, node -> why for the None ones), every lane node read once."""
    live: dict[str, str | None] = {}
    why: dict[str, str] = {}
    for node in nodes[:_MAX_NODES]:
        image_id, reason = see(node)
        live[node] = image_id
        if image_id is None:
            why[node] = reason[:_WHY_CHARS] or "no image ID"
    return live, why


def seen_hash(
    lane: str, live: Mapping[str, str | None], why: Mapping[str, str], record: int | None
) -> str:
    """What a tick saw, as the cursor compares it: the
    nodes, and the lane record it stands against (a new
    boot makes the next tick record again, even when the nodes look as they did before it)."""
    doc = json.dumps(
        {"lane": lane, "live": dict(live), "why": dict(why), "record": record}, sort_keys=True
    )
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def live_observation(
    lane: LaneSection, live: Mapping[str, str | None], why: Mapping[str, str], digest: str
) -> dg.AssetObservation:
    running = sum(1 for v in live.values() if v)
    return dg.AssetObservation(
        asset_key=LANE,
        metadata={
            LIVE_NODES: dg.MetadataValue.json(dict(live)),
            LIVE_WHY: dg.MetadataValue.json(dict(why)),
            "container": dg.MetadataValue.text(container_name(lane)),
            "lane": dg.MetadataValue.text(lane.name),
            OBSERVED_BY: dg.MetadataValue.text(LANE_WATCH_SENSOR),
            "seen_hash": dg.MetadataValue.text(digest),
            "summary": dg.MetadataValue.text(
                f"{running} of {len(live)} nodes run a container"
                + "".join(f"; {n}: {w}" for n, w in sorted(why.items()))[:2000]
            ),
        },
    )


def _newest_record(instance: dg.DagsterInstance) -> int | None:
    records = instance.fetch_materializations(LANE, limit=1).records
    return records[0].storage_id if records else None


def build_lane_watch_sensor(*, minimum_interval_seconds: int = 60) -> dg.SensorDefinition:
    """The sensor, over the location's `site` and
    `spark` through Dagster's resource init (spark's key
    passphrase may be an EnvVar, which only that init resolves)."""

    @dg.sensor(
        name=LANE_WATCH_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_sensor_status(),
        description=(
            "Reads every lane node's serving container (`docker container inspect "
            "lockstep-<lane>`) each tick, "
            "inside the site's [timeouts] sensor_tick_s, and records what each node runs as an "
            "observation of "
            "jovian/lane (`live_nodes`: node -> image ID, null when no container runs or the "
            "node is unreachable, "
            "with why) only when it changed. lockstep/status compares it with the rev's "
            "distributed image. "
            "Starts no runs."
        ),
    )
    def lane_watch_sensor(
        context: dg.SensorEvaluationContext, site: SiteResource, spark: SparkNodes
    ) -> dg.SensorResult:
        return run_tick(site, lambda: _tick(context, site, spark))

    def _tick(
        context: dg.SensorEvaluationContext, site: SiteResource, spark: SparkNodes
    ) -> dg.SensorResult:
        cfg = site_config(site)
        lane = cfg.jovian.lane if cfg.jovian else None
        if lane is None:
            return dg.SensorResult(skip_reason="the site has no [jovian.lane]: no lane to watch")
        live, why = watch(list(lane.nodes), lambda node: seen_on(spark, cfg, lane, node))
        digest = seen_hash(lane.name, live, why, _newest_record(context.instance))
        if digest == context.cursor:
            return dg.SensorResult(
                skip_reason=f"lane {lane.name} unchanged: {len(live) - len(why)} of {len(live)} "
                "nodes run a container; nothing recorded"
            )
        return dg.SensorResult(
            cursor=digest, asset_events=[live_observation(lane, live, why, digest)]
        )

    return lane_watch_sensor
