"""Booting a rev on the sandbox lane (jovian/lane_serving), putting the lane back
(restore_previous), the lane's serving history (jovian/lane), and docker's
container commands, on the lane nodes' real engines:
the rev images are real images whose `vllm` is the sandbox's model server
(sandbox/model_server.py)."""

import json
import shutil
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
import tomli_w

from jovian_assets.keys import DISTRIBUTED, LANE_SERVING
from jovian_assets.lane import (
    ENDPOINT,
    LaneBootFailed,
    lane_history,
    lists_model,
    parse_container,
    readiness_marks,
    restore_previous,
)
from jovian_assets.lane_assets import lane, lane_serving
from jovian_assets.models import LaneServing
from jovian_assets.node_build import Distribution
from jovian_assets.partitions import lab_revs
from resources.site.jovian import DEFAULT_READY_PATTERNS
from resources.site.load import load_site
from resources.site.resource import SiteResource
from resources.spark import SparkNodes
from sandbox.engines import ENGINE_DIR, Engine
from sandbox.world import Sandbox, up
from tests.conftest import sandbox_resources, stop_sandbox
from tests.support.jovian.lane import LANE_NODES, docker, tiny_image
from tests.support.runs import failure_message

FAST_COLD = (0.4, 0.2)  # for tests that are not about the cold start's length
GATE = dg.AssetKey(["jovian", "test_gate_failed"])

# -- readiness, pure -------------------------------------------------------------------------------

LOG = """\
2026-12-01T15:38:21.669297000Z INFO 12-01 15:38:21 [api_server.py] vLLM API server version 0.26.1rc0
2026-12-01T15:38:22.000000000Z INFO:     Application startup complete.
2026-12-01T15:48:23.662448000Z INFO 12-01 15:48:23 [kv_cache_utils.py] GPU KV cache size: 1,234,560 tokens
2026-12-01T15:53:24.665438000Z INFO:     Application startup complete.
"""  # noqa: E501


def test_readiness_lines_count_only_in_order_with_their_log_times() -> None:
    kv, startup = readiness_marks(LOG, DEFAULT_READY_PATTERNS)
    assert kv.value == "1,234,560" and kv.at == datetime(
        2026, 12, 1, 15, 48, 23, 662448, tzinfo=UTC
    )
    # The early startup line (before the KV line) is not this server's startup: the later one is.
    assert startup.at == datetime(2026, 12, 1, 15, 53, 24, 665438, tzinfo=UTC)
    assert readiness_marks(LOG.splitlines()[1] + "\n", DEFAULT_READY_PATTERNS) == []
    assert [
        m.value for m in readiness_marks("GPU KV cache size: 99 tokens\n", DEFAULT_READY_PATTERNS)
    ] == ["99"]


def test_endpoint_and_inspect_answers_are_validated() -> None:
    assert lists_model(
        b'{"object":"list","data":[{"id":"glm-5.3-flash","object":"model"}]}', "glm-5.3-flash"
    )
    assert not lists_model(b'{"data":[{"id":"other"}]}', "glm-5.3-flash")
    assert not lists_model(b"<html>502 Bad Gateway</html>", "glm-5.3-flash")
    with pytest.raises(LaneBootFailed, match="not one container"):
        parse_container("spark-a", b"[]")
    doc = {
        "Id": "c" * 64,
        "Name": "/lockstep-glm53-2x",
        "Image": "sha256:" + "a" * 64,
        "State": {
            "Status": "running",
            "ExitCode": 0,
            "StartedAt": "2026-12-01T15:38:21.376046000Z",
        },
        "Config": {
            "Image": "jovian-judgement:r28-glm53",
            "Labels": {
                "lockstep.rev": "r28; rm -rf /",
                "lockstep.tag": "jovian-judgement:r28-glm53",
            },
        },
    }
    found = parse_container("spark-a", json.dumps([doc]).encode())
    # a bad label is dropped
    assert (found.rev, found.tag, found.status) == (None, "jovian-judgement:r28-glm53", "running")
    odd = parse_container(
        "spark-a",
        json.dumps([{**doc, "Config": {"Image": "--privileged x", "Labels": None}}]).encode(),
    )
    # not a reference: the image ID stands in
    assert (odd.image_ref, odd.tag, odd.rev) == (doc["Image"], None, None)
    with pytest.raises(LaneBootFailed, match="not a sha256 image ID"):
        parse_container("spark-a", json.dumps([{**doc, "Image": "--privileged"}]).encode())


