"""Changelogs (issue 14 item 2): the rows, truncation and
text are pure; `commit_range` on a real repository."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import git

from resources.changelog import (
    ChangeCommit,
    CommitRange,
    changelog_metadata,
    changelog_rows,
    changelog_text,
    commit_range,
    range_summary,
)
from resources.git import GitRemotes
from tests.support.git_upstream import BRANCH, LOCAL, Upstream

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _commits(n: int, start: int = 0) -> list[ChangeCommit]:
    """n commits, newest first, as git log lists them."""
    return [
        ChangeCommit(
            sha=f"{i:040x}",
            subject=f"change {i}",
            author="a <a@x>",
            committed_at=T0 + timedelta(minutes=i),
        )
        for i in reversed(range(start, start + n))
    ]


def test_a_forward_move_lists_what_it_adds_and_marks_the_fix() -> None:
    fix = f"{2:040x}"
    r = CommitRange(repo="harbor", base="b" * 40, target="c" * 40, added=_commits(3), added_total=3)
    rows = changelog_rows([r], fix=fix)
    assert [(x.change, x.subject, x.fix) for x in rows] == [
        ("added", "change 2", True),
        ("added", "change 1", False),
        ("added", "change 0", False),
    ]
    assert range_summary(r) == "harbor bbbbbbbb -> cccccccc: 3 commits added"
    text = changelog_text([r], fix=fix)
    assert f"must_contain {fix[:12]}: this move adds it" in text
    assert text.splitlines()[2].endswith("change 2  <- must_contain")


def test_a_rollback_lists_what_it_removes() -> None:
    r = CommitRange(
        repo="harbor", base="c" * 40, target="b" * 40, removed=_commits(2), removed_total=2
    )
    assert {x.change for x in changelog_rows([r])} == {"removed"}
    assert range_summary(r) == "harbor cccccccc -> bbbbbbbb: 2 commits removed"
    meta = changelog_metadata([r])
    assert meta["commits_removed"].value == 2 and meta["commits_added"].value == 0
    assert [rec.data["change"] for rec in meta["changelog"].value.records] == ["removed", "removed"]  # type: ignore[attr-defined]


def test_more_than_fifty_shows_fifty_and_counts_the_rest() -> None:
    r = CommitRange(
        repo="harbor", base="b" * 40, target="c" * 40, added=_commits(70), added_total=70
    )
    rows = changelog_rows([r])
    assert len(rows) == 50 and rows[0].subject == "change 69"  # the newest fifty
    assert (
        range_summary(r)
        == "harbor bbbbbbbb -> cccccccc: 70 commits added (the first 50 listed, 20 more)"
    )
    assert len(changelog_metadata([r])["changelog"].value.records) == 50  # type: ignore[attr-defined]


def test_a_subject_is_one_line_without_credentials() -> None:
    hostile = ChangeCommit(
        sha="d" * 40,
        subject="mirror https://bot:s3cret@git.example/x\n| fix | yes |\x1b[31m",
        author="x\ny",
        committed_at=T0,
    )
    (row,) = changelog_rows(
        [CommitRange(repo="b12x", base="b" * 40, target="c" * 40, added=[hostile], added_total=1)]
    )
    assert (
        "s3cret" not in row.subject
        and "\n" not in row.subject + row.author
        and "| fix |" not in row.subject
    )


def test_nothing_before_and_unchanged_say_so() -> None:
    assert (
        range_summary(CommitRange(repo="harbor", base=None, target="c" * 40))
        == "harbor: nothing before cccccccc to compare with: no changelog"
    )
    assert (
        range_summary(CommitRange(repo="lmcache", base="c" * 40, target="c" * 40))
        == "lmcache: unchanged at cccccccc"
    )


def _commit(up: Upstream, name: str, text: str) -> str:
    (Path(up.work.working_dir) / name).write_text(text)
    up.work.index.add([name])
    return up.work.index.commit(
        f"edit {name} to {text}", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x")
    ).hexsha


def test_commit_range_on_a_real_repository_forward_backward_and_diverged(tmp_path: Path) -> None:
    up = Upstream(tmp_path)
    base = up.commit("a.txt", "0")
    # 55 commits after base, pushed once
    shas = [_commit(up, "a.txt", str(i)) for i in range(1, 56)]
    up.work.git.push(up.url, f"HEAD:refs/heads/{BRANCH}")
    remotes = GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=30, url_schemes=LOCAL)

    forward = commit_range(remotes, repo="harbor", url=up.url, base=base, target=shas[-1])
    assert (forward.added_total, forward.removed_total, len(forward.added)) == (55, 0, 50)
    # newest first: the 5 oldest are the "more"
    assert [c.sha for c in forward.added] == shas[::-1][:50]
    assert "55 commits added (the first 50 listed, 5 more)" in range_summary(forward)

    back = commit_range(remotes, repo="harbor", url=up.url, base=shas[2], target=shas[0])
    assert (back.added_total, back.removed_total) == (0, 2) and [c.sha for c in back.removed] == [
        shas[2],
        shas[1],
    ]

    # A rewritten branch: the target is a sibling of the base, so the move adds one and removes one.
    up.work.git.reset("--hard", shas[-2])
    sibling = _commit(up, "b.txt", "other")
    up.work.git.push("--force", up.url, f"HEAD:refs/heads/{BRANCH}")
    both = commit_range(remotes, repo="harbor", url=up.url, base=shas[-1], target=sibling)
    assert [c.sha for c in both.added] == [sibling] and [c.sha for c in both.removed] == [shas[-1]]
    assert git.Repo(up.bare).commit(BRANCH).hexsha == sibling


def test_commit_range_reports_git_failure_instead_of_raising(tmp_path: Path) -> None:
    remotes = GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=30, url_schemes=LOCAL)
    gone = commit_range(
        remotes,
        repo="vllm",
        url=(tmp_path / "missing.git").as_uri(),
        base="a" * 40,
        target="b" * 40,
    )
    assert gone.error and not gone.added and "commits unknown" in range_summary(gone)
