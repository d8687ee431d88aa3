"""The fork-cut audit: a rev is adopted as ONE set (runbook, the 2026-09-08 r28 half-cut lesson).

Pins are commit SHAs plus tree hashes; branch names are not the contract, they only say whether a
newer cut exists.
"""

from __future__ import annotations

from jovian_assets.models import BranchTip, Finding, ForkCut, PackageCut
from jovian_assets.source_lock import LockedPackage
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.secrets import redact

TREES_MATCH = "trees_match"
PINS_REACHABLE = "pins_reachable"
ONE_CUT = "one_cut"
NEWER_CUT = "newer_cut_available"


def audit_package(git: GitRemotes, pkg: LockedPackage, branch_pattern: str) -> PackageCut:
    """Fetch the pin through the shared cache, read its tree and time, and compare the integration branches."""
    cut = PackageCut(name=pkg.name, repository=redact(pkg.repository), commit=pkg.commit, lock_tree=pkg.tree)
    try:
        cut.tree = git.tree_of(url=pkg.repository, sha=pkg.commit)
        cut.committed_at = git.commit_info(url=pkg.repository, sha=pkg.commit).committed_at
        for name, tip in sorted(git.ls_remote_heads(url=pkg.repository, pattern=branch_pattern).items()):
            ahead, behind = git.ahead_behind(url=pkg.repository, base=pkg.commit, tip=tip)
            cut.branches.append(BranchTip(name=name, tip=tip, ahead=ahead, behind=behind))
    except LockstepError as exc:
        cut.error = str(exc)
    return cut


def spread_minutes(cut: ForkCut) -> float | None:
    times = [p.committed_at for p in cut.packages if p.committed_at]
    return (max(times) - min(times)).total_seconds() / 60 if len(times) > 1 else None


def findings(cut: ForkCut) -> dict[str, Finding]:
    """The four fork-cut checks as plain findings."""
    unreachable = [f"{p.name} {p.commit[:12]} from {p.repository}: {p.error}" for p in cut.packages if p.error]
    mismatched = [
        f"{p.name}: {p.commit[:12]}^{{tree}} is {p.tree}, the lock says {p.lock_tree}"
        for p in cut.packages if p.tree is not None and p.tree != p.lock_tree
    ]
    out = {
        PINS_REACHABLE: Finding(
            passed=not unreachable,
            description="; ".join(unreachable) or f"all {len(cut.packages)} pins fetched by exact sha",
        ),
        TREES_MATCH: Finding(
            passed=not mismatched and not unreachable,
            description="; ".join(mismatched) or ("trees unknown: pins unreachable" if unreachable
                                                  else "every pinned commit's tree equals the lock's tree"),
        ),
    }
    spread = spread_minutes(cut)
    timed = sorted((p for p in cut.packages if p.committed_at), key=lambda p: p.committed_at)  # type: ignore[arg-type, return-value]
    if spread is None:
        out[ONE_CUT] = Finding(passed=False, description="commit times unknown: cannot show the pins are one cut")
    elif spread > cut.window_minutes:
        newest = timed[-1]
        behind = [f"{p.name} {(newest.committed_at - p.committed_at).total_seconds() / 60:.0f} min before {newest.name}"  # type: ignore[operator]
                  for p in timed[:-1] if (newest.committed_at - p.committed_at).total_seconds() / 60 > cut.window_minutes]  # type: ignore[operator]
        out[ONE_CUT] = Finding(
            passed=False,
            description=(
                f"half-cut rev {cut.rev}: the pins span {spread:.0f} minutes, over the {cut.window_minutes:.0f}-minute "
                f"cut window ({'; '.join(behind)}). A mixed stack builds and benches but skips the left-behind "
                "forks' fixes: re-cut the FULL fork set."
            ),
        )
    else:
        out[ONE_CUT] = Finding(passed=True, description=f"all pins within {spread:.1f} minutes (window {cut.window_minutes:.0f})")
    newer = [f"{p.name}: {b.name} is {b.ahead} commit(s) past the pin" for p in cut.packages for b in p.branches
             if b.behind == 0 and b.ahead > 0]
    out[NEWER_CUT] = Finding(passed=not newer, description="; ".join(newer) or "no integration branch has commits after its pin")
    return out
