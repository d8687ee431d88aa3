"""Adopting lab revs on the sandbox, end to end: real
git repos, Dagster in-process, the runbook's scars."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import git
from click.testing import CliRunner

from jovian_assets.keys import DEP_TABLE, DEP_TREES, SOURCE_LOCK
from jovian_assets.revs import LAB_COMMIT_TAG
from lockstep.cli import main as lockstep_cli
from sandbox.jovian_world import BUILD_BRANCH, BUILD_DIR, LAB_BRANCH, RECIPE, lock_path, new_lab_rev
from tests.conftest import remote_file, remote_head
from tests.support.jovian.lab import Lab, checks, done, meta
from tests.support.runs import failure_message

ALL = {
    "jovian/source_lock",
    "jovian/fork_cut",
    "jovian/build_profile",
    "jovian/dep_table",
    "jovian/dep_trees",
}


def test_new_lab_rev_one_tick_one_run_then_all_five_assets_green(lab: Lab) -> None:
    first = lab.tick(None)
    assert [r.partition_key for r in first.run_requests] == ["r27"]

    rev = new_lab_rev(lab.sb.root, "r28")
    tick = lab.tick(first.cursor)
    (request,) = tick.run_requests  # only the new lock: r27's did not change
    blob = git.Repo(lab.lab_repo).commit(LAB_BRANCH).tree[lock_path("r28")].hexsha
    assert request.partition_key == "r28" and request.run_key == f"r28:{blob}"
    assert request.tags[LAB_COMMIT_TAG] == rev.lab_commit == tick.cursor
    assert tick.dynamic_partitions_requests[0].partition_keys == ["r28"]
    again = lab.tick(tick.cursor)
    assert not again.run_requests and rev.lab_commit in again.skip_reason.skip_message  # type: ignore[union-attr]

    result = lab.adopt("r28", tags=request.tags)
    assert result.success, failure_message(result)
    assert done(result) == ALL
    assert all(e.passed for e in checks(result).values()) and len(checks(result)) == 11

    profile = remote_file(lab.build_repo, f"{BUILD_DIR}/profiles/r28.env", BUILD_BRANCH)
    assert (
        f"VLLM_COMMIT={rev.pins['vllm']}" in profile
        and f"B12X_COMMIT={rev.pins['b12x']}" in profile
    )
    # the whole set at once, never just vLLM
    assert f"LMCACHE_COMMIT={rev.pins['lmcache']}" in profile
    assert "CUDA_VERSION" not in profile  # only keys that differ from versions.env
    pins = meta(result, SOURCE_LOCK)["packages"]
    assert {r.data["package"] for r in pins.records} == {"vllm", "b12x", "lmcache"}  # type: ignore[attr-defined]

    # Adopting the same rev again pushes nothing new.
    head = remote_head(lab.build_repo, BUILD_BRANCH)
    assert lab.adopt("r28", tags=request.tags).success
    assert remote_head(lab.build_repo, BUILD_BRANCH) == head


def test_half_cut_rev_fails_one_cut_naming_the_skipped_commits_and_nothing_downstream(
    lab: Lab,
) -> None:
    assert lab.adopt("r27").success
    rev = new_lab_rev(lab.sb.root, "r28", half_cut=True)
    head = remote_head(lab.build_repo, BUILD_BRANCH)
    result = lab.adopt("r28")
    assert not result.success
    one_cut = checks(result)["one_cut"]
    said = one_cut.description or ""
    assert not one_cut.passed and said.startswith("half-cut rev r28: ")
    # b12x and LMCache kept r27's pins while their
    # branches were cut with vLLM: not holds, skipped cuts.
    b12x_cut = git.Repo(lab.sb.repos / "b12x.git").commit(rev.branches["b12x"])
    assert (
        f"b12x stayed at {rev.pins['b12x'][:8]} (unchanged since r27)" in said
        and "skipped 4 commit(s)" in said
    )
    assert (
        f"{b12x_cut.hexsha[:12]} {b12x_cut.committed_datetime:%Y-%m-%dT%H:%MZ} glm53 r28 "
        "release cut"
    ) in said
    assert (
        "GLM loader: fuse shared-expert scales" in said
        and "MP transfer: retry short shared-memory reads" in said
    )
    assert "lmcache stayed at" in said and "held at" not in said
    # the left-behind forks have newer commits
    assert not checks(result)["newer_cut_available"].passed
    assert done(result) == {"jovian/source_lock", "jovian/fork_cut"}
    assert remote_head(lab.build_repo, BUILD_BRANCH) == head  # no profile for a half-cut


def test_second_rev_reuses_the_object_cache(lab: Lab) -> None:
    first = lab.adopt("r27")
    new_lab_rev(lab.sb.root, "r28")
    second = lab.adopt("r28")
    assert first.success and second.success
    fetched_1 = int(meta(first, DEP_TREES)["bytes_fetched"])  # type: ignore[arg-type]
    fetched_2 = int(meta(second, DEP_TREES)["bytes_fetched"])  # type: ignore[arg-type]
    assert (
        fetched_1 > 0
        and fetched_2 * 10 <= fetched_1
        and int(meta(second, DEP_TREES)["bytes_reused"]) >= fetched_1
    )  # type: ignore[arg-type]


def test_moved_cmake_pin_is_an_ungated_cuda_pin_and_stops_the_fetch(lab: Lab) -> None:
    assert lab.adopt("r27").success
    new_lab_rev(lab.sb.root, "r28", move_dep=True)
    result = lab.adopt("r28")
    gated = checks(result)["cuda_pins_gated"]
    assert (
        not gated.passed
        and "flashmla" in (gated.description or "")
        and "Re-sync the gate list" in (gated.description or "")
    )
    assert "moved" in str(meta(result, DEP_TABLE)["vs_previous_rev"])
    assert "jovian/dep_trees" not in done(result)


def test_recipe_toml_trap_fails_naming_file_and_line(
    lab: Lab, push_repo: Callable[..., str]
) -> None:
    def trap(wt: Path) -> None:
        recipe = wt / RECIPE
        lines = [l for l in recipe.read_text().splitlines() if not l.startswith("build_profile")]
        recipe.write_text("\n".join(lines) + '\nbuild_profile = "r27"\n')

    push_repo(lab.build_repo, BUILD_BRANCH, trap, "recipe: move build_profile (the trap)")
    result = lab.adopt("r27")
    trapped = checks(result)["recipes_build_profile_top_level"]
    assert not trapped.passed and (trapped.description or "").startswith(f"{RECIPE}:")
    assert "parses into" in (
        trapped.description or ""
    ) and "silently builds with the base pins" in (trapped.description or "")


def test_unknown_versions_key_writes_nothing(lab: Lab) -> None:
    text = lab.sb.site_file.read_text().replace(
        '"vllm.commit" = "VLLM_COMMIT"', '"vllm.commit" = "VLLM_COMIT"'
    )
    assert "VLLM_COMIT" in text
    lab.sb.site_file.write_text(text)
    new_lab_rev(lab.sb.root, "r28")
    head = remote_head(lab.build_repo, BUILD_BRANCH)
    result = lab.adopt("r28")
    known = checks(result)["profile_keys_known"]
    assert (
        not known.passed
        and "VLLM_COMIT is not a key of versions.env (did you mean VLLM_COMMIT?)"
        in (known.description or "")
    )
    assert remote_head(lab.build_repo, BUILD_BRANCH) == head


def test_tree_mismatch_and_branch_name_pins_fail(lab: Lab, push_repo: Callable[..., str]) -> None:
    r27 = remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH)
    good_tree = next(l for l in r27.splitlines() if l.startswith("b12x.tree=")).split("=", 1)[1]
    bad_tree = r27.replace("release.version=r27", "release.version=r90").replace(
        good_tree, "0" * 40
    )
    by_branch = r27.replace("release.version=r27", "release.version=r91")
    vllm_commit = next(l for l in r27.splitlines() if l.startswith("vllm.commit="))
    by_branch = by_branch.replace(vllm_commit, "vllm.commit=integration/glm53-r27-release-20260906")

    def publish(wt: Path) -> None:
        (wt / lock_path("r90")).write_text(bad_tree)
        (wt / lock_path("r91")).write_text(by_branch)

    push_repo(lab.lab_repo, LAB_BRANCH, publish, "publish r90, r91")
    mismatch = lab.adopt("r90")
    trees = checks(mismatch)["trees_match"]
    assert (
        not trees.passed
        and "b12x" in (trees.description or "")
        and "0" * 40 in (trees.description or "")
    )
    assert done(mismatch) == {"jovian/source_lock", "jovian/fork_cut"}

    branch = lab.adopt("r91")
    assert not branch.success  # the lock cannot even be read for r91: it names no rev that parses
    message = failure_message(branch)
    assert "no source lock with release.version=r91" in message
    # file:line and value
    assert f"{lock_path('r91')}:" in message and "integration/glm53-r27-release-20260906" in message
    skipped = lab.tick(None)  # the sensor skips the unreadable lock, and still adopts the rest
    assert {r.partition_key for r in skipped.run_requests} == {"r27", "r90"}


def test_cli_previews_a_lock_and_a_dep_table(lab: Lab, tmp_path: Path) -> None:
    runner = CliRunner()
    lock_file = tmp_path / "r27.source.lock"
    lock_file.write_text(remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH))
    out = runner.invoke(lockstep_cli, ["lab", "lock", str(lock_file)])
    assert out.exit_code == 0 and json.loads(out.output)["packages"]["b12x"]["commit"]
    vllm = git.Repo.clone_from((lab.sb.repos / "vllm.git").as_uri(), tmp_path / "vllm")
    rows = json.loads(
        runner.invoke(lockstep_cli, ["lab", "dep-table", str(tmp_path / "vllm")]).output
    )
    assert {r["name"] for r in rows} >= {"cutlass", "flashmla", "flashkda", "triton"} and vllm
    lock_file.write_text(lock_file.read_text().replace("release.version=r27\n", ""))
    bad = runner.invoke(lockstep_cli, ["lab", "lock", str(lock_file)])
    assert bad.exit_code != 0 and f"{lock_file}" in bad.output and "release.version" in bad.output


def test_scattered_recipe_pins_and_stale_gb10_deviations_are_warnings_naming_file_and_line(
    lab: Lab, push_repo: Callable[..., str]
) -> None:
    def scatter(wt: Path) -> None:
        recipe = wt / RECIPE
        recipe.write_text(
            recipe.read_text() + 'VLLM_COMMIT = "62f6385c0000000000000000000000000000beef"\n'
        )
        deviations = wt / BUILD_DIR / "gb10-deviations.toml"
        deviations.write_text(
            deviations.read_text().replace('torch = "2.13.0"', 'torch = "2.12.0"')
        )

    push_repo(
        lab.build_repo,
        BUILD_BRANCH,
        scatter,
        "recipe: pin vLLM by hand; deviations from an older tree",
    )
    result = lab.adopt("r27")
    assert result.success and done(result) == ALL  # WARNs: the rev is still adopted
    recipe = remote_file(lab.build_repo, RECIPE, BUILD_BRANCH).splitlines()
    line = recipe.index('VLLM_COMMIT = "62f6385c0000000000000000000000000000beef"') + 1
    scattered = checks(result)["recipes_no_scattered_pins"]
    assert not scattered.passed and (scattered.description or "").startswith(
        f"{RECIPE}:{line}: [build.versions] overrides the profile's pins VLLM_COMMIT (line {line})"
    )
    stale = checks(result)["gb10_deviations_current"]
    assert not stale.passed and "re-evaluate the GB10 runtime deviations" in (
        stale.description or ""
    )
    assert f"torch 2.12.0 -> 2.13.0 ({BUILD_DIR}/gb10-deviations.toml:" in (stale.description or "")