# -- the lane in the sandbox -----------------------------------------------------------------------


def set_lane(sb: Sandbox, **values: object) -> None:
    data = tomllib.loads(sb.site_file.read_text())
    data["jovian"]["lane"].update(values)
    sb.site_file.write_text(tomli_w.dumps(data))


DISTRIBUTIONS: dict[str, Distribution] = {}


@dg.asset(key=DISTRIBUTED, partitions_def=lab_revs, group_name="jovian")
def distributed_image(context: dg.AssetExecutionContext) -> Distribution:
    """What jovian/distributed_image recorded for the
    rev: the test put the images on the lane nodes."""
    return DISTRIBUTIONS[context.partition_key]


@dg.asset(key=GATE, partitions_def=lab_revs, group_name="jovian")
def gate_failed(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    spark: SparkNodes,
    lane_serving: LaneServing,
) -> None:
    """What jovian/bench_report does when the quality gate fails: the lane goes back."""
    restore_previous(context, spark, site.config(), lane_serving)


class World:
    """The sandbox lane with small rev images on both nodes' engines: built once per module, reset
    per test. `ids` are the good images of r27 and r28;
    `variants` are r28 images whose served model hangs
    before its KV-cache line or dies at start
    (sandbox/model_server.py reads its package's knobs)."""

    def __init__(self, sb: Sandbox, resources: dict[str, object], tmp: Path) -> None:
        self.sb, self.site_text = sb, sb.site_file.read_text()
        self.resources = {k: resources[k] for k in ("site", "spark")}
        self.nodes = [sb.root / "nodes" / n for n in LANE_NODES]
        Engine(self.nodes[0] / ENGINE_DIR).start()
        Engine(self.nodes[0] / ENGINE_DIR).ensure_bases(["python"])
        fast = f"cold_s = {list(FAST_COLD)}\n"
        self.ids = {rev: tiny_image(self.nodes, tmp, rev) for rev in ("r27", "r28")}
        self.variants = {
            "fast": tiny_image(self.nodes, tmp, "r28", fast),
            "hang": tiny_image(self.nodes, tmp, "r28", f'fault = "hang"\n{fast}'),
            "exit": tiny_image(self.nodes, tmp, "r28", f'fault = "exit"\n{fast}'),
        }
        self.instance: dg.DagsterInstance | None = None
        self.reset()

    def serve_as(self, rev: str, image_id: str) -> None:
        """The rev's tag on every lane node and its recorded distribution name `image_id`."""
        for node in self.nodes:
            assert docker(node, "tag", image_id, f"jovian-judgement:{rev}-glm53").returncode == 0
        DISTRIBUTIONS[rev] = Distribution(
            tag=f"jovian-judgement:{rev}-glm53",
            image_id=image_id,
            nodes=dict.fromkeys(LANE_NODES, image_id),
            bytes=1,
        )

    def reset(self) -> None:
        """No containers, empty JIT caches, the tags as built, the site as written."""
        for node in self.nodes:
            if ids := docker(node, "ps", "-aq").stdout.split():
                assert docker(node, "rm", "-f", *ids).returncode == 0
            shutil.rmtree(node / "home" / "sm121-cache", ignore_errors=True)
        for rev, image_id in self.ids.items():
            self.serve_as(rev, image_id)
        self.sb.site_file.write_text(self.site_text)

    def boot(self, rev: str, *, then_fail_gate: bool = False) -> dg.ExecuteInProcessResult:
        keys = [DISTRIBUTED, LANE_SERVING, *([GATE] if then_fail_gate else [])]
        return dg.materialize(
            [distributed_image, lane_serving, lane, gate_failed],
            selection=keys,
            partition_key=rev,
            resources=self.resources,
            instance=self.instance,
            raise_on_error=False,
        )

    def boot_invoked(self, rev: str) -> tuple[LaneServing | LaneBootFailed, list[str]]:
        """The lane_serving asset invoked directly (no
        run: a Dagster run costs seconds here); what it
        returned or raised, and the `jovian/lane` actions it logged."""
        with dg.build_asset_context(
            partition_key=rev, resources=self.resources, instance=self.instance
        ) as context:
            try:
                outcome: LaneServing | LaneBootFailed = lane_serving(
                    context, distributed_image=DISTRIBUTIONS[rev]
                ).value
            except LaneBootFailed as exc:
                outcome = exc
            return outcome, [
                str(e.metadata["action"].value)
                for e in context.op_execution_context.get_events()
                if isinstance(e, dg.AssetMaterialization)
            ]

    def container(self, node: int = 0) -> dict:
        result = docker(self.nodes[node], "container", "inspect", "lockstep-glm53-2x")
        assert result.returncode == 0, result.stderr
        (doc,) = json.loads(result.stdout)
        return doc


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    sb = up(tmp_path_factory.mktemp("lane") / "sandbox")
    w = World(
        sb,
        sandbox_resources(sb, tmp_path_factory.mktemp("cache")),
        tmp_path_factory.mktemp("images"),
    )
    yield w
    w.reset()
    stop_sandbox(sb)


