"""Held pins and build lineages (issue 13, items 3
and 4): the runbook's r39 (LMCache held at 29bc5a2e
while vLLM + b12x are one cut, and a lineage split
into jovian-judgement-r39/) and r28's half-cut scar."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import git
import pytest

from jovian_assets.dep_table import DepRow, diff_gates, gated_finding, parse_gates
from jovian_assets.fork_cut import ONE_CUT, findings, holds
from jovian_assets.keys import BUILD_PROFILE, DEP_TABLE, FORK_CUT, SOURCE_LOCK
from jovian_assets.models import BranchCommit, BranchTip, ForkCut, PackageCut
from jovian_assets.node_build import manifest_checksum, stage_build_dir
from resources.errors import FileFormatError
from resources.site.jovian import JovianSection, rev_order
from resources.site.load import load_site
from sandbox.jovian_world import BUILD_BRANCH, BUILD_DIR, add_lineage, new_lab_rev
from tests.conftest import remote_file
from tests.support.jovian.lab import ASSETS, Lab, checks, meta
from tests.support.runs import failure_message

CUT = datetime(2026, 9, 21, 14, 0, tzinfo=UTC)
SHA = {
    "vllm": "9e5d1793fa3" + "0" * 29,
    "b12x": "c2dc1cf022" + "1" * 30,
    "lmcache": "29bc5a2e" + "2" * 32,
}


def _commit(minutes: float, summary: str, n: int) -> BranchCommit:
    return BranchCommit(
        sha=f"{n:x}" * 40 if n < 16 else f"{n:040x}",
        committed_at=CUT + timedelta(minutes=minutes),
        summary=summary,
    )


def _pkg(
    name: str, minutes: float, *, previous: str | None = None, commits: Sequence[BranchCommit] = ()
) -> PackageCut:
    branch = BranchTip(
        name=f"integration/glm53-{name}",
        tip=(commits[0].sha if commits else SHA[name]),
        ahead=len(commits),
        behind=0,
        commits=list(commits),
    )
    return PackageCut(
        name=name,
        repository=f"file:///{name}.git",
        commit=SHA[name],
        lock_tree="t" * 40,
        tree="t" * 40,
        committed_at=CUT + timedelta(minutes=minutes),
        branches=[branch],
        previous_commit=previous,
    )


def test_r39_lmcache_held_while_vllm_and_b12x_are_one_cut_passes_and_reports_the_hold() -> None:
    # LMCache's pin is 5 days old and its branch had work since, but nothing near the r39 cut.
    lmcache = _pkg(
        "lmcache",
        -7200,
        previous=SHA["lmcache"],
        commits=[_commit(-180, "docs: MP transfer notes", 3)],
    )
    cut = ForkCut(
        rev="r39",
        window_minutes=30,
        previous_rev="r38",
        packages=[_pkg("vllm", 0, previous="a" * 40), _pkg("b12x", 1, previous="b" * 40), lmcache],
    )
    one = findings(cut)[ONE_CUT]
    assert one.passed, one.description
    hold = (
        "lmcache held at 29bc5a2e (unchanged since r38; no integration commits within the r39 "
        "cut window)"
    )
    assert hold in one.description and "2 moved pins within 1.0 minutes" in one.description
    assert [(h.package, h.since_rev, h.description) for h in holds(cut)] == [
        ("lmcache", "r38", hold)
    ]


def test_r28_half_cut_names_the_commits_the_left_behind_forks_skipped() -> None:
    b12x = [
        _commit(1, "glm53 r28 release cut", 5),
        _commit(-60, "DeepSeek loader: skip absent MTP layers", 6),
        _commit(-150, "GLM loader: fuse shared-expert scales", 7),
    ]
    lmcache = [
        _commit(2, "glm53 r28 release cut", 8),
        _commit(-45, "MP transfer: retry short shared-memory reads", 9),
        # the fork's words
        _commit(-50, "mirror from https://bot:s3cret@git.example/lmcache\n# held: forged", 10),
    ]
    cut = ForkCut(
        rev="r28",
        window_minutes=30,
        previous_rev="r27",
        packages=[
            _pkg("vllm", 0, previous="a" * 40),
            _pkg("b12x", -2880, previous=SHA["b12x"], commits=b12x),
            _pkg("lmcache", -2880, previous=SHA["lmcache"], commits=lmcache),
        ],
    )
    one = findings(cut)[ONE_CUT]
    assert not one.passed and one.description.startswith("half-cut rev r28: ")
    assert (
        "b12x stayed at c2dc1cf0 (unchanged since r27)" in one.description
        and "skipped 3 commit(s)" in one.description
    )
    # sha, time, subject
    assert f"{'7' * 12} 2026-09-21T11:30Z GLM loader: fuse shared-expert scales" in one.description
    assert (
        "lmcache stayed at 29bc5a2e" in one.description
        and "MP transfer: retry short shared-memory reads" in one.description
    )
    # one line, no credentials
    assert "s3cret" not in one.description and "forged" not in one.description
    assert not holds(cut)


def test_a_moved_pin_outside_the_window_is_still_the_half_cut_and_a_hold_does_not_hide_it() -> None:
    cut = ForkCut(
        rev="r39",
        window_minutes=30,
        previous_rev="r38",
        packages=[
            _pkg("vllm", 180, previous="a" * 40),
            _pkg("b12x", 0, previous="b" * 40),
            _pkg("lmcache", -7200, previous=SHA["lmcache"]),
        ],
    )
    one = findings(cut)[ONE_CUT]
    assert (
        not one.passed
        and "the pins span 180 minutes, over the 30-minute cut window (b12x 180 min before vllm)"
        in one.description
    )
    assert "lmcache" not in one.description  # the held pin is not what is wrong


def test_revs_order_as_the_labs_do_and_each_rev_finds_its_lineage() -> None:
    assert sorted(["r39", "r10", "r2", "r100", "r10a"], key=rev_order) == [
        "r2",
        "r10",
        "r10a",
        "r39",
        "r100",
    ]
    jovian = JovianSection(
        lab_repo="file:///lab.git",
        build_repo="file:///build.git",
        lineages=[
            {"dir": "jovian-judgement-r39", "from_rev": "r39"},
            {"dir": "jovian-judgement-r10", "from_rev": "r10"},
        ],
    )
    assert [jovian.build_dir_for(r) for r in ("r2", "r9", "r10", "r38", "r39", "r100")] == [
        "jovian-judgement",
        "jovian-judgement",
        "jovian-judgement-r10",
        "jovian-judgement-r10",
        "jovian-judgement-r39",
        "jovian-judgement-r39",
    ]


SITE = """\
[tpu]
harbor_repo = "https://github.com/marin-community/harbor.git"
harbor_branch = "main"
consumer_repo = "https://github.com/open-thoughts/OpenThoughts-Agent.git"
consumer_branch = "main"
image = "ghcr.io/open-thoughts/openthoughts-agent"

