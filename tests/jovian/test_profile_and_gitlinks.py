"""Profile writing rules, the recipe TOML trap, the fork-cut findings and the empty-gitlink gate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jovian_assets.dep_trees import gitlinks_populated, relative_submodule_url, submodule_urls
from jovian_assets.fork_cut import NEWER_CUT, ONE_CUT, PINS_REACHABLE, TREES_MATCH, findings
from jovian_assets.models import BranchTip, DepTree, ForkCut, PackageCut
from jovian_assets.profile import parse_env, plan_profile, recipe_finding, recipe_profile_placement
from jovian_assets.source_lock import parse_source_lock
from resources.errors import FileFormatError
from resources.site.jovian import DEFAULT_REPOSITORY_KEYS
from tests.support.jovian.source_lock import R35_PATH

GOOD_RECIPE = """name = "glm53-2x"
docker_image = "jovian-judgement:r35-glm53"
build_profile = "r35"

[[extra_mounts]]
source = "~/sm121-cache/jit-121f"
target = "/root/.cache"

[build.versions]
VLLM_COMMIT = "x"
"""

TRAP_RECIPE = """name = "glm53-2x"
docker_image = "jovian-judgement:r35-glm53"

[[extra_mounts]]
source = "~/sm121-cache/jit-121f"
target = "/root/.cache"

