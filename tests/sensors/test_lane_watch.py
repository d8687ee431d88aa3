"""lane_watch_sensor's pieces without a sandbox: what
one node's inspect answer becomes, the hash the cursor
holds, the observation's metadata, and how lockstep/status
reads that observation against the lane record."""

from __future__ import annotations

import json
from types import SimpleNamespace

import dagster as dg
import pytest

from jovian_assets import lane as lane_code
from jovian_assets.keys import LANE
from jovian_assets.lane import lane_record
from jovian_assets.models import ServedImage
from lockstep.status_model import (
    ConsumerLock,
    LaneFacts,
    Status,
    TpuFacts,
    mismatch_warnings,
    render,
)
from resources.site.jovian import LaneSection
from resources.spark import RunResult, SparkError, SparkNodes, Unreachable
from sensors.lane_watch import container_name, live_observation, seen_hash, seen_on, watch
from tpu_assets.status import lane_facts

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
SITE = SimpleNamespace(
    secret_env_names=list, jovian=SimpleNamespace(lane=SimpleNamespace(name="glm53-2x"))
)


def lane_section() -> LaneSection:
    return LaneSection.model_validate(
        {
            "name": "glm53-2x",
            "nodes": ["spark-a", "spark-b"],
            "served_model": "m",
            "serve_command": [
                "vllm",
                "serve",
                "{tag}",
                "--served-model-name",
                "{model}",
                "--port",
                "{port}",
            ],
        }
    )


def inspect_doc(image: str = A, status: str = "running", code: int = 0) -> bytes:
    return json.dumps(
        [
            {
                "Id": "c" * 64,
                "Name": "/lockstep-glm53-2x",
                "Image": image,
                "State": {
                    "Status": status,
                    "ExitCode": code,
                    "StartedAt": "2026-12-01T15:38:21.3Z",
                },
                "Config": {
                    "Image": "jovian-judgement:r28-glm53",
                    "Labels": {"lockstep.rev": "r28"},
                },
            }
        ]
    ).encode()


class FakeSpark:
    """SparkNodes.run's contract: a result for any exit
    code, a SparkError when the node cannot be reached."""

    def __init__(self, answer: RunResult | SparkError) -> None:
        self.answer, self.argv = answer, None

    def run(self, *, node: str, argv: list[str], timeout_s: float | None = None) -> RunResult:
        self.argv = argv
        assert timeout_s is not None and timeout_s <= 20
        if isinstance(self.answer, SparkError):
            raise self.answer
        return self.answer


def result(code: int, stdout: bytes = b"", stderr: bytes = b"") -> RunResult:
    return RunResult(
        node="spark-b",
        where="local:x",
        argv=[],
        exit_code=code,
        stdout=stdout,
        stderr=stderr,
        duration_s=0.1,
    )


def seen(answer: RunResult | SparkError) -> tuple[str | None, str]:
    spark = FakeSpark(answer)
    out = seen_on(spark, SITE, lane_section(), "spark-b")  # type: ignore[arg-type]
    assert spark.argv == ["docker", "container", "inspect", "lockstep-glm53-2x"]
    return out


