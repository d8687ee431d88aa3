"""Changelogs: the commits between what was there and what a move puts there, per repository.

A promotion's record says which digest; a person deciding (or an auditor reading the log) wants what
changed: the commits the move adds and, for a rollback or a rewritten fork, the commits it removes.
`commit_range` asks git (through GitRemotes' shared mirror, so a second look costs nothing); the
rest is pure: rows, the "N more" count past the shown limit, and the table and text a person reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import dagster as dg
from pydantic import Field

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.model import Model
from resources.secrets import redact

SHOWN = 50  # commits listed per repository and direction; past that, counted ("N more")

Change = Literal["added", "removed"]


class ChangeCommit(Model):
    sha: str
    subject: str
    author: str
    committed_at: datetime


class CommitRange(Model):
    """What moving `repo` from `base` to `target`
    changes: commits added (`base..target`) and removed
    (`target..base`); a forward move only adds, a rollback
    only removes, a rewritten branch does both."""

    repo: str  # "harbor", or a fork's package name
    # None: nothing was there before (a first promotion, a rev with no previous pin)
    base: str | None
    target: str | None
    # newest first, at most the limit asked for
    added: list[ChangeCommit] = Field(default_factory=list)
    removed: list[ChangeCommit] = Field(default_factory=list)
    added_total: int = 0
    removed_total: int = 0
    error: str = ""  # why the commits could not be listed (git failed, a base unknown)

    @property
    def moved(self) -> bool:
        return self.base is not None and self.target is not None and self.base != self.target


class ChangeRow(Model):
    repo: str
    change: Change
    sha: str
    subject: str
    author: str
    time: str
    fix: bool = False


def shown_line(text: str, width: int = 100) -> str:
    """A commit's subject or author as one printable line,
    short, with no credentials (it is the fork's text)."""
    line = redact(text).splitlines()[0] if text.strip() else ""
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= width else line[: width - 3] + "..."


def commit_range(
    git: GitRemotes,
    *,
    repo: str,
    url: str,
    base: str | None,
    target: str | None,
    limit: int = SHOWN,
) -> CommitRange:
    """The commits between `base` and `target` on `url` (full shas), at most `limit` each way, with
    the totals. Never raises for git's sake: a failure
    is the range's `error`, so a move it describes
    is never held up by its changelog."""
    found = CommitRange(repo=repo, base=base, target=target)
    if not found.moved:
        return found
    assert base is not None and target is not None
    try:
        found.added_total, found.removed_total = git.ahead_behind(url=url, base=base, tip=target)
        for total, field, frm, to in (
            (found.added_total, "added", base, target),
            (found.removed_total, "removed", target, base),
        ):
            if total:
                setattr(
                    found,
                    field,
                    [
                        ChangeCommit(
                            sha=c.sha,
                            subject=c.summary,
                            author=c.author,
                            committed_at=c.committed_at,
                        )
                        for c in git.commits_after(url=url, base=frm, tip=to, limit=limit)
                    ],
                )
    except LockstepError as exc:
        found.error = str(exc)
    return found


def _is_fix(sha: str, fix: str | None) -> bool:
    return bool(fix) and sha.startswith(fix.lower())  # type: ignore[union-attr]


def changelog_rows(
    ranges: Sequence[CommitRange], *, fix: str | None = None, limit: int = SHOWN
) -> list[ChangeRow]:
    """Each range's added then removed commits, newest
    first, at most `limit` of each; `fix` (a full sha
    or a prefix: the required commit) marked."""
    rows = []
    for r in ranges:
        for change, commits in (("added", r.added), ("removed", r.removed)):
            rows += [
                ChangeRow(
                    repo=r.repo,
                    change=change,
                    sha=c.sha,
                    subject=shown_line(c.subject),  # type: ignore[arg-type]
                    author=shown_line(c.author, 60),
                    time=c.committed_at.strftime("%Y-%m-%dT%H:%MZ"),
                    fix=_is_fix(c.sha, fix),
                )
                for c in commits[:limit]
            ]
    return rows


def range_summary(r: CommitRange, *, limit: int = SHOWN) -> str:
    """One line a person reads first: from what to what,
    how many commits each way, how many not shown."""
    if r.error:
        return f"{r.repo}: commits unknown ({r.error})"
    if r.target is None:
        return f"{r.repo}: nothing to compare (no target)"
    if r.base is None:
        return f"{r.repo}: nothing before {r.target[:8]} to compare with: no changelog"
    if not r.moved:
        return f"{r.repo}: unchanged at {r.target[:8]}"
    parts = []
    for change, total in (("added", r.added_total), ("removed", r.removed_total)):
        if total:
            more = f" (the first {limit} listed, {total - limit} more)" if total > limit else ""
            parts.append(f"{total} commit{'s' if total != 1 else ''} {change}{more}")
    return (
        f"{r.repo} {r.base[:8]} -> {r.target[:8]}: {', '.join(parts) or 'no commits between them'}"
    )


def fix_summary(ranges: Sequence[CommitRange], fix: str, *, limit: int = SHOWN) -> str:
    """Where the required commit stands in this changelog (it is marked in the rows when listed)."""
    for row in changelog_rows(ranges, fix=fix, limit=limit):
        if row.fix:
            verb = "adds" if row.change == "added" else "REMOVES"
            return (
                f"must_contain {fix[:12]}: this move {verb} it ({row.repo} {row.sha[:12]} "
                f"{row.subject}; marked)"
            )
    return (
        f"must_contain {fix[:12]}: not among the listed commits (both sides have it, neither "
        f"does, or it is past the first {limit})"
    )


def changelog_text(
    ranges: Sequence[CommitRange], *, fix: str | None = None, limit: int = SHOWN
) -> str:
    """The changelog as a person reads it on a terminal: the summaries, then one line per commit."""
    lines = [range_summary(r, limit=limit) for r in ranges]
    if fix:
        lines.append(fix_summary(ranges, fix, limit=limit))
    for row in changelog_rows(ranges, fix=fix, limit=limit):
        mark = "  <- must_contain" if row.fix else ""
        lines.append(
            f"  {row.repo}  {row.change:<7}  {row.sha[:12]}  {row.time}  {row.author}  "
            f"{row.subject}{mark}"
        )
    return "\n".join(lines)


def changelog_table(
    ranges: Sequence[CommitRange], *, fix: str | None = None, limit: int = SHOWN
) -> dg.MetadataValue:
    """The rows as a typed Dagster table (the UI shows it on the materialization)."""
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn("repo", "string", description="harbor, or the fork's package"),
            dg.TableColumn(
                "change",
                "string",
                description="added: the move brings it; removed: the move takes it away",
            ),
            dg.TableColumn("sha", "string"),
            dg.TableColumn("subject", "string"),
            dg.TableColumn("author", "string"),
            dg.TableColumn("time", "string", description="commit time, UTC"),
            dg.TableColumn("fix", "bool", description="the required commit (must_contain)"),
        ]
    )
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(row.model_dump()) for row in changelog_rows(ranges, fix=fix, limit=limit)
        ],
        schema=schema,
    )


def changelog_metadata(
    ranges: Sequence[CommitRange], *, fix: str | None = None, limit: int = SHOWN
) -> dict[str, dg.MetadataValue]:
    """The changelog entries of a materialization: the table, the summary, and the totals."""
    summary = [range_summary(r, limit=limit) for r in ranges]
    if fix:
        summary.append(fix_summary(ranges, fix, limit=limit))
    return {
        "changelog": changelog_table(ranges, fix=fix, limit=limit),
        "changelog_summary": dg.MetadataValue.text("\n".join(summary)),
        "commits_added": dg.MetadataValue.int(sum(r.added_total for r in ranges)),
        "commits_removed": dg.MetadataValue.int(sum(r.removed_total for r in ranges)),
    }