[[extra_mounts]]
source = "~/models"
target = "/models"
build_profile = "r35"
"""


def test_top_level_build_profile_passes() -> None:
    finding = recipe_profile_placement(GOOD_RECIPE, "recipes/glm53-2x/recipe.toml")
    assert finding is not None and finding.passed


def test_build_profile_after_extra_mounts_is_the_toml_trap_and_names_file_and_line() -> None:
    finding = recipe_profile_placement(TRAP_RECIPE, "recipes/glm53-2x/recipe.toml")
    assert finding is not None and not finding.passed
    assert finding.description.startswith(
        "recipes/glm53-2x/recipe.toml:11: build_profile sits after [[extra_mounts]] (line 8)"
    )
    assert (
        "extra_mounts[1]" in finding.description
        and "silently builds with the base pins" in finding.description
    )


def test_recipe_without_build_profile_is_not_judged() -> None:
    assert recipe_profile_placement('name = "x"\n', "r.toml") is None


def test_versions_env_parsing_names_bad_lines() -> None:
    env = parse_env('# pins\nVLLM_COMMIT=abc\nexport B12X_TREE="def"\n\n', "versions.env")
    assert env == {"VLLM_COMMIT": ("abc", 2), "B12X_TREE": ("def", 3)}
    with pytest.raises(FileFormatError, match=r"^versions.env:2: not a KEY=VAL line"):
        parse_env("A=1\nthis is not\n", "versions.env")
    with pytest.raises(
        FileFormatError, match=r"^versions.env:2: A is set again \(first on line 1\)"
    ):
        parse_env("A=1\nA=2\n", "versions.env")


T0 = datetime(2026, 9, 8, 12, 0, tzinfo=UTC)


def _pkg(
    name: str,
    minutes: float,
    *,
    tree_ok: bool = True,
    error: str | None = None,
    branches: list[BranchTip] | None = None,
) -> PackageCut:
    return PackageCut(
        name=name,
        repository=f"file:///{name}.git",
        commit="c" * 40,
        lock_tree="t" * 40,
        tree=None if error else ("t" * 40 if tree_ok else "u" * 40),
        error=error,
        committed_at=None if error else T0 + timedelta(minutes=minutes),
        branches=branches or [],
    )


def test_half_cut_fails_one_cut_with_the_spread_in_minutes() -> None:
    cut = ForkCut(
        rev="r28",
        window_minutes=30,
        packages=[_pkg("vllm", 180), _pkg("b12x", 0), _pkg("lmcache", 1)],
    )
    one = findings(cut)[ONE_CUT]
    assert not one.passed
    assert "span 180 minutes" in one.description and "b12x 180 min before vllm" in one.description


def test_clean_cut_passes_and_newer_branch_warns() -> None:
    ahead = BranchTip(name="integration/glm53-r29", tip="d" * 40, ahead=3, behind=0)
    cut = ForkCut(
        rev="r28",
        window_minutes=30,
        packages=[_pkg("vllm", 0, branches=[ahead]), _pkg("b12x", 2), _pkg("lmcache", 1)],
    )
    out = findings(cut)
    assert out[ONE_CUT].passed and out[TREES_MATCH].passed and out[PINS_REACHABLE].passed
    assert (
        not out[NEWER_CUT].passed
        and "integration/glm53-r29 is 3 commit(s) past the pin" in out[NEWER_CUT].description
    )


def test_tree_mismatch_and_unreachable_pin_fail() -> None:
    cut = ForkCut(
        rev="r28",
        window_minutes=30,
        packages=[_pkg("vllm", 0, tree_ok=False), _pkg("b12x", 0, error="cannot reach x")],
    )
    out = findings(cut)
    assert not out[TREES_MATCH].passed and "vllm" in out[TREES_MATCH].description
    assert not out[PINS_REACHABLE].passed and "cannot reach x" in out[PINS_REACHABLE].description


def test_empty_gitlink_dir_fails_gate(tmp_path: Path) -> None:
    # what a plain clone leaves: an empty dir
    (tmp_path / "flashmla/csrc/cutlass").mkdir(parents=True)
    (tmp_path / "flashmla/third_party/ok").mkdir(parents=True)
    (tmp_path / "flashmla/third_party/ok/.git").write_text("gitdir: /somewhere\n")
    tree = DepTree(
        name="flashmla",
        repository="x",
        tag="y",
        commit="c" * 40,
        path=str(tmp_path / "flashmla"),
        gitlinks={"csrc/cutlass": "a" * 40, "third_party/ok": "b" * 40},
    )
    finding = gitlinks_populated([tree])
    assert not finding.passed and "flashmla/csrc/cutlass is EMPTY" in finding.description
    assert "third_party/ok" not in finding.description
    (tmp_path / "flashmla/csrc/cutlass/include").mkdir()
    (tmp_path / "flashmla/csrc/cutlass/include/cutlass.h").write_text("//")
    assert gitlinks_populated([tree]).passed  # a checked-out tree counts too


def test_relative_submodule_urls_resolve_against_the_parent() -> None:
    text = (
        '[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = ../cutlass.git\n[submodule '
        '"x"]\n\tpath = x\n\turl = https://h/o/x.git\n'
    )
    assert submodule_urls(text, "file:///r/flashmla.git") == {
        "csrc/cutlass": "file:///r/cutlass.git",
        "x": "https://h/o/x.git",
    }


def test_relative_submodule_urls_resolve_as_git_does_under_every_scheme() -> None:
    # urljoin leaves `../cutlass.git` as it is under ssh:// and git://: the gitlink would be refused
    # as "not a URL" on a site that fetches its forks over ssh.
    text = '[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = ../cutlass.git\n'
    for parent, want in [
        (
            "ssh://git@github.com/vllm-project/flashmla.git",
            "ssh://git@github.com/vllm-project/cutlass.git",
        ),
        ("git://127.0.0.1:9418/flashmla.git", "git://127.0.0.1:9418/cutlass.git"),
        (
            "https://github.com/vllm-project/flashmla.git/",
            "https://github.com/vllm-project/cutlass.git",
        ),
        ("git@github.com:vllm-project/flashmla.git", "git@github.com:vllm-project/cutlass.git"),
        ("git@github.com:flashmla.git", "git@github.com:cutlass.git"),
    ]:
        assert submodule_urls(text, parent) == {"csrc/cutlass": want}, parent
    assert relative_submodule_url("https://h/o/a.git", "./sub.git") == "https://h/o/a.git/sub.git"
    assert relative_submodule_url("https://h/o/a.git", "../../x.git") == "https://h/x.git"
    with pytest.raises(FileFormatError, match=r"\.gitmodules:3: .*'\.\./\.\./x\.git' is not a URL"):
        # above the host
        submodule_urls(text.replace("../cutlass.git", "../../x.git"), "ssh://h/a.git")


def test_a_fork_from_another_owner_moves_its_repo_url_with_its_commit_when_versions_env_pins_urls() -> (  # noqa: E501
    None
):
    lock = parse_source_lock(R35_PATH.read_text(), "r35.source.lock")
    b12x = lock.packages["b12x"]
    base = {"B12X_COMMIT": ("0" * 40, 1), "B12X_REPO": ("https://github.com/old-owner/b12x.git", 2)}
    diff, unknown = plan_profile(
        lock, base, {"b12x.commit": "B12X_COMMIT"}, DEFAULT_REPOSITORY_KEYS
    )
    assert not unknown
    assert {d.key: d.profile for d in diff} == {
        "B12X_COMMIT": b12x.commit,
        "B12X_REPO": b12x.repository,
    }
    # A versions.env that pins no URLs is not an error: the commit alone moves.
    diff, unknown = plan_profile(
        lock,
        {"B12X_COMMIT": ("0" * 40, 1)},
        {"b12x.commit": "B12X_COMMIT"},
        DEFAULT_REPOSITORY_KEYS,
    )
    assert not unknown and [d.key for d in diff] == ["B12X_COMMIT"]


def test_env_values_are_read_as_bash_assigns_them() -> None:
    text = (
        "A='12.1a 12.0'\nB=\"x y\"\nC=plain # a comment\nD=\nE=a#b\nexport F='$literal'\nG=a\\ b\n"
    )
    assert {k: v for k, (v, _) in parse_env(text, "versions.env").items()} == {
        "A": "12.1a 12.0",
        "B": "x y",
        "C": "plain",
        "D": "",
        "E": "a#b",
        "F": "$literal",
        "G": "a b",
    }


def test_profile_values_are_shell_quoted_and_read_back_exactly() -> None:
    from jovian_assets.models import ProfileDiff
    from jovian_assets.profile import render_profile

    # a URL check lets this through; the profile must keep it a literal
    odd = "https://h/o/$(id)`x`;y.git"
    diff = [
        ProfileDiff(key="VLLM_REPO", base="x", profile=odd),
        ProfileDiff(key="VLLM_COMMIT", base="x", profile="a" * 40),
    ]
    text = render_profile(
        rev="r35",
        lab_commit="c" * 40,
        lock_path="locks/r35\nVLLM_COMMIT=evil.source.lock",
        diff=diff,
    )
    env = parse_env(text, "profiles/r35.env")
    assert env["VLLM_REPO"][0] == odd and env["VLLM_COMMIT"][0] == "a" * 40
    assert f"VLLM_COMMIT={'a' * 40}\n" in text  # plain pins are written as they are
    assert len(env) == 2  # a newline in the lock's path did not become a profile line


def test_a_recipe_that_cannot_be_read_fails_the_recipes_check_naming_file_and_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "recipes/x").mkdir(parents=True)
    (tmp_path / "recipes/x/recipe.toml").write_text('name = "x"\nbuild_profile = 42\n')
    finding = recipe_finding(tmp_path, "recipes/x/recipe.toml")
    assert finding is not None and not finding.passed
    assert finding.description == "recipes/x/recipe.toml:2: build_profile must be text, got int 42"


def test_gitmodules_is_read_as_git_reads_it() -> None:
    text = (
        '# vendored\n[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = '
        '"https://h/o/cutlass.git" ; pinned\n'
        '[submodule "x"]\n\tpath = x\n\tURL = ../x.git\n'
    )
    assert submodule_urls(text, "https://h/o/flashmla.git") == {
        "csrc/cutlass": "https://h/o/cutlass.git",
        "x": "https://h/o/x.git",
    }