def test_one_nodes_inspect_answer_becomes_its_image_id_or_why_it_has_none() -> None:
    assert container_name(lane_section()) == lane_code.container_name(lane_section())
    assert seen(result(0, inspect_doc())) == (A, "")
    assert seen(result(0, inspect_doc(status="exited", code=137))) == (
        None,
        "container lockstep-glm53-2x is exited (exit code 137)",
    )
    assert seen(result(1, stderr=b"Error: No such container: lockstep-glm53-2x\n")) == (
        None,
        "no container lockstep-glm53-2x",
    )
    # Unreachable is a fact of the tick, never an exception out of it.
    image, why = seen(
        Unreachable("the connection keeps dropping", node="spark-b", where="b@host:22")
    )
    assert image is None and why.startswith(
        "unreachable: spark node spark-b (b@host:22): the connection keeps"
    )
    gone = SparkNodes(
        nodes=[
            {
                "name": "spark-b",
                "transport": "local",
                "root": "/nonexistent/spark-b",
                "roles": ["lane"],
            }
        ],
        known_hosts="/nonexistent/known_hosts",
    )
    image, why = seen_on(gone, SITE, lane_section(), "spark-b")  # type: ignore[arg-type]
    assert image is None and why.startswith(
        "unreachable: spark node spark-b (local:/nonexistent/spark-b): the node's root"
    )
    # What the node answers is untrusted: checked by parse_container, and cut short.
    image, why = seen(result(0, inspect_doc(image="--privileged " + "x" * 5000)))
    assert image is None and why.startswith("unreadable: spark-b: container") and len(why) <= 300
    image, why = seen(result(0, b"<html>" + b"y" * 5000))
    assert image is None and "not one container" in why and len(why) <= 300
    image, why = seen(result(125, stderr=b"Cannot connect to the Docker daemon " + b"z" * 5000))
    assert image is None and why.startswith(
        "unreadable: docker container inspect lockstep-glm53-2x exited 125"
    )
    assert len(why) <= 300


def test_the_hash_changes_with_what_was_seen_and_with_the_newest_lane_record_only() -> None:
    answers = {"spark-a": (A, ""), "spark-b": (None, "no container lockstep-glm53-2x")}
    live, why = watch(["spark-a", "spark-b"], answers.__getitem__)
    assert live == {"spark-a": A, "spark-b": None} and why == {
        "spark-b": "no container lockstep-glm53-2x"
    }
    base = seen_hash("glm53-2x", live, why, 7)
    # order is not a change
    assert seen_hash("glm53-2x", dict(reversed(live.items())), why, 7) == base
    assert seen_hash("glm53-2x", {**live, "spark-b": B}, {}, 7) != base
    assert (
        seen_hash(
            "glm53-2x", live, {"spark-b": "container lockstep-glm53-2x is exited (exit code 0)"}, 7
        )
        != base
    )
    assert seen_hash("glm53-2x", live, why, 8) != base  # a new boot: the next tick records again


def test_the_observation_holds_the_nodes_as_json_and_who_saw_them() -> None:
    event = live_observation(
        lane_section(), {"spark-a": A, "spark-b": None}, {"spark-b": "unreachable: x"}, "h" * 32
    )
    assert event.asset_key == LANE
    m = {k: getattr(v, "value", getattr(v, "data", v)) for k, v in event.metadata.items()}
    assert m["live_nodes"] == {"spark-a": A, "spark-b": None} and m["live_why"] == {
        "spark-b": "unreachable: x"
    }
    assert (m["observed_by"], m["container"], m["lane"], m["seen_hash"]) == (
        "lane_watch_sensor",
        "lockstep-glm53-2x",
        "glm53-2x",
        "h" * 32,
    )
    assert m["summary"].startswith("1 of 2 nodes run a container; spark-b: unreachable: x")


def observe(
    instance: dg.DagsterInstance, live: object, why: object = None, by: str = "lane_watch_sensor"
) -> None:
    instance.report_runless_asset_event(
        dg.AssetObservation(
            asset_key=LANE,
            metadata={
                "live_nodes": dg.MetadataValue.json(live),
                "live_why": dg.MetadataValue.json(why or {}),  # type: ignore[arg-type]
                "container": "lockstep-glm53-2x",
                "observed_by": by,
            },
        )
    )


def boot(instance: dg.DagsterInstance, image_id: str) -> None:
    site = SimpleNamespace(secret_env_names=list)
    instance.report_runless_asset_event(
        lane_record(
            site,
            action="boot",
            now=ServedImage(
                rev="r28", tag="t:r28", image_id=image_id, container="lockstep-glm53-2x"
            ),  # type: ignore[arg-type]
            nodes={"spark-a": image_id, "spark-b": image_id},
            reason="booted",
            before=None,
        )
    )


