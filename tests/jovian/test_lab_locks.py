"""Listing a lab commit's source locks: every lock
read and parsed, with git processes that do not grow
with the number of locks (a moved lab_rev_sensor tick reads them all)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git
import pytest

from jovian_assets.revs import lab_locks
from resources.git import GitError, GitRemotes
from resources.site.jovian import JovianSection

LOCK_DIR = "models/glm-5.3-flash/build"
SHA = "a" * 40


def lock(rev: str) -> str:
    return (
        f"format=local-inference-source-lock/v1\nrelease.version={rev}\n"
        f"vllm.repository=https://github.com/local-inference-lab/vllm.git\nvllm.commit={SHA}\nvllm.tree={SHA}\n"
    )


def lab(root: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A bare lab repo whose master holds `files`; returns (url, commit)."""
    work = git.Repo.init(root / "work", initial_branch="master")
    for name, data in files.items():
        (root / "work" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "work" / name).write_bytes(data)
    work.git.add("-A")
    who = git.Actor("lab", "lab@lab.invalid")
    sha = work.index.commit("publish", author=who, committer=who).hexsha
    git.Repo.init(root / "lab.git", bare=True, initial_branch="master")
    work.git.push(str(root / "lab.git"), "master")
    return (root / "lab.git").as_uri(), sha


def git_processes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    started: list[list[str]] = []
    real = subprocess.Popen.__init__

    def counting(self: subprocess.Popen[bytes], args: list[str], *a: object, **kw: object) -> None:
        if Path(str(args[0])).name == "git":
            started.append([str(x) for x in args])
        real(self, args, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", counting)
    return started


@pytest.mark.parametrize("n", [1, 30])
def test_every_lock_is_read_with_git_processes_independent_of_their_number(
    n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"{LOCK_DIR}/r{i}.source.lock": lock(f"r{i}").encode() for i in range(n)}
    # not UTF-8
    files[f"{LOCK_DIR}/bad.source.lock"] = lock("r99").encode().replace(b"r99", b"r\xff9")
    files["README.md"] = b"not a lock\n"
    url, sha = lab(tmp_path, files)
    remotes = GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=30, url_schemes=["file"])
    jovian = JovianSection(lab_repo=url, build_repo=url)
    started = git_processes(monkeypatch)
    locks = lab_locks(remotes, jovian, lab_commit=sha)
    assert {entry.path: entry.rev for entry in locks if entry.rev} == {
        f"{LOCK_DIR}/r{i}.source.lock": f"r{i}" for i in range(n)
    }
    (bad,) = [entry for entry in locks if entry.error]
    assert bad.path.endswith("bad.source.lock") and "not UTF-8 text (byte 0xff)" in bad.error  # type: ignore[operator]
    # init + fetch + ls-tree, then the cat-file checks and one
    # cat-file --batch: 6 for 1 lock or 30 (it was 2 more per lock).
    assert len(started) <= 6, started


def test_read_blobs_refuses_what_is_not_a_blob(tmp_path: Path) -> None:
    url, sha = lab(tmp_path, {"a.txt": b"one\n"})
    remotes = GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=30, url_schemes=["file"])
    tree = git.Repo(tmp_path / "lab.git").commit(sha).tree.hexsha
    with pytest.raises(GitError, match=f"{tree} is not a blob"):
        remotes.read_blobs(url=url, sha=sha, blobs=[tree])
