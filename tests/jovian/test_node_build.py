"""Building an adopted rev on the sandbox's Spark nodes:
detached build, boot gates, distribution, bench."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import git
import pytest

from jovian_assets.bench_tools import BenchReport
from jovian_assets.keys import BENCH, DISTRIBUTED, IMAGE, LANE_SERVING
from jovian_assets.models import LaneServing
from jovian_assets.node_build import NodeImage
from sandbox.jovian_world import BUILD_BRANCH, BUILD_DIR, new_lab_rev
from sandbox.spark_nodes import node_env, set_bench_knobs
from tests.support.jovian.lab import Lab, checks, done, meta
from tests.support.runs import failure_message

pytestmark = pytest.mark.heavy(60)  # seconds, about: the order parallel workers take modules in

EVERYTHING = {
    "jovian/source_lock",
    "jovian/fork_cut",
    "jovian/build_profile",
    "jovian/dep_table",
    "jovian/dep_trees",
    "jovian/image",
    "jovian/distributed_image",
    "jovian/lane_serving",
    "jovian/lane",
    "jovian/bench_report",
}


def test_adopted_rev_is_built_gated_distributed_served_and_benched_and_a_bad_bench_never_stays(
    lab: Lab,
) -> None:
    """Issue 13's "Done when" 1-2 on one lane (one
    clean build to go back to): a clean rev end to end;
    then a dead bench pipe; then a rev that benches
    below the baseline puts the previous image back."""
    # Heartbeats every second: the build, the distribution
    # and the lane boot write theirs as they go.
    site = lab.sb.site_file
    site.write_text(
        re.sub(
            r"^heartbeat_s = .*$", "heartbeat_s = 1", site.read_text(), count=1, flags=re.MULTILINE
        )
    )
    new_lab_rev(lab.sb.root, "r28")
    result = lab.adopt("r28", build=True)
    assert result.success, failure_message(result)
    assert done(result) == EVERYTHING
    # Where the build's log is, on jovian/image from the build's start (issue 26).
    started = lab.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=IMAGE, asset_partitions=["r28"]), limit=2
    )
    (facts,) = [
        {k: v.value for k, v in r.asset_observation.metadata.items()} for r in started.records
    ]  # type: ignore[union-attr]
    assert facts["node"] == "spark-build" and re.fullmatch(
        r"lockstep-builds/r28/\w{8}/build\.log", facts["build_log"]
    )
    assert all(e.passed for e in checks(result).values()), {
        n: e.description for n, e in checks(result).items() if not e.passed
    }

    image: NodeImage = result.asset_value(IMAGE)
    assert image.tag == "jovian-judgement:r28-glm53" and image.image_id.startswith("sha256:")
    version = image.expected_pins["vllm"]
    # the engine string carries the pin
    assert image.gates["vllm_import_carries_pin"]["stdout"] == version
    # What the lane serves is what was built: the running containers' image ID on both lane engines.
    serving: LaneServing = result.asset_value(LANE_SERVING)
    assert serving.image_id == image.image_id and serving.nodes == {
        "spark-a": image.image_id,
        "spark-b": image.image_id,
    }
    nodes = meta(result, DISTRIBUTED)["nodes"]
    assert {r.data["node"]: r.data["image_id"] for r in nodes.records} == {
        "spark-a": image.image_id,
        "spark-b": image.image_id,
    }  # type: ignore[attr-defined]

    # The real tools benched the served endpoint; the
    # report and the night's tables name the served image.
    bench: BenchReport = result.asset_value(BENCH)
    assert bench.image_id == image.image_id and bench.verdict.passed and bench.verdict.comparable
    assert (bench.quality.tool_version, bench.quality.graded_text, bench.quality.seed) == (
        "3.0.0",
        "15/15",
        42,
    )
    assert bench.report_path.startswith("recipes/glm53-2x/reports/") and bench.report_path.endswith(
        "_r28.md"
    )
    repo = git.Repo(lab.build_repo)
    text = repo.git.show(f"{BUILD_BRANCH}:{bench.report_path}")
    assert (
        f"ID `{image.image_id}`" in text
        and "tool-eval-bench 3.0.0, seed 42" in text
        and "| pp64 | c2 |" in text
    )
    night = repo.git.show(f"{BUILD_BRANCH}:{bench.night_shift_path}")
    assert (
        f"| r28 | `{image.image_id.removeprefix('sha256:')[:12]}` |" in night
        and "| tg8 | c1 |" in night
    )
    # Report and tables are one commit, pushed.
    files = repo.git.show("--name-only", "--format=", bench.build_commit).split()
    assert sorted(files) == sorted([bench.report_path, bench.night_shift_path])

    def filed() -> list[str]:
        return repo.git.ls_tree(
            "-r", "--name-only", BUILD_BRANCH, "recipes/glm53-2x/reports", "history"
        ).split()

    # The bench again, dying like the pre-fix launcher's
    # output pump: exit 120, no output, nothing filed.
    before = filed()
    lane = lab.sb.root / "nodes" / "spark-a"
    set_bench_knobs(lane, fault="dead-pipe")
    try:
        dead = lab.bench("r28")
    finally:
        set_bench_knobs(lane)
    assert not dead.success
    message = failure_message(dead)
    assert "bench quality on spark-a" in message and "exit 120 with no output" in message
    assert "(a dead pipe pump?)" in message
    assert filed() == before  # nothing half-written: no report, no night-shift rows

    # r29's model never calls a tool: it benches below the
    # baseline, the gate fails, the lane serves r28 again.
    new_lab_rev(lab.sb.root, "r29", broken_model=True)
    low = lab.adopt("r29", build=True)
    gate = checks(low)["quality_not_below_baseline"]
    bad: BenchReport = low.asset_value(BENCH)
    assert (
        not gate.passed
        and bad.verdict.comparable
        and bad.quality.final_score < bench.quality.final_score
    )
    assert "regression" in (gate.description or "") and "15/15" in (gate.description or "")
    # filed either way: it is evidence
    assert bad.report_path in filed() and bench.report_path in filed()
    assert low.asset_value(IMAGE).image_id != image.image_id
    for node in ("spark-a", "spark-b"):  # by the running container's image ID, on every lane node
        inspected = subprocess.run(
            ["docker", "container", "inspect", "--format", "{{.Image}}", "lockstep-glm53-2x"],
            env=node_env(lab.sb.root / "nodes" / node),
            capture_output=True,
            text=True,
            check=True,
        )
        assert inspected.stdout.strip() == image.image_id
    assert bad.restored and image.image_id in bad.restored


def test_profile_that_breaks_an_import_fails_its_gate_and_nothing_is_distributed(lab: Lab) -> None:
    new_lab_rev(lab.sb.root, "r28", break_import=True)
    result = lab.adopt("r28", build=True)
    assert not result.success
    gates = checks(result)["boot_gates"]
    assert not gates.passed and "flashkda_extension" in (gates.description or "")
    assert "jovian/image" in done(result) and "jovian/distributed_image" not in done(result)
    assert "jovian/bench_report" not in done(result)


def test_a_build_dir_without_the_gb10_patch_set_builds_but_fails_its_boot_gates(
    lab: Lab, push_repo: Callable[..., str]
) -> None:
    """12.1a silently collapses to sm_120 when the
    patch set is left out: the build succeeds, only the
    gates (cuobjdump over the built kernels, the patches' effects in the source) can tell."""

    def drop_patch_set(wt: Path) -> None:
        dockerfile = wt / BUILD_DIR / "Dockerfile"
        dockerfile.write_text(
            "".join(
                line
                for line in dockerfile.read_text().splitlines(keepends=True)
                if "patch_cuda_sm12x" not in line
            )
        )

    push_repo(
        lab.build_repo, BUILD_BRANCH, drop_patch_set, "jovian-judgement: drop the GB10 patch set"
    )
    new_lab_rev(lab.sb.root, "r28")
    result = lab.adopt("r28", build=True)
    assert not result.success
    gates = checks(result)["boot_gates"]
    said = gates.description or ""
    assert not gates.passed and "cuda_arch_sm121a" in said and "sm12x_patch_set_applied" in said, (
        said
    )
    image: NodeImage = result.asset_value(IMAGE)
    assert (
        "vllm kernels are compiled for sm_120, not sm_121a"
        in image.gates["cuda_arch_sm121a"]["stderr"]
    )
    assert "jovian/distributed_image" not in done(result)


def test_rebuilding_a_rev_ships_a_fresh_context(lab: Lab) -> None:
    """A retry of the same rev must not trip over the first attempt's log in the build context."""
    new_lab_rev(lab.sb.root, "r28")
    adopted = lab.adopt("r28")
    assert adopted.success, failure_message(adopted)
    # jovian/image only: the lane and the bench are not its subject
    first, again = lab.build("r28"), lab.build("r28")
    assert first.success and again.success, failure_message(again)
    # same inputs, same image
    assert first.asset_value(IMAGE).image_id == again.asset_value(IMAGE).image_id
