"""`jovian/bench_report`: the real bench tools against the endpoint `jovian/lane_serving` proved,
the runbook's report and night-shift tables filed in one commit, and the quality gate against the
recorded baseline run. Partitioned by `lab_revs`.
"""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import dagster as dg

from jovian_assets.asset_results import check_result, jovian_of, rev_of, string_table
from jovian_assets.bench_baseline import BenchFailed
from jovian_assets.inputs import inside
from jovian_assets.keys import BENCH, LANE_SERVING, QUALITY_GATE
from jovian_assets.models import Finding, LaneServing
from jovian_assets.partitions import lab_revs
from resources.atomic import write_atomic
from resources.git import GitRemotes
from resources.links import commit_entries
from resources.site.jovian import LaneSection
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from resources.spark import SparkNodes

# The bench tools' parsers and report writers load with the first bench run, not with the location.
if TYPE_CHECKING:
    from jovian_assets.bench_tools import Baseline, GateVerdict


def run_bench(
    spark: SparkNodes,
    *,
    node: str,
    lane: LaneSection,
    serving: LaneServing,
    remote_dir: str,
    label: str,
    argv: list[str],
    parse: Callable[[bytes, str], Any],
) -> Any:
    """One site bench command on the bench node, its
    JSON result read back from the node and parsed."""
    from jovian_assets.bench_tools import render_command

    out = f"{remote_dir}/{label}.json"
    command = render_command(
        argv, base_url=serving.base_url, model=serving.model, seed=str(lane.seed), out=out
    )
    result = spark.run(node=node, argv=command, timeout_s=lane.bench_timeout_s)
    if result.exit_code != 0:
        dead = " (a dead pipe pump?)" if result.silent else ""
        tail = (result.stderr or result.stdout).decode(errors="replace").strip()[-1500:]
        raise BenchFailed(
            f"bench {label} on {node}: {result.describe()}{dead}"
            + (f"; output tail:\n{tail}" if tail else "")
        )
    read = spark.run(node=node, argv=["cat", "--", out])
    if read.exit_code != 0:
        raise BenchFailed(
            f"bench {label} on {node} exited 0 but left no {out}: {read.describe()}; "
            f"check that its site command writes its JSON to {{out}}"
        )
    return parse(read.stdout, f"{node}:{out}")