[jovian]
lab_repo = "https://github.com/local-inference-lab/rtx6kpro.git"
build_repo = "https://github.com/example/docker-images.git"

[[jovian.lineages]]
dir = "jovian-judgement-r10"
from_rev = "r10"

[[jovian.lineages]]
{second}
"""


@pytest.mark.parametrize(
    ("second", "line", "says"),
    [
        (
            'dir = "/etc/jovian"\nfrom_rev = "r39"',
            17,
            "[[jovian.lineages]] #2 dir: lineage dir '/etc/jovian' must be a relative path",
        ),
        ('dir = "../elsewhere"\nfrom_rev = "r39"', 17, "its part '..' is not a plain name"),
        (
            'dir = "jovian-judgement-r39"\nfrom_rev = "r39;rm"',
            18,
            "lineage from_rev 'r39;rm' is not a plain name",
        ),
        (
            'dir = "jovian-judgement-r39"\nfrom_rev = "r10"',
            18,
            "from_rev 'r10' already starts lineage 'jovian-judgement-r10'",
        ),
    ],
)
def test_lineage_site_errors_name_file_line_and_value(
    tmp_path: Path, second: str, line: int, says: str
) -> None:
    site = tmp_path / "site.toml"
    site.write_text(SITE.format(second=second))
    with pytest.raises(FileFormatError) as info:
        load_site(site)
    assert str(info.value).startswith(f"{site}:{line}: ") and says in str(info.value)


def _row(name: str, repository: str, tag: str) -> DepRow:
    return DepRow(
        name=name, repository=repository, tag=tag, file="cmake/external_projects/x.cmake", line=3
    )


def test_every_gated_pin_moved_suggests_a_lineage_instead_of_a_wall_of_pins() -> None:
    gates = parse_gates(
        "gate cutlass https://github.com/nvidia/cutlass v4.4.2\n"
        "gate DeepGEMM https://github.com/deepseek-ai/DeepGEMM 8b1392b9" + "0" * 32 + "\n",
        "jovian-judgement/fetch-deps.sh",
    )
    rows = [
        _row("cutlass", "https://github.com/nvidia/cutlass", "v4.7.1"),
        _row("DeepGEMM", "https://github.com/vllm-project/DeepGEMM", "8b1392b9" + "0" * 32),
        _row("DeepSelect", "https://github.com/vllm-project/DeepSelect", "v0.1.0"),
    ]
    finding = gated_finding(
        diff_gates(rows, gates),
        gates,
        gates_path="jovian-judgement/fetch-deps.sh",
        rev="r39",
        new_dir="jovian-judgement-r39",
    )
    assert not finding.passed
    assert finding.description.startswith(
        "every one of the 2 gated pins of jovian-judgement/fetch-deps.sh moved (cutlass v4.4.2 "
        "-> v4.7.1, "
        "DeepGEMM -> https://github.com/vllm-project/DeepGEMM, + DeepSelect): start a lineage, "
        "e.g. "
        '[[jovian.lineages]] dir = "jovian-judgement-r39" from_rev = "r39"'
    )
    one_left = gated_finding(
        diff_gates(rows[:1] + [_row("DeepGEMM", gates[1].repository, gates[1].tag)], gates),
        gates,
        gates_path="jovian-judgement/fetch-deps.sh",
        rev="r39",
        new_dir="jovian-judgement-r39",
    )
    assert (
        not one_left.passed
        and "Re-sync the gate list" in one_left.description
        and "lineage" not in one_left.description
    )


def test_the_build_ships_the_lineage_dir_and_its_checksum_is_over_that_dir(tmp_path: Path) -> None:
    for d, pin in ((BUILD_DIR, "old"), (f"{BUILD_DIR}-r39", "new")):
        (tmp_path / "build" / d / "profiles").mkdir(parents=True)
        (tmp_path / "build" / d / "versions.env").write_text(f"VLLM_COMMIT={pin}\n")
    checksum = stage_build_dir(
        build_checkout=tmp_path / "build",
        build_dir=f"{BUILD_DIR}-r39",
        deps_root=None,
        dest=tmp_path / "context",
    )
    assert (tmp_path / "context" / "versions.env").read_text() == "VLLM_COMMIT=new\n"
    assert (
        checksum
        == manifest_checksum(tmp_path / "build" / f"{BUILD_DIR}-r39")
        != manifest_checksum(tmp_path / "build" / BUILD_DIR)
    )


def test_r39_holds_lmcache_and_adopts_into_its_own_lineage(lab: Lab) -> None:
    # every moved cmake pin: a lineage split
    rev = new_lab_rev(lab.sb.root, "r39", hold=("lmcache",), move_dep=True)
    add_lineage(lab.sb.root, f"{BUILD_DIR}-r39", from_rev="r39", moved_deps=rev.moved_deps)
    lab.instance.add_dynamic_partitions("lab_revs", ["r39"])
    result = dg.materialize(
        ASSETS,
        selection=dg.AssetSelection.assets(SOURCE_LOCK, FORK_CUT, BUILD_PROFILE, DEP_TABLE),
        partition_key="r39",
        resources=lab.resources,
        instance=lab.instance,
        raise_on_error=False,
    )
    assert result.success, failure_message(result)
    hold = (
        f"lmcache held at {rev.pins['lmcache'][:8]} (unchanged since r27; no integration "
        "commits within the r39 cut window)"
    )
    one_cut = checks(result)[ONE_CUT]
    assert one_cut.passed and hold in (one_cut.description or "")
    assert [r.data["package"] for r in meta(result, FORK_CUT)["holds"].records] == ["lmcache"]  # type: ignore[attr-defined]

    profile = remote_file(lab.build_repo, f"{BUILD_DIR}-r39/profiles/r39.env", BUILD_BRANCH)
    assert f"# held: {hold}\n" in profile and f"VLLM_COMMIT={rev.pins['vllm']}" in profile
    # held = versions.env's
    assert f"B12X_COMMIT={rev.pins['b12x']}" in profile and "LMCACHE_COMMIT" not in profile
    assert "r39.env" not in git.Repo(lab.build_repo).git.ls_tree(
        "-r", "--name-only", BUILD_BRANCH, f"{BUILD_DIR}/profiles"
    )
    # The lineage's gate list carries the moved pins; the base dir's would fail cuda_pins_gated.
    assert (
        checks(result)["cuda_pins_gated"].passed
        and meta(result, DEP_TABLE)["gate_list"] == f"{BUILD_DIR}-r39/fetch-deps.sh"
    )


def test_a_revs_fork_cut_lists_each_forks_commits_since_the_previous_revs_pins(lab: Lab) -> None:
    rev = new_lab_rev(lab.sb.root, "r28", hold=("lmcache",))  # vLLM and b12x move; LMCache is held
    lab.instance.add_dynamic_partitions("lab_revs", ["r28"])
    result = dg.materialize(
        ASSETS,
        selection=dg.AssetSelection.assets(SOURCE_LOCK, FORK_CUT),
        partition_key="r28",
        resources=lab.resources,
        instance=lab.instance,
        raise_on_error=False,
    )
    assert result.success, failure_message(result)
    cut = result.asset_value(FORK_CUT)
    rows = meta(result, FORK_CUT)["changelog"].records  # type: ignore[attr-defined]
    summary = str(meta(result, FORK_CUT)["changelog_summary"])
    for pkg in cut.packages:
        fork = git.Repo(lab.sb.repos / f"{pkg.name}.git")
        # git's own answer, newest first
        between = fork.git.rev_list(f"{pkg.previous_commit}..{rev.pins[pkg.name]}").split()
        listed = [r.data for r in rows if r.data["repo"] == pkg.name]
        assert [r["sha"] for r in listed] == between and {r["change"] for r in listed} <= {"added"}
        assert [r["subject"] for r in listed] == [fork.commit(s).summary for s in between]
        if pkg.name == "lmcache":
            assert between == [] and f"lmcache: unchanged at {pkg.commit[:8]}" in summary
        else:
            assert (
                between
                and (
                    f"{pkg.name} {pkg.previous_commit[:8]} -> {pkg.commit[:8]}: {len(between)} "
                    "commit"
                )
                in summary
            )