@pytest.fixture
def world(built: World) -> Iterator[World]:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("lab_revs", ["r27", "r28"])
        built.instance = instance
        try:
            yield built
        finally:
            built.reset()


def served(result: dg.ExecuteInProcessResult) -> LaneServing:
    return result.asset_value(LANE_SERVING)


def test_cold_boot_then_warm_boot_then_a_failed_gate_brings_the_previous_image_back(
    world: World,
) -> None:
    first = world.boot("r27")
    assert first.success, failure_message(first)
    cold = served(first)
    assert (
        not cold.warm
        and cold.jit_warm == {"spark-a": False, "spark-b": False}
        and cold.previous is None
    )
    assert cold.image_id == world.ids["r27"] and cold.nodes == dict.fromkeys(
        LANE_NODES, world.ids["r27"]
    )
    assert list(cold.seconds_to) == [*DEFAULT_READY_PATTERNS, ENDPOINT]
    kv, startup = (
        cold.seconds_to[DEFAULT_READY_PATTERNS[0]],
        cold.seconds_to[DEFAULT_READY_PATTERNS[1]],
    )
    # the sandbox's cold start: 1.5 s to the KV line, +0.5 s
    assert 1.5 <= kv < startup <= cold.seconds_to[ENDPOINT]
    assert cold.budget_s == 60.0
    site = load_site(world.sb.site_file)
    assert (
        cold.base_url == f"http://127.0.0.1:{site.jovian.lane.serve_port}"
        and cold.bench_node == "spark-a"
    )  # type: ignore[union-attr]
    meta = first.get_asset_materialization_events()[-1].materialization.metadata
    assert meta["served_image_id"].value == world.ids["r27"] and meta["start"].value == "cold"

    # The same nodes again: their JIT caches were filled by the first start.
    second = world.boot("r28", then_fail_gate=True)
    assert second.success, failure_message(second)
    warm = served(second)
    # Seconds by the container's own log times: what the start took, not how often lockstep looked.
    # (warm: 0.2 s to the KV line against cold's 1.5 s, plus the same container start on both)
    assert warm.warm and warm.seconds_to[DEFAULT_READY_PATTERNS[0]] < kv and warm.budget_s == 30.0
    assert warm.previous is not None and (warm.previous.rev, warm.previous.image_id) == (
        "r27",
        world.ids["r27"],
    )

    # The failed gate put r27 back: its container runs
    # r27's image on every node, started by image ID.
    for node in (0, 1):
        doc = world.container(node)
        assert doc["State"]["Status"] == "running" and doc["Image"] == world.ids["r27"]
        assert doc["Config"]["Labels"]["lockstep.rev"] == "r27"
    history = lane_history(world.instance)
    assert [(h.action, h.rev, h.image_id) for h in history] == [
        ("restore", "r27", world.ids["r27"]),
        ("boot", "r28", world.ids["r28"]),
        ("boot", "r27", world.ids["r27"]),
    ]
    assert history[0].before_image_id == world.ids["r28"] and history[0].nodes == dict.fromkeys(
        LANE_NODES, world.ids["r27"]
    )


