"""Re-baselining a lane (`lockstep lane rebaseline`),
and the bench's failure: a plain module, so the
command loads neither the bench asset nor, until it runs, the bench tools."""

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from jovian_assets.inputs import inside, read_text
from jovian_assets.node_build import NodeBuildFailed
from resources.atomic import write_atomic
from resources.git import GitRemotes
from resources.names import NameRefused, check_relative_path
from resources.site.schema import SiteConfig

if TYPE_CHECKING:
    from jovian_assets.bench_tools import Baseline


class BenchFailed(NodeBuildFailed):
    """A bench command failed on the node, or left no
    result to read; the message names node and command."""


def rebaseline(
    config: SiteConfig, git: GitRemotes, report: str, *, now: datetime | None = None
) -> "Baseline":
    """Make the run a filed report records the lane's
    baseline: `recipes/<lane>/baseline.json` in the build
    repo, one commit pushed fast-forward. A person
    chooses the report; lockstep copies its run record."""
    from jovian_assets.bench_tools import baseline_from_report, baseline_json, baseline_path

    if config.jovian is None or config.jovian.lane is None:
        raise BenchFailed(f"{config.path}: no [jovian.lane]: there is no lane to re-baseline")
    jovian, lane = config.jovian, config.jovian.lane
    try:
        rel = check_relative_path("report", report)
    except NameRefused as exc:
        raise BenchFailed(f"{exc}; nothing was written") from None
    if not (rel.startswith(f"recipes/{lane.name}/reports/") and rel.endswith(".md")):
        raise BenchFailed(
            f"{report!r} is not a report of lane {lane.name}: give "
            f"recipes/{lane.name}/reports/<file>.md"
        )
    with git.checkout(url=jovian.build_repo, branch=jovian.build_branch) as wt:
        path = inside(wt.path, rel)
        if not path.is_file():
            raise BenchFailed(f"{jovian.build_repo} ({jovian.build_branch}) has no {rel}")
        text = read_text(path, f"{jovian.build_repo}:{rel}")
        baseline = baseline_from_report(
            text,
            f"{jovian.build_repo}:{rel}",
            lane=lane.name,
            recorded_at=now or datetime.now(UTC),
            recorded_by=config.site.commit_author,
        )
        target = inside(wt.path, baseline_path(lane.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, baseline_json(baseline))
        git.commit_all(
            worktree=wt,
            author=config.site.commit_author,
            paths=[baseline_path(lane.name)],
            message=f"bench: {lane.name} baseline is {baseline.rev}'s run {baseline.run.run_id} "
            f"({baseline.run.tool} {baseline.run.tool_version}, score {baseline.run.final_score}, "
            f"graded {baseline.run.graded_text}) from {rel}",
        )
        git.push_fast_forward(worktree=wt)
    return baseline
