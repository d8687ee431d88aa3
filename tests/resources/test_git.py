"""GitRemotes against real bare repositories: mirrors, fetch by sha, ancestry, fast-forward-only push."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

import resources.git as gitmod
from resources.git import GitError, GitRemotes, NonFastForward, RemoteUnreachable

BRANCH = "penfever/working"


class Upstream:
    """A bare repo plus a clone to make commits with."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "up.git"
        git.Repo.init(self.bare, bare=True, initial_branch=BRANCH)
        self.work = git.Repo.init(root / "up-work", initial_branch=BRANCH)
        self.url = self.bare.as_uri()

    def commit(self, name: str, text: str) -> str:
        (Path(self.work.working_dir) / name).write_text(text)
        self.work.index.add([name])
        self.work.index.commit(f"edit {name}", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x"))
        self.work.git.push(self.url, f"HEAD:refs/heads/{BRANCH}")
        return self.work.head.commit.hexsha


@pytest.fixture
def up(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


@pytest.fixture
def remotes(tmp_path: Path) -> GitRemotes:
    return GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=30)


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


def test_push_refuses_history_that_does_not_descend_from_the_tip(up: Upstream, remotes: GitRemotes) -> None:
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


def test_list_files_gitlinks_and_materialize(up: Upstream, remotes: GitRemotes, tmp_path: Path) -> None:
    dep = Upstream(tmp_path / "dep")
    dep_sha = dep.commit("lib.h", "x")
    up.work.git.execute(["git", "-c", "protocol.file.allow=always", "submodule", "add", "-q", dep.url, "csrc/cutlass"])
    (Path(up.work.working_dir) / "models").mkdir()
    (Path(up.work.working_dir) / "models/r1.source.lock").write_text("format=x\n")
    up.work.git.add("-A")
    sha = up.commit("README", "r")
    files = remotes.list_files(url=up.url, sha=sha, pattern="**/*.source.lock")
    assert list(files) == ["models/r1.source.lock"]
    assert remotes.gitlinks(url=up.url, sha=sha) == {"csrc/cutlass": dep_sha}
    dest = remotes.materialize(url=up.url, sha=sha, dest=tmp_path / "trees" / "up")
    assert (dest / "README").read_text() == "r" and (dest / "csrc/cutlass").is_dir()
    assert not any((dest / "csrc/cutlass").iterdir())  # a gitlink checks out as an EMPTY dir: the trap
    again = remotes.materialize(url=up.url, sha=sha, dest=dest)  # replacing an existing checkout works
    assert (again / ".git").is_file() and remotes.mirror_bytes(url=up.url) > 0
