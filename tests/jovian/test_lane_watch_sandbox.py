"""lane_watch_sensor on the sandbox lane's real engines: a rev booted on both nodes, then one node's
container replaced by hand with another image under the lane's
name, then stopped. Each change is one observation of
jovian/lane, and lockstep/status (gather_status) names
the node; a tick that saw nothing new records nothing."""

# No `from __future__ import annotations`: Dagster reads
# the asset's context annotation at definition time.

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from jovian_assets.keys import DISTRIBUTED, LANE, LANE_SERVING
from jovian_assets.lane_assets import lane, lane_serving
from jovian_assets.node_build import Distribution
from jovian_assets.partitions import lab_revs
from lockstep.status_model import Status, render, short
from resources.site.load import load_site
from sandbox.engines import ENGINE_DIR, Engine
from sandbox.world import Sandbox, up
from sensors.lane_watch import build_lane_watch_sensor
from tests.conftest import sandbox_resources, stop_sandbox
from tests.support.jovian.lane import LANE_NODES, docker, tiny_image
from tests.support.runs import failure_message
from tpu_assets.status import gather_status

pytestmark = pytest.mark.heavy(120)

BASE = "lockstep-sandbox/python:3.11"  # the sandbox's offline base image: not what the lane serves
NAME = "lockstep-glm53-2x"
R28: dict[str, str] = {}


@dg.asset(key=DISTRIBUTED, partitions_def=lab_revs, group_name="jovian")
def distributed_image(context: dg.AssetExecutionContext) -> dg.Output[Distribution]:
    """What jovian/distributed_image records for the rev
    (its image ID in metadata, as the real one writes it):
    the fixture put the image on both lane nodes."""
    image_id = R28[context.partition_key]
    done = Distribution(
        tag=f"jovian-judgement:{context.partition_key}-glm53",
        image_id=image_id,
        nodes=dict.fromkeys(LANE_NODES, image_id),
        bytes=1,
    )
    return dg.Output(done, metadata={"image_id": dg.MetadataValue.text(image_id)})


class Lane:
    def __init__(
        self, sb: Sandbox, resources: dict[str, object], instance: dg.DagsterInstance
    ) -> None:
        self.sb, self.resources, self.instance = sb, resources, instance
        self.nodes = [sb.root / "nodes" / n for n in LANE_NODES]
        self.sensor = build_lane_watch_sensor()
        self.cursor: str | None = None

    def tick(self) -> dg.SensorResult:
        """One tick, its observation recorded as the daemon records it, its cursor kept."""
        with dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources={k: self.resources[k] for k in ("site", "spark")},
        ) as context:
            result = self.sensor(context)
        for event in result.asset_events or []:
            self.instance.report_runless_asset_event(event)  # type: ignore[arg-type]
        self.cursor = result.cursor or self.cursor
        return result

    def status(self) -> Status:
        site = load_site(self.sb.site_file)
        return gather_status(
            site,
            self.instance,
            self.resources["git"],
            self.resources["registry"],  # type: ignore[arg-type]
            now=datetime.now(UTC),
        )


def live(result: dg.SensorResult) -> tuple[dict[str, str | None], dict[str, str]]:
    (event,) = result.asset_events or []
    assert isinstance(event, dg.AssetObservation) and event.asset_key == LANE
    assert event.metadata["observed_by"].value == "lane_watch_sensor"  # type: ignore[attr-defined]
    return event.metadata["live_nodes"].value, event.metadata["live_why"].value  # type: ignore[attr-defined,return-value]


def lane_warnings(status: Status) -> list[str]:
    return [w for w in status.warnings if w.startswith("lane ")]


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Lane]:
    sb = up(tmp_path / "sandbox")
    try:
        resources = sandbox_resources(sb, tmp_path / "cache")
        nodes = [sb.root / "nodes" / n for n in LANE_NODES]
        for node in nodes:  # the base on both nodes: spark-b runs it by hand below
            engine = Engine(node / ENGINE_DIR)
            engine.start()
            engine.ensure_bases(["python"])
        R28["r28"] = tiny_image(nodes, tmp_path / "images", "r28")
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("lab_revs", ["r28"])
            yield Lane(sb, resources, instance)
    finally:
        stop_sandbox(sb)  # the lane's containers, the engines (by PID), the git daemon


def test_lane_watch_sees_a_container_replaced_by_hand_and_one_that_stopped(watched: Lane) -> None:
    w = watched
    booted = dg.materialize(
        [distributed_image, lane_serving, lane],
        selection=[DISTRIBUTED, LANE_SERVING],
        partition_key="r28",
        resources={k: w.resources[k] for k in ("site", "spark")},
        instance=w.instance,
        raise_on_error=False,
    )
    assert booted.success, failure_message(booted)
    r28 = R28["r28"]

    # Both nodes run the distributed image: recorded once,
    # no lane warning, the status says it read them live.
    first = w.tick()
    assert live(first) == ({"spark-a": r28, "spark-b": r28}, {})
    status = w.status()
    (facts,) = status.lanes
    assert (
        facts.live
        and facts.nodes == {"spark-a": r28, "spark-b": r28}
        and facts.expected_image_id == r28
    )
    assert lane_warnings(status) == []
    assert "read live from the nodes" in render(status, now=status.as_of)
    again = w.tick()
    assert not again.asset_events and "unchanged" in (again.skip_reason.skip_message or "")  # type: ignore[union-attr]

    # Someone replaces spark-b's container by hand: another image under the lane's container name.
    spark_b = w.nodes[1]
    assert docker(spark_b, "rm", "-f", NAME).returncode == 0
    other = docker(spark_b, "image", "inspect", "--format", "{{.Id}}", BASE).stdout.strip()
    assert other.startswith("sha256:") and other != r28
    started = docker(
        spark_b,
        "run",
        "-d",
        "--name",
        NAME,
        "--network",
        "host",
        BASE,
        "python3",
        "-c",
        "import time; time.sleep(600)",
    )
    assert started.returncode == 0, started.stderr
    replaced = w.tick()
    assert live(replaced) == ({"spark-a": r28, "spark-b": other}, {})
    assert lane_warnings(w.status()) == [
        (
            f"lane glm53-2x: node spark-b serves image {short(other)}, not r28's distributed "
            f"image {short(r28)}: "
            "the lane serves two builds at once"
        )
    ]

    # It stops: the node serves nothing, and the status says so by name.
    assert docker(spark_b, "stop", "-t", "1", NAME).returncode == 0
    stopped = w.tick()
    nodes, why = live(stopped)
    assert nodes == {"spark-a": r28, "spark-b": None} and why["spark-b"].startswith(
        f"container {NAME} is exited"
    )
    (warning,) = lane_warnings(status := w.status())
    assert warning.startswith(
        f"lane glm53-2x: node spark-b runs no container {NAME} (container {NAME} is exited"
    )
    assert status.lanes[0].nodes == {"spark-a": r28}
    assert not w.tick().asset_events  # still stopped: nothing new to record
