"""Building an adopted rev on the sandbox's Spark nodes: detached build, boot gates, distribution, bench."""

from __future__ import annotations

import git

from jovian_assets.node_assets import BENCH, DISTRIBUTED, IMAGE
from jovian_assets.node_build import NodeImage
from sandbox.jovian_world import BUILD_BRANCH, new_lab_rev
from sandbox.spark_nodes import set_bench_knobs
from tests.conftest import remote_head
from tests.jovian.lab import Lab, checks, done, meta
from tests.runs import failure_message

EVERYTHING = {"jovian/source_lock", "jovian/fork_cut", "jovian/build_profile", "jovian/dep_table", "jovian/dep_trees",
              "jovian/image", "jovian/distributed_image", "jovian/lane_serving", "jovian/lane", "jovian/bench_report"}


def test_adopted_rev_is_built_gated_distributed_and_benched(lab: Lab) -> None:
    new_lab_rev(lab.sb.root, "r28")
    result = lab.adopt("r28", build=True)
    assert result.success, failure_message(result)
    assert done(result) == EVERYTHING
    assert all(e.passed for e in checks(result).values()), {n: e.description for n, e in checks(result).items() if not e.passed}

    image: NodeImage = result.asset_value(IMAGE)
    assert image.tag == "jovian-judgement:r28-glm53" and image.image_id.startswith("sha256:")
    version = image.expected_pins["vllm"]
    assert image.gates["vllm_import_carries_pin"]["stdout"] == version  # the engine string carries the pin
    nodes = meta(result, DISTRIBUTED)["nodes"]
    assert {r.data["node"]: r.data["image_id"] for r in nodes.records} == {"spark-a": image.image_id, "spark-b": image.image_id}  # type: ignore[attr-defined]

    bench = meta(result, BENCH)
    assert float(bench["score"]) >= 70.5 - 1.0  # type: ignore[arg-type]
    report = str(bench["report"])
    assert report.startswith("recipes/glm53-2x/reports/") and report.endswith("_r28.md")
    text = git.Repo(lab.build_repo).git.show(f"{BUILD_BRANCH}:{report}")
    assert "Final Score" in text and "pp2048 (c1)" in text and image.image_id in text


def test_profile_that_breaks_an_import_fails_its_gate_and_nothing_is_distributed(lab: Lab) -> None:
    new_lab_rev(lab.sb.root, "r28", break_import=True)
    result = lab.adopt("r28", build=True)
    assert not result.success
    gates = checks(result)["boot_gates"]
    assert not gates.passed and "flashkda_extension" in (gates.description or "")
    assert "jovian/image" in done(result) and "jovian/distributed_image" not in done(result)
    assert "jovian/bench_report" not in done(result)


def test_bench_below_baseline_fails_the_quality_gate(lab: Lab) -> None:
    new_lab_rev(lab.sb.root, "r28")
    set_bench_knobs(lab.sb.root / "nodes" / "spark-a", score=60.0)
    head = remote_head(lab.build_repo, BUILD_BRANCH)
    result = lab.adopt("r28", build=True)
    gate = checks(result)["quality_not_below_baseline"]
    assert not gate.passed and "quality 60" in (gate.description or "") and "regression" in (gate.description or "")
    assert remote_head(lab.build_repo, BUILD_BRANCH) != head  # the report is filed either way: it is evidence


def test_rebuilding_a_rev_ships_a_fresh_context(lab: Lab) -> None:
    """A retry of the same rev must not trip over the first attempt's log in the build context."""
    new_lab_rev(lab.sb.root, "r28")
    first = lab.adopt("r28", build=True)
    again = lab.adopt("r28", build=True)
    assert first.success and again.success, failure_message(again)
    assert first.asset_value(IMAGE).image_id == again.asset_value(IMAGE).image_id  # same inputs, same image