@dg.asset(
    key=BENCH,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"ssh"},
    code_version="2",
    ins={"lane_serving": dg.AssetIn(key=LANE_SERVING)},
    check_specs=[
        dg.AssetCheckSpec(
            QUALITY_GATE,
            asset=BENCH,
            blocking=True,
            description=(
                "The quality score is not below the recorded baseline run "
                "(recipes/<lane>/baseline.json) minus the site's "
                "tolerance, and the two are comparable: same tool version, same cohort "
                "(benchmark conditions), same number "
                "of graded scenarios. A failing gate puts the lane back on the image it served "
                "before."
            ),
        )
    ],
    description=(
        "The real tool-eval-bench (quality, fixed seed, its --json-file) and llama-benchy (perf, "
        "pp/tg at each "
        "concurrency, --format json) on the lane's bench node against the endpoint "
        "jovian/lane_serving booted. "
        "Files `recipes/<lane>/reports/<UTC-stamp>_<rev>.md` (naming the served image ID) and "
        "adds rows to "
        "`history/night-shifts/<date>.md`, in one commit pushed fast-forward to the build repo."
    ),
)
def bench_report(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    git: GitRemotes,
    spark: SparkNodes,
    lane_serving: LaneServing,
):
    from jovian_assets.bench_tools import (
        BenchReport,
        baseline_path,
        gate,
        night_shift_rows,
        parse_baseline,
        parse_perf,
        parse_quality,
        report_markdown,
        update_night_shift,
    )

    config = site.config()
    jovian = jovian_of(site)
    lane = jovian.lane
    if lane is None:
        raise BenchFailed(f"{config.path}: no [jovian.lane] to bench")
    rev = rev_of(context)
    serving = lane_serving
    if serving.rev != rev or serving.lane != lane.name:
        raise BenchFailed(
            f"jovian/lane_serving serves {serving.rev} on lane {serving.lane}, not {rev} on "
            f"{lane.name}: "
            f"materialize jovian/lane_serving for {rev} first"
        )
    node = serving.bench_node
    remote_dir = f"lockstep-bench/{rev}/{context.run.run_id[:8]}"
    spark.run(node=node, argv=["mkdir", "-p", "--", remote_dir]).check()
    quality = run_bench(
        spark,
        node=node,
        lane=lane,
        serving=serving,
        remote_dir=remote_dir,
        label="quality",
        argv=lane.bench_quality,
        parse=parse_quality,
    )
    perf = run_bench(
        spark,
        node=node,
        lane=lane,
        serving=serving,
        remote_dir=remote_dir,
        label="perf",
        argv=lane.bench_perf,
        parse=parse_perf,
    )
    now = datetime.now(UTC)
    stamp, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y-%m-%d")
    rel = f"recipes/{lane.name}/reports/{stamp}_{rev}.md"
    night = f"history/night-shifts/{date}.md"
    with git.checkout(url=jovian.build_repo, branch=jovian.build_branch) as wt:
        base_file = inside(wt.path, baseline_path(lane.name))
        baseline: Baseline | None = (
            parse_baseline(
                base_file.read_bytes(), f"{jovian.build_repo}:{baseline_path(lane.name)}"
            )
            if base_file.is_file()
            else None
        )
        verdict = gate(quality, baseline, lane.tolerance, lane=lane.name)
        report = inside(wt.path, rel)
        report.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            report,
            report_markdown(
                lane=lane.name,
                rev=rev,
                tag=serving.tag,
                image_id=serving.image_id,
                node=node,
                stamp=stamp,
                quality=quality,
                perf=perf,
                verdict=verdict,
                baseline=baseline,
            ),
        )
        table = inside(wt.path, night)
        table.parent.mkdir(parents=True, exist_ok=True)
        score_rows, perf_rows = night_shift_rows(
            stamp=stamp,
            lane=lane.name,
            rev=rev,
            image_id=serving.image_id,
            quality=quality,
            perf=perf,
            verdict=verdict,
            report=rel,
        )
        write_atomic(
            table,
            update_night_shift(
                table.read_text(encoding="utf-8") if table.is_file() else None,
                date=date,
                score_rows=score_rows,
                perf_rows=perf_rows,
            ),
        )
        git.commit_all(
            worktree=wt,
            message=f"bench: {lane.name} {rev} quality {quality.final_score} "
            f"({'pass' if verdict.passed else 'FAIL'}, {quality.tool} {quality.tool_version})",
            author=config.site.commit_author,
            paths=[rel, night],
        )
        commit = git.push_fast_forward(worktree=wt)
    restored = None if verdict.passed else put_lane_back(context, spark, config, serving, verdict)
    result = BenchReport(
        rev=rev,
        lane=lane.name,
        node=node,
        tag=serving.tag,
        image_id=serving.image_id,
        quality=quality,
        perf=perf,
        verdict=verdict,
        baseline_rev=baseline.rev if baseline else None,
        report_path=rel,
        night_shift_path=night,
        build_commit=commit,
        restored=restored,
    )
    yield dg.Output(
        result,
        metadata={
            "lane": dg.MetadataValue.text(lane.name),
            "score": dg.MetadataValue.int(quality.final_score),
            "graded": dg.MetadataValue.text(quality.graded_text),
            "completion_rate": dg.MetadataValue.float(quality.completion_rate),
            "tool": dg.MetadataValue.text(f"{quality.tool} {quality.tool_version}"),
            "seed": dg.MetadataValue.text(str(quality.seed)),
            "config_fingerprint": dg.MetadataValue.text(quality.config_fingerprint),
            "cohort": dg.MetadataValue.text(quality.cohort),
            "served_image_id": dg.MetadataValue.text(serving.image_id),
            "baseline": dg.MetadataValue.text(
                f"{baseline.run.final_score} ({baseline.rev}, run {baseline.run.run_id})"
                if baseline
                else "none recorded"
            ),
            "categories": string_table(
                [c.model_dump() for c in quality.categories],
                ["category", "label", "percent", "earned", "max"],
            ),
            "perf": string_table(
                [r.model_dump() for r in perf.rows], ["test", "concurrency", "tokens_per_s"]
            ),
            "report": dg.MetadataValue.text(rel),
            "night_shift": dg.MetadataValue.text(night),
            **({"restored": dg.MetadataValue.text(restored)} if restored else {}),
            **commit_entries(config.links, "build_commit", jovian.build_repo, commit),
        },
    )
    yield check_result(
        BENCH,
        QUALITY_GATE,
        Finding(
            passed=verdict.passed,
            description=verdict.description
            + (f"; the lane serves {restored} again" if restored else ""),
        ),
    )


def put_lane_back(
    context: dg.AssetExecutionContext,
    spark: SparkNodes,
    config: SiteConfig,
    serving: LaneServing,
    verdict: "GateVerdict",
) -> str:
    """The lane goes back to the image it served before
    this rev (jovian_assets/lane.py records it in
    the lane's history); what it serves now, for the gate's description."""
    from jovian_assets.lane import restore_previous

    back = restore_previous(
        context,
        spark,
        config,
        serving,
        reason=f"{serving.rev} failed {QUALITY_GATE}: {verdict.description}"[:500],
    )
    return "nothing (it served nothing before)" if back is None else f"{back.tag} ({back.image_id})"