def test_a_rev_that_times_out_dies_or_runs_another_image_never_stays_on_the_lane(
    world: World,
) -> None:
    # Never ready (the head's engine hangs before its KV-cache line): the cold budget runs out.
    set_lane(world.sb, warm_budget_s=1.0, cold_budget_s=1.5)
    world.serve_as("r28", world.variants["hang"])
    timed_out, logged = world.boot_invoked("r28")
    said = str(timed_out)
    assert (
        "did not serve within its 1.5s budget" in said and "waiting for 'GPU KV cache size" in said
    )
    # the log tail; no previous
    assert "vLLM API server version" in said and "put back to nothing" in said
    assert logged == ["stop"]
    for node in world.nodes:  # nothing half-started stays on the lane
        assert docker(node, "ps", "-a", "-q").stdout == ""
    world.sb.site_file.write_text(world.site_text)
    serving, logged = world.boot_invoked("r27")
    assert isinstance(serving, LaneServing) and logged == ["boot"]

    # r28's engine crashes at start on the head (r27 still starts there): the lane gets r27 back.
    world.serve_as("r28", world.variants["exit"])
    died, logged = world.boot_invoked("r28")
    said = str(died)
    assert (
        "on spark-a exited with exit code 1" in said
        and "torch.OutOfMemoryError: CUDA out of memory" in said
    )
    assert "put back to jovian-judgement:r27-glm53 (r27" in said and logged == ["restore"]
    assert (
        world.container()["Image"] == world.ids["r27"]
        and world.container()["State"]["Status"] == "running"
    )

    # On spark-b the rev's tag points at another image (re-tagged after the distribution).
    world.serve_as("r28", world.variants["fast"])
    assert (
        docker(world.nodes[1], "tag", world.ids["r27"], "jovian-judgement:r28-glm53").returncode
        == 0
    )
    wrong, logged = world.boot_invoked("r28")
    assert f"spark-b runs {world.ids['r27']}" in str(
        wrong
    ) and f"must run {world.variants['fast']}" in str(wrong)
    assert logged == ["restore"] and world.container(1)["Image"] == world.ids["r27"]
    assert world.container(1)["Config"]["Labels"]["lockstep.rev"] == "r27"


# -- the sandbox docker's containers against docker's contract -------------------------------------


def test_docker_container_commands_follow_the_cli_contract(world: World) -> None:
    node = world.nodes[0]
    tag = "jovian-judgement:r27-glm53"
    started = docker(
        node,
        "run",
        "-d",
        "--name",
        "probe",
        tag,
        "python",
        "-c",
        (
            "import sys, time; print('out', flush=True); print('err', file=sys.stderr, "
            "flush=True); time.sleep(60)"
        ),
    )
    assert started.returncode == 0 and len(started.stdout.strip()) == 64
    again = docker(node, "run", "-d", "--name", "probe", tag, "python", "-c", "1")
    assert again.returncode == 125
    assert (
        'Conflict. The container name "/probe" is already in use by container '
        f'"{started.stdout.strip()}"'
    ) in again.stderr
    assert (
        docker(node, "ps", "--filter", "name=probe", "--format", "{{.Names}} {{.State}}").stdout
        == "probe running\n"
    )
    not_removed = docker(node, "rm", "probe")
    assert (
        not_removed.returncode == 1
        and "You cannot remove a running container" in not_removed.stderr
    )
    for _ in range(100):
        logs = docker(node, "logs", "probe")
        if logs.stdout and logs.stderr:
            break
    # each stream where the container wrote it
    assert (logs.stdout, logs.stderr) == ("out\n", "err\n")
    assert docker(node, "stop", "-t", "1", "probe").stdout == "probe\n"
    fmt = "{{.State.Status}} {{.State.ExitCode}} {{.Name}} {{.Config.Image}} {{.Image}}"
    # python as the container's PID 1 has no default
    # SIGTERM action: `stop -t 1` ends in SIGKILL (128+9).
    assert (
        docker(node, "inspect", "--format", fmt, "probe").stdout
        == f"exited 137 /probe {tag} {world.ids['r27']}\n"
    )
    assert docker(node, "ps", "-q").stdout == "" and docker(node, "ps", "-a", "-q").stdout.strip()
    assert docker(node, "rm", "probe").stdout == "probe\n"
    for argv in (("stop", "probe"), ("logs", "probe"), ("rm", "probe")):
        gone = docker(node, *argv)
        # what lane.py matches
        assert gone.returncode == 1 and "No such container: probe" in gone.stderr, argv
    missing = docker(node, "container", "inspect", "probe")
    assert missing.returncode == 1 and "Error: No such container: probe" in missing.stderr
    assert docker(node, "inspect", "nothing-here").stderr == "Error: No such object: nothing-here\n"
