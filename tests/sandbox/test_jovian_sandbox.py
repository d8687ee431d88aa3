"""The Jovian half of the sandbox: real lab, fork, dependency
and build repos shaped like the runbook's world."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import git
import pytest
from click.testing import CliRunner

from lockstep.cli import main
from resources.errors import LockstepError
from resources.git import git_for
from resources.site.load import load_site
from sandbox.jovian_sources import LOCK_FORMAT, parse_lock
from sandbox.jovian_world import PACKAGES, REPOS, JovianRepos, lock_path, new_lab_rev
from sandbox.processes import command_lines
from sandbox.world import Sandbox, up

# the lab's real r35 lock
FIXTURE_LOCK = Path(__file__).resolve().parents[1] / "corpus" / "lab" / "r35.source.lock"
SHA = re.compile(r"^[0-9a-f]{40}$")
WINDOW_S = 30 * 60


def bare(url: str) -> git.Repo:
    """The bare repo behind a fork's URL: the forks and
    their deps are served by the sandbox's git daemon
    (a build clones them from inside an engine), read
    here from the base path of the daemon on that port."""
    parsed = urlparse(url)
    assert parsed.scheme == "git" and parsed.hostname == "127.0.0.1", url
    for _pid, argv in command_lines():
        if "daemon" in argv and f"--port={parsed.port}" in argv:
            base = next(
                a.removeprefix("--base-path=") for a in argv if a.startswith("--base-path=")
            )
            return git.Repo(Path(base) / unquote(parsed.path).lstrip("/"))
    raise AssertionError(f"no git daemon serves {url}")


def lab_lock(sb: Sandbox, rev: str) -> dict[str, str]:
    text = git.Repo(sb.repos / "rtx6kpro.git").git.show(f"master:{lock_path(rev)}")
    assert text.splitlines()[0] == f"format={LOCK_FORMAT}"
    return parse_lock(text)


def commit_time(lock: dict[str, str], pkg: str) -> datetime:
    return (
        bare(lock[f"{pkg}.repository"])
        .commit(lock[f"{pkg}.commit"])
        .committed_datetime.astimezone(UTC)
    )


def all_refs(sb: Sandbox) -> dict[str, str]:
    return {
        name: git.Repo(sb.repos / f"{name}.git").git.for_each_ref(
            "--format=%(objectname) %(refname)"
        )
        for name in REPOS
    }


def vllm_cmake(sb: Sandbox, commit: str) -> dict[str, str]:
    tree = git.Repo(sb.repos / "vllm.git").commit(commit).tree
    files = {"CMakeLists.txt": tree["CMakeLists.txt"].data_stream.read().decode()}
    for blob in tree["cmake/external_projects"].blobs:
        if blob.name.endswith(".cmake"):
            files[blob.path] = blob.data_stream.read().decode()
    return files


def cmake_deps(files: dict[str, str]) -> dict[str, tuple[str, str]]:
    """name -> (GIT_REPOSITORY, GIT_TAG) on the CUDA path,
    variables resolved: a test-sized dep-table reader."""
    top = files["CMakeLists.txt"]
    top_vars = dict(re.findall(r'set\((\w+) "([^"]*)"', top))
    deps: dict[str, tuple[str, str]] = {}
    for path, text in files.items():
        if path == "CMakeLists.txt":
            continue
        cuda = re.sub(
            r'if\(VLLM_GPU_LANG STREQUAL "HIP"\)(.*?)else\(\)(.*?)endif\(\)',
            r"\2",
            text,
            flags=re.DOTALL,
        )
        variables = {**top_vars, **dict(re.findall(r'set\((\w+) "([^"]*)"', cuda))}
        for name, body in re.findall(
            r"FetchContent_(?:Declare|Populate)\(\s*(\w+)(.*?)\n\s*\)", cuda, re.DOTALL
        ):
            repo = re.search(r"GIT_REPOSITORY\s+(\S+)", body)
            tag = re.search(r"GIT_TAG\s+(\S+)", body)
            if repo and tag:
                deps[name] = (_resolve(repo.group(1), variables), _resolve(tag.group(1), variables))
    return deps


def _resolve(value: str, variables: dict[str, str]) -> str:
    """`value` with each ${NAME} replaced from `variables`."""
    return re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], value)


def fetch_deps_gates(sb: Sandbox) -> dict[str, tuple[str, str]]:
    script = git.Repo(sb.repos / "docker-images.git").git.show(
        "main:jovian-judgement/fetch-deps.sh"
    )
    return {
        name: (repo, tag)
        for name, repo, tag in re.findall(r"^gate (\S+)\s+(\S+)\s+(\S+)$", script, re.MULTILINE)
    }


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


# -- up -------------------------------------------------------------------------------------------


def test_up_creates_the_jovian_world_idempotently_and_the_site_points_at_it(sb: Sandbox) -> None:
    refs, site_text = all_refs(sb), sb.site_file.read_text()
    up(sb.root)
    assert all_refs(sb) == refs and sb.site_file.read_text() == site_text

    site = load_site(sb.site_file)
    j = site.jovian
    assert j is not None
    w = JovianRepos(repos=sb.repos)
    assert (j.lab_repo, j.lab_branch) == (w.url("rtx6kpro"), "master")
    assert (j.build_repo, j.build_branch, j.build_dir) == (
        w.url("docker-images"),
        "main",
        "jovian-judgement",
    )
    assert j.integration_branches == {
        "vllm": "integration/*",
        "b12x": "integration/*",
        "lmcache": "glm53-*",
    }
    assert j.cut_window_minutes == 30

    # A partial world is rebuilt, and the history is deterministic: the same shas come back.
    shutil.rmtree(sb.repos / "b12x.git")
    up(sb.root)
    assert all_refs(sb) == refs


def test_up_adds_the_jovian_table_to_an_older_sandbox_site(tmp_path: Path) -> None:
    sb = up(tmp_path / "sb")
    text = sb.site_file.read_text()
    sb.site_file.write_text(text[: text.index("[jovian]")])
    assert load_site(sb.site_file).jovian is None
    up(sb.root)
    assert load_site(sb.site_file).jovian is not None


# -- r27: the first rev, a clean cut --------------------------------------------------------------


def test_r27_lock_is_a_clean_cut_with_real_trees_and_every_fixture_key(sb: Sandbox) -> None:
    lock = lab_lock(sb, "r27")
    assert lock["release.version"] == "r27" and lock["release.name"].endswith("-r27")
    fixture_keys = set(parse_lock(FIXTURE_LOCK.read_text()))
    assert fixture_keys <= set(lock), sorted(fixture_keys - set(lock))
    assert "=" in lock["runtime.launcher.env"]  # values may hold '=' after the first one

    times = []
    for pkg in PACKAGES:
        repo = bare(lock[f"{pkg}.repository"])
        commit = lock[f"{pkg}.commit"]
        assert lock[f"{pkg}.tree"] == repo.git.rev_parse(f"{commit}^{{tree}}")
        assert lock[f"{pkg}.package.tree"] == repo.git.rev_parse(f"{commit}:{pkg}")
        assert re.fullmatch(r"[0-9a-f]{64}", lock[f"{pkg}.bundle.sha256"])
        times.append(commit_time(lock, pkg))
    assert (max(times) - min(times)).total_seconds() <= WINDOW_S
    assert lock["vllm.version"] == f"0.26.1rc0+glm53.r27.vllm{lock['vllm.commit'][:8]}"
    assert lock["lmcache.version"].endswith(lock["lmcache.commit"][:8])
    kda = git.Repo(sb.repos / "flashkda.git")
    assert kda.commit(lock["flashkda.base.commit"]).hexsha == lock["flashkda.base.commit"]
    vllm = git.Repo(sb.repos / "vllm.git")
    assert lock["vllm.native.cmake.tree"] == vllm.git.rev_parse(f"{lock['vllm.commit']}:cmake")

    # Each pin is the tip of an integration branch the
    # site's globs find (through lockstep's own git).
    site = load_site(sb.site_file)
    assert site.jovian is not None
    remotes = git_for(site, cache_dir=str(sb.root / "cache"), timeout_s=60)
    for pkg in PACKAGES:
        url = lock[f"{pkg}.repository"]
        heads = remotes.ls_remote_heads(url=url, pattern=site.jovian.integration_branches[pkg])
        assert lock[f"{pkg}.commit"] in heads.values(), (pkg, heads)
        assert remotes.tree_of(url=url, sha=lock[f"{pkg}.commit"]) == lock[f"{pkg}.tree"]
    assert "main" in remotes.ls_remote_heads(url=lock["vllm.repository"])
    assert "integration/glm53-r27-release-20260906" in remotes.ls_remote_heads(
        url=lock["vllm.repository"]
    )


def test_flashmla_pin_vendors_cutlass_as_a_real_gitlink(sb: Sandbox, tmp_path: Path) -> None:
    lock = lab_lock(sb, "r27")
    deps = cmake_deps(vllm_cmake(sb, lock["vllm.commit"]))
    url, pin = deps["flashmla"]
    flashmla = bare(url)
    entry = flashmla.git.ls_tree(pin, "csrc/cutlass")
    mode, kind, target = entry.split("\t")[0].split()
    assert (mode, kind) == ("160000", "commit")
    cutlass = git.Repo(sb.repos / "cutlass.git")
    assert cutlass.commit(target).hexsha == target
    assert f"url = {JovianRepos(repos=sb.repos).url('cutlass')}" in flashmla.git.show(
        f"{pin}:.gitmodules"
    )

    # A plain clone leaves the gitlink an empty dir; `submodule update` really populates it.
    wt = tmp_path / "flashmla"
    repo = git.Repo.clone_from(url, wt)
    repo.git.checkout(pin)
    assert (wt / "csrc/cutlass").is_dir() and not any((wt / "csrc/cutlass").iterdir())
    repo.git.execute(["git", "-c", "protocol.file.allow=always", "submodule", "update", "--init"])
    assert (wt / "csrc/cutlass/.git").exists()
    assert git.Repo(wt / "csrc/cutlass").head.commit.hexsha == target


def test_vllm_cmake_uses_the_real_patterns(sb: Sandbox) -> None:
    lock = lab_lock(sb, "r27")
    files = vllm_cmake(sb, lock["vllm.commit"])
    text = "\n".join(files.values())
    assert 'set(CUTLASS_REVISION "v4.4.2"' in files["CMakeLists.txt"]
    assert "GIT_TAG ${CUTLASS_REVISION}" in text and "$ENV{VLLM_CUTLASS_SRC_DIR}" in text
    assert re.search(
        (
            r"GIT_REPOSITORY git://\S+/flashmla\.git\s+GIT_TAG [0-9a-f]{40}\s+GIT_SUBMODULES "
            r"\"csrc/cutlass\""
        ),
        text,
    )
    assert (
        'set(_FLASHKDA_UPSTREAM_REPO "git://' in text
        and "GIT_TAG ${_FLASHKDA_UPSTREAM_TAG}" in text
    )
    hip = re.search(
        (
            r'if\(VLLM_GPU_LANG STREQUAL "HIP"\)\s+set\(TRITON_GIT '
            r'"(\S+)"\)\s+else\(\)\s+set\(TRITON_GIT "(\S+)"\)'
        ),
        text,
    )
    assert (
        hip and hip.group(1).endswith("/triton-rocm.git") and hip.group(2).endswith("/triton.git")
    )
    assert text.count("FetchContent_Populate(") == 1

    deps = cmake_deps(files)
    assert sorted(deps) == ["cutlass", "flashkda", "flashmla", "triton"]
    for name, (url, tag) in deps.items():
        target = bare(url)
        assert target.commit(tag).hexsha if SHA.match(tag) else target.tags[tag].commit.hexsha, (
            name,
            tag,
        )
    assert deps["triton"][1] == "v3.5.1" and deps["cutlass"][1] == "v4.4.2"
    assert (
        bare(deps["triton"][0]).tags["v3.5.1"]
        and git.Repo(sb.repos / "triton-rocm.git").tags["v3.5.1"]
    )


# -- the build repo -------------------------------------------------------------------------------


def test_build_repo_holds_the_r27_contract(sb: Sandbox, tmp_path: Path) -> None:
    build = git.Repo(sb.repos / "docker-images.git")
    lock = lab_lock(sb, "r27")
    env = dict(
        line.split("=", 1)
        for line in build.git.show("main:jovian-judgement/versions.env").splitlines()
        if line and not line.startswith("#")
    )
    site = load_site(sb.site_file)
    assert site.jovian is not None
    for lock_key, env_key in site.jovian.versions_keys.items():
        assert env[env_key] == lock[lock_key], env_key
    assert (env["CUDA_VERSION"], env["TORCH_VERSION"]) == ("13.2", "2.13.0")
    files = build.git.ls_tree("-r", "--name-only", "main").splitlines()
    for path in (
        "jovian-judgement/Dockerfile",
        "jovian-judgement/build.sh",
        "jovian-judgement/profiles/.keep",
        "jovian-judgement/fetch-deps.sh",
    ):
        assert path in files

    recipe_text = build.git.show("main:recipes/glm53-2x/recipe.toml")
    recipe = tomllib.loads(recipe_text)
    assert recipe["docker_image"] == "jovian-judgement:r27-glm53"
    assert (recipe["docker_image_dir"], recipe["build_profile"]) == ("jovian-judgement", "r27")
    at = {
        k: re.search(rf"^{re.escape(k)}", recipe_text, re.MULTILINE).start()  # type: ignore[union-attr]
        for k in ("build_profile =", "[[extra_mounts]]", "[build.versions]")
    }
    assert at["build_profile ="] < at["[[extra_mounts]]"] < at["[build.versions]"]
    assert (
        all("build_profile" not in m for m in recipe["extra_mounts"])
        and "versions" in recipe["build"]
    )

    # The gate list is the r27 tree's CUDA-path cmake deps, by name, repository and tag...
    assert fetch_deps_gates(sb) == cmake_deps(vllm_cmake(sb, lock["vllm.commit"]))
    # ...and the script really clones them at their pins, gitlinks populated.
    src = tmp_path / "vllm"
    git.Repo.clone_from(lock["vllm.repository"], src).git.checkout(lock["vllm.commit"])
    script = tmp_path / "fetch-deps.sh"
    script.write_text(build.git.show("main:jovian-judgement/fetch-deps.sh") + "\n")
    done = subprocess.run(
        ["bash", str(script)],
        env={
            "PATH": "/usr/bin:/bin",
            "VLLM_SRC": str(src),
            "DEPS": str(tmp_path / "deps"),
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "deps/flashmla/csrc/cutlass/.git").exists()


# -- moving upstream ------------------------------------------------------------------------------


def test_new_lab_rev_is_a_later_clean_cut(sb: Sandbox) -> None:
    r27 = lab_lock(sb, "r27")
    rev = new_lab_rev(sb.root, "r28")
    lab = git.Repo(sb.repos / "rtx6kpro.git")
    assert lab.commit("master").hexsha == rev.lab_commit
    assert rev.lock_path == "models/glm-5.3-flash/build/r28.source.lock"
    assert rev.lock_path in lab.git.ls_tree("-r", "--name-only", "master").splitlines()
    r28 = lab_lock(sb, "r28")
    assert rev.pins == {p: r28[f"{p}.commit"] for p in PACKAGES}

    newest27 = max(commit_time(r27, p) for p in PACKAGES)
    times = [commit_time(r28, p) for p in PACKAGES]
    assert all(r28[f"{p}.commit"] != r27[f"{p}.commit"] for p in PACKAGES)
    assert min(times) > newest27 and (max(times) - min(times)).total_seconds() <= 120
    for pkg in PACKAGES:
        repo = bare(r28[f"{pkg}.repository"])
        assert r28[f"{pkg}.tree"] == repo.git.rev_parse(f"{r28[f'{pkg}.commit']}^{{tree}}")
        assert repo.is_ancestor(r27[f"{pkg}.commit"], r28[f"{pkg}.commit"])
    assert r28["vllm.version"] == f"0.26.1rc0+glm53.r28.vllm{rev.pins['vllm'][:8]}"
    assert rev.branches["vllm"].startswith("integration/glm53-r28-release-")

    later = new_lab_rev(sb.root, "r29")
    assert min(later.committed_at.values()) > max(rev.committed_at.values())
    with pytest.raises(LockstepError, match="already has"):
        new_lab_rev(sb.root, "r28")


def test_half_cut_keeps_b12x_and_lmcache_at_the_previous_pins(sb: Sandbox) -> None:
    r27 = lab_lock(sb, "r27")
    rev = new_lab_rev(sb.root, "r28", half_cut=True)
    r28 = lab_lock(sb, "r28")
    assert rev.half_cut and rev.previous == "r27"
    assert r28["vllm.commit"] != r27["vllm.commit"]
    vllm_at = commit_time(r28, "vllm")
    for pkg in ("b12x", "lmcache"):
        for key in ("repository", "commit", "tree", "package.tree", "bundle.sha256"):
            assert r28[f"{pkg}.{key}"] == r27[f"{pkg}.{key}"]
        assert (vllm_at - commit_time(r28, pkg)).total_seconds() > 3 * 60 * 60
        # Upstream moved on: the skipped fixes sit on the branch past the held pin.
        repo = bare(r28[f"{pkg}.repository"])
        assert (
            int(repo.git.rev_list("--count", f"{r28[f'{pkg}.commit']}..{rev.branches[pkg]}")) >= 2
        )


def test_move_dep_moves_the_vllm_trees_cmake_pins(sb: Sandbox) -> None:
    rev = new_lab_rev(sb.root, "r28", move_dep=True)
    deps = cmake_deps(vllm_cmake(sb, rev.pins["vllm"]))
    gates = fetch_deps_gates(sb)
    assert deps["flashmla"][1] == rev.moved_deps["flashmla"] != gates["flashmla"][1]
    assert deps["cutlass"][1] == "v4.7.1" != gates["cutlass"][1]
    assert deps["flashkda"] == gates["flashkda"] and deps["triton"] == gates["triton"]
    flashmla = bare(deps["flashmla"][0])
    link = flashmla.git.ls_tree(deps["flashmla"][1], "csrc/cutlass").split()[2]
    assert link == git.Repo(sb.repos / "cutlass.git").tags["v4.7.1"].commit.hexsha


def test_cli_new_lab_rev_prints_the_lab_commit_and_lock_path(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    sha, path = run("sandbox", "new-lab-rev", "r28", "--dir", str(root)).split()
    lab = git.Repo(root / "repos/rtx6kpro.git")
    assert sha == lab.commit("master").hexsha and path == lock_path("r28")
    assert "release.version=r28" in lab.git.show(f"master:{path}")

    _sha29, _ = run("sandbox", "new-lab-rev", "r29", "--half-cut", "--dir", str(root)).split()
    r28, r29 = (parse_lock(lab.git.show(f"master:{lock_path(r)}")) for r in ("r28", "r29"))
    assert r29["b12x.commit"] == r28["b12x.commit"] and r29["vllm.commit"] != r28["vllm.commit"]

    again = CliRunner().invoke(main, ["sandbox", "new-lab-rev", "r29", "--dir", str(root)])
    assert again.exit_code != 0 and "already has" in again.output
