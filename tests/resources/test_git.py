"""GitRemotes against real bare repositories: mirrors,
fetch by sha, ancestry, fast-forward-only push."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import git
import pytest

import resources.git as gitmod
from resources.git import (
    GitError,
    GitInputRefused,
    GitRemotes,
    NonFastForward,
    RemoteUnreachable,
    Worktree,
)
from resources.names import ref_problem
from tests.support.git_upstream import BRANCH, LOCAL, Upstream
from tests.support.hostile import HOSTILE_NAMES, HOSTILE_URLS
from tests.support.report import count


@pytest.fixture
def up(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


@pytest.fixture
def remotes(tmp_path: Path) -> GitRemotes:
    return GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=30, url_schemes=LOCAL)


def test_ls_remote_tip_and_missing_branch(up: Upstream, remotes: GitRemotes) -> None:
    sha = up.commit("a", "1")
    assert remotes.ls_remote(url=up.url, branch=BRANCH) == sha
    assert remotes.ls_remote(url=up.url, branch="no/such") is None


def test_unreachable_remote_is_named(remotes: GitRemotes, tmp_path: Path) -> None:
    url = (tmp_path / "missing.git").as_uri()
    with pytest.raises(RemoteUnreachable, match=f"cannot reach {url}"):
        remotes.ls_remote(url=url, branch=BRANCH)


def test_credentials_in_urls_never_reach_the_error(remotes: GitRemotes) -> None:
    with pytest.raises(GitError) as info:
        remotes.ls_remote(url="https://bot:ghp_TopSecret99@127.0.0.1:9/x.git", branch=BRANCH)
    assert "ghp_TopSecret99" not in str(info.value) and "***@127.0.0.1" in str(info.value)


def test_every_call_has_a_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An ssh transport that never answers stands in for a hung remote.
    monkeypatch.setitem(gitmod._GIT_ENV, "GIT_SSH_COMMAND", "sh -c 'sleep 30'")
    slow = GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=1)
    with pytest.raises(RemoteUnreachable, match="did not complete in 1 secs"):
        slow.ls_remote(url="ssh://git@127.0.0.1/never.git", branch=BRANCH)


def test_shallow_fetch_of_an_exact_sha_then_ancestry(up: Upstream, remotes: GitRemotes) -> None:
    old = up.commit("a", "1")
    mid = up.commit("a", "2")
    new = up.commit("b", "3")
    mirror = remotes.fetch(url=up.url, shas=[mid], depth=1)
    repo = git.Repo(mirror)
    assert repo.commit(mid).hexsha == mid and (mirror / "shallow").exists()
    assert remotes.is_ancestor(url=up.url, ancestor=old, descendant=new)
    assert not remotes.is_ancestor(url=up.url, ancestor=new, descendant=old)


def test_one_mirror_per_remote_is_reused(up: Upstream, remotes: GitRemotes, tmp_path: Path) -> None:
    a = up.commit("a", "1")
    first = remotes.fetch(url=up.url, shas=[a])
    b = up.commit("a", "2")
    second = remotes.fetch(url=up.url, shas=[b])
    assert first == second and len(list((tmp_path / "cache").glob("*.git"))) == 1
    assert git.Repo(second).commit(a) and git.Repo(second).commit(b)


def test_fetch_refuses_an_abbreviated_sha(up: Upstream, remotes: GitRemotes) -> None:
    sha = up.commit("a", "1")
    with pytest.raises(GitError, match="not a full 40-hex"):
        remotes.fetch(url=up.url, shas=[sha[:8]])


def test_commit_info_and_show_file(up: Upstream, remotes: GitRemotes) -> None:
    sha = up.commit("a.txt", "hello\n")
    info = remotes.commit_info(url=up.url, sha=sha)
    assert info.sha == sha and info.summary == "edit a.txt" and info.author == "u <u@x>"
    assert info.tree == git.Repo(up.bare).commit(sha).tree.hexsha
    assert remotes.show_file(url=up.url, sha=sha, path="a.txt") == "hello"
    assert remotes.show_file(url=up.url, sha=sha, path="missing.txt") is None


def test_push_is_fast_forward_only(up: Upstream, remotes: GitRemotes) -> None:
    base = up.commit("a", "1")
    with remotes.checkout(url=up.url, branch=BRANCH) as wt:
        assert wt.base_sha == base and (wt.path / "a").read_text() == "1"
        (wt.path / "a").write_text("2")
        new = remotes.commit_all(worktree=wt, message="bump", author="lockstep <l@x>", paths=["a"])
        assert remotes.push_fast_forward(worktree=wt) == new
    assert git.Repo(up.bare).commit(BRANCH).hexsha == new
    assert git.Repo(up.bare).commit(BRANCH).parents[0].hexsha == base


def test_push_refuses_when_the_remote_moved(up: Upstream, remotes: GitRemotes) -> None:
    up.commit("a", "1")
    with remotes.checkout(url=up.url, branch=BRANCH) as wt:
        (wt.path / "a").write_text("mine")
        remotes.commit_all(worktree=wt, message="mine", author="lockstep <l@x>", paths=["a"])
        theirs = up.commit("b", "theirs")
        with pytest.raises(NonFastForward, match="moved from .* nothing was pushed"):
            remotes.push_fast_forward(worktree=wt)
    assert git.Repo(up.bare).commit(BRANCH).hexsha == theirs


def test_push_refuses_history_that_does_not_descend_from_the_tip(
    up: Upstream, remotes: GitRemotes
) -> None:
    up.commit("a", "1")
    tip = up.commit("a", "2")
    with remotes.checkout(url=up.url, branch=BRANCH) as wt:
        git.Repo(wt.path).git.reset("--hard", "HEAD~1")  # rewrite: a force-push in disguise
        (wt.path / "c").write_text("x")
        remotes.commit_all(worktree=wt, message="rewrite", author="lockstep <l@x>", paths=["c"])
        with pytest.raises(NonFastForward, match="does not descend"):
            remotes.push_fast_forward(worktree=wt)
    assert git.Repo(up.bare).commit(BRANCH).hexsha == tip


def test_checkout_of_an_exact_sha_and_cleanup(up: Upstream, remotes: GitRemotes) -> None:
    first = up.commit("a", "1")
    up.commit("a", "2")
    with remotes.checkout(url=up.url, sha=first) as wt:
        assert (wt.path / "a").read_text() == "1"
        path = wt.path
    assert not path.exists()


def test_heads_by_pattern_tags_trees_and_ahead_behind(up: Upstream, remotes: GitRemotes) -> None:
    pin = up.commit("a", "1")
    up.work.git.push(up.url, "HEAD:refs/heads/integration/glm53-r27")
    up.work.create_tag("v1.0", message="annotated")
    up.work.git.push(up.url, "v1.0")
    ahead = up.commit("a", "2")
    up.work.git.push(up.url, "HEAD:refs/heads/integration/glm53-r28")
    heads = remotes.ls_remote_heads(url=up.url, pattern="integration/*")
    assert heads == {"integration/glm53-r27": pin, "integration/glm53-r28": ahead}
    assert remotes.ls_remote_tag(url=up.url, tag="v1.0") == pin  # peeled to the commit
    assert remotes.ls_remote_tag(url=up.url, tag="nope") is None
    assert remotes.tree_of(url=up.url, sha=pin) == git.Repo(up.bare).commit(pin).tree.hexsha
    assert remotes.ahead_behind(url=up.url, base=pin, tip=ahead) == (1, 0)
    assert remotes.ahead_behind(url=up.url, base=ahead, tip=pin) == (0, 1)


def test_list_files_gitlinks_and_materialize(
    up: Upstream, remotes: GitRemotes, tmp_path: Path
) -> None:
    dep = Upstream(tmp_path / "dep")
    dep_sha = dep.commit("lib.h", "x")
    up.work.git.execute(
        [
            "git",
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            dep.url,
            "csrc/cutlass",
        ]
    )
    (Path(up.work.working_dir) / "models").mkdir()
    (Path(up.work.working_dir) / "models/r1.source.lock").write_text("format=x\n")
    up.work.git.add("-A")
    sha = up.commit("README", "r")
    files = remotes.list_files(url=up.url, sha=sha, pattern="**/*.source.lock")
    assert list(files) == ["models/r1.source.lock"]
    assert remotes.gitlinks(url=up.url, sha=sha) == {"csrc/cutlass": dep_sha}
    dest = remotes.materialize(url=up.url, sha=sha, dest=tmp_path / "trees" / "up")
    assert (dest / "README").read_text() == "r" and (dest / "csrc/cutlass").is_dir()
    # a gitlink checks out as an EMPTY dir: the trap
    assert not any((dest / "csrc/cutlass").iterdir())
    # replacing an existing checkout works
    again = remotes.materialize(url=up.url, sha=sha, dest=dest)
    assert (again / ".git").is_file() and remotes.mirror_bytes(url=up.url) > 0


# -- outside input reaches git only as data --------------------------------------------------------

SHA = "a" * 40


def _every_url_call(
    remotes: GitRemotes, url: str, tmp_path: Path
) -> dict[str, Callable[[], object]]:
    """Each public GitRemotes method that takes a URL,
    called with `url` and otherwise good arguments."""
    wt = Worktree.model_construct(path=tmp_path, url=url, branch=BRANCH, base_sha=SHA)

    def checkout(**kw: str) -> None:
        with remotes.checkout(url=url, **kw):
            pass

    return {
        "ls_remote": lambda: remotes.ls_remote(url=url, branch=BRANCH),
        "ls_remote_heads": lambda: remotes.ls_remote_heads(url=url),
        "ls_remote_tag": lambda: remotes.ls_remote_tag(url=url, tag="v1"),
        "fetch": lambda: remotes.fetch(url=url, shas=[SHA]),
        "is_ancestor": lambda: remotes.is_ancestor(url=url, ancestor=SHA, descendant=SHA),
        "tree_of": lambda: remotes.tree_of(url=url, sha=SHA),
        "ahead_behind": lambda: remotes.ahead_behind(url=url, base=SHA, tip=SHA),
        "list_files": lambda: remotes.list_files(url=url, sha=SHA, pattern="*"),
        "gitlinks": lambda: remotes.gitlinks(url=url, sha=SHA),
        "materialize": lambda: remotes.materialize(
            url=url, sha=SHA, dest=remotes.trees_dir() / "x"
        ),
        "resolve_commit": lambda: remotes.resolve_commit(url=url, rev="abc1234", branch=BRANCH),
        "commit_info": lambda: remotes.commit_info(url=url, sha=SHA),
        "short_sha": lambda: remotes.short_sha(url=url, sha=SHA, branch=BRANCH),
        "show_file": lambda: remotes.show_file(url=url, sha=SHA, path="uv.lock"),
        "checkout_branch": lambda: checkout(branch=BRANCH),
        "checkout_sha": lambda: checkout(sha=SHA),
        "push_fast_forward": lambda: remotes.push_fast_forward(worktree=wt),
    }


@pytest.fixture
def no_git_runs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any git process (GitPython's or a bare subprocess)
    fails the test: refusals come before them."""
    started: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        started.append(args)
        raise AssertionError(f"a process was started: {args!r}")

    monkeypatch.setattr(git.cmd.Git, "execute", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    return started


def test_a_hostile_url_reaches_no_git_call(
    remotes: GitRemotes, tmp_path: Path, no_git_runs: list[object]
) -> None:
    marker = tmp_path / "pwned"
    urls = [f"--upload-pack=touch {marker}", *HOSTILE_URLS]
    tried = 0
    for url in urls:
        for call in _every_url_call(remotes, url, tmp_path).values():
            with pytest.raises(GitInputRefused, match="no git command was run"):
                call()
            tried += 1
    assert not no_git_runs and not marker.exists() and not Path("/tmp/lockstep-pwned").exists()
    assert not (tmp_path / "cache").exists()  # not even a mirror directory was made
    count("hostile URLs refused (git)", tried)


def test_a_scheme_the_site_does_not_allow_is_refused_before_git(
    tmp_path: Path, up: Upstream, no_git_runs: list[object]
) -> None:
    strict = GitRemotes(cache_dir=str(tmp_path / "cache"))  # the defaults: https and ssh
    with pytest.raises(GitInputRefused, match="uses 'file'; this site allows https, ssh"):
        strict.ls_remote(url=up.url, branch=BRANCH)
    assert not no_git_runs


@pytest.mark.parametrize("name", [n for n in HOSTILE_NAMES if ref_problem(n)])
def test_a_hostile_branch_or_tag_reaches_no_git_call(
    name: str, remotes: GitRemotes, tmp_path: Path, no_git_runs: list[object]
) -> None:
    url = "https://example.invalid/harbor.git"
    wt = Worktree.model_construct(path=tmp_path, url=url, branch=name, base_sha=SHA)
    calls = [
        lambda: remotes.ls_remote(url=url, branch=name),
        lambda: remotes.ls_remote_tag(url=url, tag=name),
        lambda: remotes.fetch(url=url, branches=[name]),
        lambda: remotes.resolve_commit(url=url, rev=name, branch=BRANCH),
        lambda: remotes.short_sha(url=url, sha=SHA, branch=name),
        lambda: remotes.push_fast_forward(worktree=wt),
    ]
    for call in calls:
        with pytest.raises(GitInputRefused):
            call()
    assert not no_git_runs
    count("hostile refs refused (git)", len(calls))


def test_materialize_refuses_a_dest_outside_the_trees_before_removing_anything(
    up: Upstream, remotes: GitRemotes, tmp_path: Path, no_git_runs: list[object]
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("mine")
    trees = remotes.trees_dir()
    trees.mkdir(parents=True)
    (trees / "link").symlink_to(precious)  # inside the trees by name, outside once resolved
    for dest in (
        precious,
        trees / ".." / "precious",
        trees / "link",
        trees,
        Path("/tmp/lockstep-abs"),
    ):
        with pytest.raises(GitInputRefused, match="nothing removed|outside"):
            remotes.materialize(url=up.url, sha=SHA, dest=dest)
    assert (precious / "keep").read_text() == "mine" and not no_git_runs


def test_git_itself_refuses_a_transport_the_site_does_not_allow_even_through_a_redirect(
    up: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A remote lockstep never sees: git's own config rewrites an allowed https URL to file:// (or to
    # ext::, which runs a command). Only GIT_ALLOW_PROTOCOL and protocol.ext.allow stand in the way.
    marker = tmp_path / "pwned"
    config = tmp_path / "gitconfig"
    config.write_text(
        f'[url "{up.url}"]\n\tinsteadOf = https://example.invalid/up.git\n'
        f'[url "ext::sh -c touch% {marker}"]\n\tinsteadOf = https://example.invalid/ext.git\n'
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    tip = up.commit("a", "1")
    allowing_file = GitRemotes(cache_dir=str(tmp_path / "c1"), url_schemes=LOCAL)
    # the control
    assert allowing_file.ls_remote(url="https://example.invalid/up.git", branch=BRANCH) == tip
    strict = GitRemotes(cache_dir=str(tmp_path / "c2"))
    with pytest.raises(GitError, match="transport 'file' not allowed"):
        strict.ls_remote(url="https://example.invalid/up.git", branch=BRANCH)
    for remotes in (strict, allowing_file):
        with pytest.raises(GitError, match="transport 'ext' not allowed"):
            remotes.ls_remote(url="https://example.invalid/ext.git", branch=BRANCH)
    assert not marker.exists()
