"""The fork-cut audit: a rev is adopted as ONE set (runbook, the 2026-09-08 r28 half-cut lesson).

Pins are commit SHAs plus tree hashes; branch names are not the contract, they only say whether a
newer cut exists.

A pin unchanged from the previous rev's lock is not part of this rev's cut: it is a HOLD when its
fork's integration branches have nothing in the cut window of the pins that moved (the runbook's
r39 holds LMCache at 29bc5a2e while vLLM and b12x are a same-moment cut), and a skipped cut when
they do (r28: vLLM advanced while b12x and LMCache
had their own cut commits, 21 and 3 fixes, left out).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jovian_assets.keys import NEWER_CUT, ONE_CUT, PINS_REACHABLE, TREES_MATCH
from jovian_assets.models import (
    AdoptedLock,
    BranchCommit,
    BranchTip,
    Finding,
    ForkCut,
    HeldPin,
    PackageCut,
)
from jovian_assets.revs import find_rev_lock, lab_locks
from jovian_assets.source_lock import LockedPackage
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.secrets import redact
from resources.site.jovian import JovianSection, rev_order

if TYPE_CHECKING:
    from resources.changelog import CommitRange

_SHOWN_COMMITS = 25  # per fork in a failure; the rest are counted


def audit_package(
    git: GitRemotes, pkg: LockedPackage, branch_pattern: str, previous: LockedPackage | None = None
) -> PackageCut:
    """Fetch the pin through the shared cache, read its
    tree and time, and compare the integration branches."""
    cut = PackageCut(
        name=pkg.name,
        repository=redact(pkg.repository),
        commit=pkg.commit,
        lock_tree=pkg.tree,
        previous_commit=previous.commit if previous is not None else None,
    )
    try:
        cut.tree = git.tree_of(url=pkg.repository, sha=pkg.commit)
        cut.committed_at = git.commit_info(url=pkg.repository, sha=pkg.commit).committed_at
        for name, tip in sorted(
            git.ls_remote_heads(url=pkg.repository, pattern=branch_pattern).items()
        ):
            ahead, behind = git.ahead_behind(url=pkg.repository, base=pkg.commit, tip=tip)
            cut.branches.append(BranchTip(name=name, tip=tip, ahead=ahead, behind=behind))
    except LockstepError as exc:
        cut.error = str(exc)
    return cut


def previous_lock(
    git: GitRemotes, jovian: JovianSection, adopted: AdoptedLock
) -> AdoptedLock | None:
    """The lock of the lab's preceding rev (rev order:
    r2 < r10 < r39) at the same lab commit, or None."""
    earlier = [
        e.rev
        for e in lab_locks(git, jovian, lab_commit=adopted.lab_commit)
        if e.rev is not None and rev_order(e.rev) < rev_order(adopted.rev)
    ]
    if not earlier:
        return None
    return find_rev_lock(
        git, jovian, lab_commit=adopted.lab_commit, rev=max(earlier, key=rev_order)
    )


def unchanged(cut: ForkCut) -> list[PackageCut]:
    """The pins the previous rev's lock already had: held, or left behind."""
    if cut.previous_rev is None:
        return []
    return [p for p in cut.packages if p.previous_commit == p.commit]


def moved(cut: ForkCut) -> list[PackageCut]:
    """The pins that form this rev's cut: all of them
    when there is no previous rev, or nothing moved."""
    still = {p.name for p in unchanged(cut)}
    return [p for p in cut.packages if p.name not in still] or list(cut.packages)


def cut_window(cut: ForkCut) -> tuple[datetime, datetime] | None:
    """Every moment a commit could have been cut together with the moved pins (all within the window
    of each other), or None when a moved pin's time is unknown or nothing moved."""
    pins = moved(cut)
    if len(pins) == len(cut.packages) or any(p.committed_at is None for p in pins):
        return None
    times = [p.committed_at for p in pins if p.committed_at is not None]
    width = timedelta(minutes=cut.window_minutes)
    return max(times) - width, min(times) + width


def collect_commits_after(git: GitRemotes, cut: ForkCut, urls: dict[str, str]) -> None:
    """For each unchanged pin, its branches' commits after
    the pin up to the window's end (on the record)."""
    window = cut_window(cut)
    if window is None:
        return
    for pkg in unchanged(cut):
        try:
            for branch in pkg.branches:
                if branch.ahead:
                    branch.commits = [
                        BranchCommit(sha=c.sha, committed_at=c.committed_at, summary=c.summary)
                        for c in git.commits_after(
                            url=urls[pkg.name], base=pkg.commit, tip=branch.tip, until=window[1]
                        )
                    ]
        except LockstepError as exc:
            pkg.error = str(exc)


def fork_changelogs(git: GitRemotes, cut: ForkCut, urls: dict[str, str]) -> list[CommitRange]:
    """Per fork, the commits between the previous rev's
    pin and this rev's: what adopting the rev adds
    (and removes, for a pin moved back or a rewritten
    branch). A fork new in this rev has nothing to compare."""
    from resources.changelog import commit_range

    return [
        commit_range(git, repo=p.name, url=urls[p.name], base=p.previous_commit, target=p.commit)
        for p in cut.packages
    ]


def spread_minutes(cut: ForkCut) -> float | None:
    """The span of the cut's pins (the moved ones: a held pin is older on purpose)."""
    times = [p.committed_at for p in moved(cut) if p.committed_at]
    return (max(times) - min(times)).total_seconds() / 60 if len(times) > 1 else None