def test_status_reads_the_nodes_live_only_from_an_observation_newer_than_the_lane_record() -> None:
    with dg.instance_for_test() as instance:
        observe(instance, {"spark-a": B, "spark-b": B})  # before the boot: the record is newer
        boot(instance, A)
        (facts,) = lane_facts(SITE, instance)  # type: ignore[arg-type]
        assert not facts.live and facts.nodes == {"spark-a": A, "spark-b": A}

        observe(
            instance,
            {"spark-a": A, "spark-b": B, "spark-c": None},
            {"spark-c": "unreachable: spark node spark-c: no route"},
        )
        (facts,) = lane_facts(SITE, instance)  # type: ignore[arg-type]
        assert facts.live and facts.live_at is not None and facts.container == "lockstep-glm53-2x"
        assert facts.nodes == {"spark-a": A, "spark-b": B} and facts.idle == {}
        assert facts.unread == {"spark-c": "unreachable: spark node spark-c: no route"}

        observe(
            instance,
            {"spark-a": A, "spark-b": None},
            {"spark-b": "container lockstep-glm53-2x is exited (exit code 1)"},
        )
        (facts,) = lane_facts(SITE, instance)  # type: ignore[arg-type]
        assert facts.nodes == {"spark-a": A} and facts.idle == {
            "spark-b": "container lockstep-glm53-2x is exited (exit code 1)"
        }

        # Not the sensor's, or not its shape: the record stands.
        for live, by in (
            ({"spark-a": B}, "someone"),
            ({"spark-a": 7}, "lane_watch_sensor"),
            ("nodes", "lane_watch_sensor"),
        ):
            observe(instance, live, by=by)
            (facts,) = lane_facts(SITE, instance)  # type: ignore[arg-type]
            assert not facts.live and facts.nodes == {"spark-a": A, "spark-b": A}


@pytest.mark.parametrize("action", ["boot", "restore", "stop"])
def test_a_node_running_no_container_is_a_warning_while_the_lane_should_serve(action: str) -> None:
    tpu = TpuFacts(image="r/x", tag="tpu", digest=None)
    consumer = ConsumerLock(branch="main", head=None, harbor_commit=None)
    lane = LaneFacts(
        name="glm53-2x",
        action=action,
        rev="r28",
        expected_image_id=A,
        nodes={"spark-a": A, "spark-c": B},
        live=True,
        live_at=1_700_000_000.0,
        container="lockstep-glm53-2x",
        idle={"spark-b": "no container lockstep-glm53-2x"},
        unread={"spark-d": "unreachable: x"},
    )
    warnings = mismatch_warnings(tpu, consumer, [lane])
    idle = (
        "lane glm53-2x: node spark-b runs no container lockstep-glm53-2x (no container "
        "lockstep-glm53-2x, "
        "seen 2023-11-14T22:13:20Z)"
    )
    other = (
        "lane glm53-2x: node spark-c serves image sha256:bbbbbbbbbbbb, not r28's distributed "
        "image sha256:aaaaaaaaaaaa"
    )
    assert [w.split(": the lane")[0] for w in warnings] == ([idle] if action != "stop" else []) + [
        other
    ]
    text = render(
        Status(
            as_of=1_700_000_000.0,
            tpu=tpu,
            consumer=consumer,
            tag_hold={"held": False},
            harbor_hold={"held": False},
            lanes=[lane],
            warnings=warnings,
        ),  # type: ignore[arg-type]
        now=1_700_000_060.0,
    )
    assert (
        "node image IDs read live from the nodes at 2023-11-14T22:13:20Z (lane_watch_sensor)"
        in text
    )
    assert (
        "  spark-b: no container  <- no container lockstep-glm53-2x" in text
        and "  spark-d: unknown (unreachable: x)" in text
    )
    assert "  spark-c: sha256:bbbbbbbbbbbb  <- MISMATCH" in text
