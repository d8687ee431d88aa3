"""dep_trees through the shared cache: what git is asked to fetch for a first rev and for a second
rev that moves one of eight deps, and the bytes the
metadata reports (bench/dep_trees_bench.py measures
the same on real-sized repos)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from jovian_assets.dep_trees import fetch_dep, gitlinks_populated
from resources.git import GitRemotes

NAMES = [
    "cutlass",
    "vllm-flash-attn",
    "flashmla",
    "deepgemm",
    "flashinfer",
    "qutlass",
    "triton_kernels",
    "flashkda",
]
PARENT, LINK, TARGET = "flashmla", "csrc/cutlass", "cutlass"


def make_repo(
    path: Path, commits: list[dict[str, bytes]], gitlinks: list[str] | None = None
) -> list[str]:
    """A bare repo whose i-th commit changes the files
    in commits[i] (and records gitlinks[i] at LINK)."""
    git.Repo.init(path, bare=True, initial_branch="main")
    stream = b""
    for i, files in enumerate(commits):
        stream += b"commit refs/heads/main\ncommitter T <t@x> %d +0000\ndata 2\nc%d\n" % (
            1_700_000_000 + i,
            i % 10,
        )
        for name, data in files.items():
            stream += b"M 100644 inline %s\ndata %d\n%s\n" % (name.encode(), len(data), data)
        if gitlinks is not None:
            stream += b"M 160000 %s %s\n" % (gitlinks[i].encode(), LINK.encode())
        stream += b"\n"
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input=stream, check=True)
    return subprocess.run(
        ["git", "rev-list", "--reverse", "main"],
        cwd=path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.fixture
def upstreams(tmp_path: Path) -> dict[str, list[str]]:
    """Eight deps, each with a 64 KiB incompressible blob that never changes and a small file that
    changes in each of its 3 commits; flashmla vendors cutlass (its first commit) as a gitlink."""
    shas: dict[str, list[str]] = {}
    for name in [TARGET] + [n for n in NAMES if n != TARGET]:
        commits: list[dict[str, bytes]] = [
            {"big.bin": os.urandom(64 * 1024), "version.txt": b"0\n"}
        ]
        commits += [{"version.txt": b"%d\n" % i} for i in (1, 2)]
        if name == PARENT:
            commits[0][".gitmodules"] = (
                f'[submodule "{LINK}"]\n\tpath = {LINK}\n\turl = ../{TARGET}.git\n'.encode()
            )
        links = [shas[TARGET][0]] * 3 if name == PARENT else None
        shas[name] = make_repo(tmp_path / "up" / f"{name}.git", commits, links)
    return shas


@pytest.fixture
def fetches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every `git fetch` any GitRemotes call runs, as its argv (the calls still run)."""
    seen: list[list[str]] = []
    real = GitRemotes._network

    def recording(self: GitRemotes, args: list[str], *rest: object, **kwargs: object) -> object:
        if "fetch" in args:
            seen.append(list(args))
        return real(self, args, *rest, **kwargs)

    monkeypatch.setattr(GitRemotes, "_network", recording)
    yield seen


def url(tmp_path: Path, name: str) -> str:
    return (tmp_path / "up" / f"{name}.git").as_uri()


def head(path: Path) -> str:
    return git.Repo(path).head.commit.hexsha


def test_a_second_rev_moving_one_of_eight_deps_fetches_only_that_dep_and_only_what_changed(
    tmp_path: Path, upstreams: dict[str, list[str]], fetches: list[list[str]]
) -> None:
    remotes = GitRemotes(
        cache_dir=str(tmp_path / "cache" / "git"), timeout_s=30, url_schemes=["file"]
    )
    rev1 = {name: shas[1] for name, shas in upstreams.items()}
    rev2 = {**rev1, "deepgemm": upstreams["deepgemm"][2]}

    def adopt(rev: str, pins: dict[str, str]) -> dict[str, object]:
        root = remotes.trees_dir() / "jovian" / rev / "deps"
        trees = {n: fetch_dep(remotes, name=n, repository=url(tmp_path, n), tag=pin, dest=root / n)
                 for n, pin in pins.items()}  # fmt: skip
        assert not [t.error for t in trees.values() if t.error]
        assert gitlinks_populated(list(trees.values())).passed
        for name, pin in pins.items():
            assert head(root / name) == pin  # every dep at exactly its pin
        assert (root / PARENT / LINK / ".git").is_file() and head(
            root / PARENT / LINK
        ) == upstreams[TARGET][0]
        return trees  # type: ignore[return-value]

    first = adopt("r1", rev1)
    # Rev 1: each dep fetched once, shallow and by its exact pin; the gitlink once more, by the
    # commit flashmla records, into cutlass's mirror (shared: cutlass is also a dep).
    asked = sorted((f[-2], f[-1]) for f in fetches)
    wanted = sorted(
        [(url(tmp_path, n), f"{pin}:refs/lockstep/keep/{pin}") for n, pin in rev1.items()]
        + [
            (
                url(tmp_path, TARGET),
                f"{upstreams[TARGET][0]}:refs/lockstep/keep/{upstreams[TARGET][0]}",
            )
        ]
    )
    assert asked == wanted and all("--depth=1" in f for f in fetches)
    fetches.clear()

    second = adopt("r2", rev2)
    assert [(f[-2], f[-1]) for f in fetches] == [
        (url(tmp_path, "deepgemm"), f"{rev2['deepgemm']}:refs/lockstep/keep/{rev2['deepgemm']}")
    ]
    assert "--depth=1" in fetches[0]
    assert {n for n, t in second.items() if t.bytes_fetched} == {"deepgemm"}  # type: ignore[attr-defined]
    # Only the changed small file (and its commit and trees) travelled, not the 64 KiB blob again.
    moved, before = second["deepgemm"].bytes_fetched, first["deepgemm"].bytes_fetched  # type: ignore[attr-defined]
    assert 0 < moved < before // 10, (moved, before)


def test_bytes_fetched_counts_the_gitlinks_fetch_into_another_mirror(
    tmp_path: Path, upstreams: dict[str, list[str]]
) -> None:
    remotes = GitRemotes(
        cache_dir=str(tmp_path / "cache" / "git"), timeout_s=30, url_schemes=["file"]
    )
    dest = remotes.trees_dir() / "jovian" / "r1" / "deps" / PARENT
    tree = fetch_dep(
        remotes, name=PARENT, repository=url(tmp_path, PARENT), tag=upstreams[PARENT][1], dest=dest
    )
    own, vendored = (remotes.mirror_bytes(url=url(tmp_path, n)) for n in (PARENT, TARGET))
    assert tree.error is None and vendored > 64 * 1024  # the vendored cutlass's blob came in
    assert tree.bytes_fetched == own + vendored and tree.bytes_reused == 0
    again = fetch_dep(
        remotes,
        name=PARENT,
        repository=url(tmp_path, PARENT),
        tag=upstreams[PARENT][1],
        dest=remotes.trees_dir() / "jovian" / "r2" / "deps" / PARENT,
    )
    assert again.bytes_fetched == 0 and again.bytes_reused == own + vendored