def skipped_commits(
    pkg: PackageCut, window: tuple[datetime, datetime]
) -> list[tuple[str, BranchCommit]]:
    """(branch, commit) a same-moment cut would have
    taken: the commits after the pin of every branch that
    has one in the window (another line, e.g. an old r18
    branch, skipped nothing). Empty: no such branch."""
    seen: dict[str, tuple[str, BranchCommit]] = {}
    for branch in pkg.branches:
        if not any(window[0] <= c.committed_at <= window[1] for c in branch.commits):
            continue
        for commit in branch.commits:
            seen.setdefault(commit.sha, (branch.name, commit))
    return sorted(seen.values(), key=lambda bc: bc[1].committed_at)


def holds(cut: ForkCut) -> list[HeldPin]:
    """The unchanged pins whose forks had nothing in the cut window: held on purpose."""
    window = cut_window(cut)
    if window is None or cut.previous_rev is None:
        return []
    return [
        HeldPin(
            package=p.name,
            commit=p.commit,
            since_rev=cut.previous_rev,
            description=f"{p.name} held at {p.commit[:8]} (unchanged since {cut.previous_rev}; "
            f"no integration commits within the {cut.rev} cut window)",
        )
        for p in unchanged(cut)
        if not p.error and not skipped_commits(p, window)
    ]


def _shown(text: str) -> str:
    """A commit subject from the fork: one printable line, short, no credentials."""
    line = redact(text).splitlines()[0] if text.strip() else ""
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= 80 else line[:77] + "..."


def _skipped_text(cut: ForkCut, pkg: PackageCut, skipped: list[tuple[str, BranchCommit]]) -> str:
    listed = "; ".join(
        f"{c.sha[:12]} {c.committed_at:%Y-%m-%dT%H:%MZ} {_shown(c.summary)} ({branch})"
        for branch, c in skipped[:_SHOWN_COMMITS]
    )
    more = f"; and {len(skipped) - _SHOWN_COMMITS} more" if len(skipped) > _SHOWN_COMMITS else ""
    return (
        f"{pkg.name} stayed at {pkg.commit[:8]} (unchanged since {cut.previous_rev}) while its "
        "integration branches "
        f"were cut within the {cut.rev} window: it skipped {len(skipped)} commit(s): {listed}{more}"
    )


def _one_cut(cut: ForkCut) -> Finding:
    pins = moved(cut)
    timed = sorted((p for p in pins if p.committed_at), key=lambda p: p.committed_at)  # type: ignore[arg-type, return-value]
    if not timed or len(timed) < len(pins):
        return Finding(
            passed=False, description="commit times unknown: cannot show the pins are one cut"
        )
    spread = spread_minutes(cut) or 0.0
    problems = []
    if spread > cut.window_minutes:
        newest = timed[-1]
        behind = [
            (
                f"{p.name} {(newest.committed_at - p.committed_at).total_seconds() / 60:.0f} "
                f"min before {newest.name}"
            )  # type: ignore[operator]
            for p in timed[:-1]
            if (newest.committed_at - p.committed_at).total_seconds() / 60 > cut.window_minutes
        ]  # type: ignore[operator]
        problems.append(
            f"the pins span {spread:.0f} minutes, over the {cut.window_minutes:.0f}-minute cut "
            f"window ({'; '.join(behind)})"
        )
    window = cut_window(cut)
    kept = holds(cut)
    if window is not None:
        for pkg in unchanged(cut):
            if pkg.error:
                problems.append(f"cannot tell whether {pkg.name} is held: {pkg.error}")
            elif skipped := skipped_commits(pkg, window):
                problems.append(_skipped_text(cut, pkg, skipped))
    if problems:
        return Finding(
            passed=False,
            description=(
                f"half-cut rev {cut.rev}: {'. '.join(problems)}. A mixed stack builds and "
                "benches but skips the "
                "left-behind forks' fixes: re-cut the FULL fork set."
            ),
        )
    what = (
        f"{len(pins)} moved pins within {spread:.1f} minutes"
        if cut.previous_rev and len(pins) < len(cut.packages)
        else f"all pins within {spread:.1f} minutes"
    )
    return Finding(
        passed=True,
        description="; ".join(
            [f"{what} (window {cut.window_minutes:.0f})", *(h.description for h in kept)]
        ),
    )


def findings(cut: ForkCut) -> dict[str, Finding]:
    """The four fork-cut checks as plain findings."""
    unreachable = [
        f"{p.name} {p.commit[:12]} from {p.repository}: {p.error}" for p in cut.packages if p.error
    ]
    mismatched = [
        f"{p.name}: {p.commit[:12]}^{{tree}} is {p.tree}, the lock says {p.lock_tree}"
        for p in cut.packages
        if p.tree is not None and p.tree != p.lock_tree
    ]
    out = {
        PINS_REACHABLE: Finding(
            passed=not unreachable,
            description="; ".join(unreachable)
            or f"all {len(cut.packages)} pins fetched by exact sha",
        ),
        TREES_MATCH: Finding(
            passed=not mismatched and not unreachable,
            description="; ".join(mismatched)
            or (
                "trees unknown: pins unreachable"
                if unreachable
                else "every pinned commit's tree equals the lock's tree"
            ),
        ),
        ONE_CUT: _one_cut(cut),
    }
    newer = [
        f"{p.name}: {b.name} is {b.ahead} commit(s) past the pin"
        for p in cut.packages
        for b in p.branches
        if b.behind == 0 and b.ahead > 0
    ]
    out[NEWER_CUT] = Finding(
        passed=not newer,
        description="; ".join(newer) or "no integration branch has commits after its pin",
    )
    return out
