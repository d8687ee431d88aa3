"""The harbor changelog of a move of the floating tag, and of any two builds or harbor commits.

A move's changelog runs from the harbor the image at `:tpu` bakes (its tpu/verified_image record;
for a digest lockstep did not verify, what its layers have installed) to the harbor its target
bakes: a promote lists the commits it adds, a rollback the commits it removes. `lockstep changelog
FROM TO` prints the same table for two builds (tpu_builds partitions: consumer commits, read through
their uv.lock pin) or two harbor commits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import dagster as dg

from resources.changelog import SHOWN, CommitRange, changelog_metadata, commit_range
from resources.errors import LockstepError
from resources.git import GitError, GitRemotes, RemoteUnreachable
from resources.model import Model
from resources.registry import ImageRef, Registry
from resources.site.schema import SiteConfig
from resources.uv import UvLock
from tpu_assets.inspection import read_installed
from tpu_assets.rollback import TagMove, VerifiedBuild, VerifiedRecords, as_records

HARBOR = "harbor"
# A build or a harbor commit as a person types it: a
# sha or a prefix, nothing git could read as an option.
SHA_PREFIX = re.compile(r"^[0-9a-f]{4,40}$")


class ChangelogRefused(LockstepError):
    """FROM or TO does not name a build or a harbor commit; nothing was compared."""


class Endpoint(Model):
    """One side of a changelog: what the person named and the harbor commit it stands for."""

    label: str  # "build 1a2b3c4d" or "harbor 5e6f7a8b"
    harbor_commit: str


def baked_harbor(
    site: SiteConfig,
    registry: Registry,
    *,
    digest: str | None,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
) -> str | None:
    """The harbor commit the image `digest` bakes: its
    verified record's, else read out of its layers."""
    if digest is None:
        return None
    if (v := as_records(verified).with_digest(digest)) is not None:
        return v.harbor_commit
    tpu = site.tpu
    installed = read_installed(
        registry,
        repository=ImageRef.parse(tpu.image).repository,
        reference=digest,
        site_packages=tpu.site_packages,
        package=tpu.harbor_package,
    )
    return installed.commit if installed else None


def move_changelog(
    site: SiteConfig,
    git: GitRemotes,
    registry: Registry,
    *,
    move: TagMove,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    must_contain: str = "",
) -> dict[str, dg.MetadataValue]:
    """The changelog entries of one move's record; {} for a move that leaves the tag where it is.

    Never raises: a move is not held up (nor left unrecorded) by its changelog, whose summary says
    instead why the commits are unknown."""
    if move.from_digest == move.to_digest:
        return {}
    tpu = site.tpu
    fix = None
    try:
        base = baked_harbor(site, registry, digest=move.from_digest, verified=verified)
        target = baked_harbor(site, registry, digest=move.to_digest, verified=verified)
        found = commit_range(git, repo=HARBOR, url=tpu.harbor_repo, base=base, target=target)
    except LockstepError as exc:  # a registry read of an unverified digest
        found = CommitRange(repo=HARBOR, base=None, target=None, error=str(exc))
    if must_contain:
        try:
            fix = git.resolve_commit(
                url=tpu.harbor_repo, rev=must_contain, branch=tpu.harbor_branch
            )
        except LockstepError:  # not a harbor commit: nothing to mark, and the rows still stand
            fix = None
    if found.target is None and not found.error and move.to_digest:
        found.error = (
            f"{move.to_digest[:19]} has no verified record and no installed harbor was found in it"
        )
    return changelog_metadata([found], fix=fix)


def resolve_endpoint(site: SiteConfig, git: GitRemotes, value: str, *, what: str) -> Endpoint:
    """`value` (a sha prefix, checked by the caller)
    as a build — a commit of the consumer branch, whose
    uv.lock pins the harbor it bakes — or else a harbor
    commit; naming both is ambiguous and refused."""
    if not SHA_PREFIX.match(value):
        raise ChangelogRefused(
            f"{what} {value!r} is not a commit sha or a prefix of one (4 to 40 lower-case hex "
            "digits)"
        )
    tpu = site.tpu
    build = _commit_of(git, url=tpu.consumer_repo, rev=value, branch=tpu.consumer_branch)
    harbor = _commit_of(git, url=tpu.harbor_repo, rev=value, branch=tpu.harbor_branch)
    if build and harbor:
        raise ChangelogRefused(
            f"{what} {value!r} is both build {build[:12]} and harbor commit {harbor[:12]}: give "
            "more digits"
        )
    if harbor:
        return Endpoint(label=f"harbor {harbor[:8]}", harbor_commit=harbor)
    if not build:
        raise ChangelogRefused(
            f"{what} {value!r} is neither a build (a commit of {tpu.consumer_branch} in the "
            "consumer repo) nor a commit "
            f"of harbor's {tpu.harbor_branch}"
        )
    text = git.show_file(url=tpu.consumer_repo, sha=build, path="uv.lock")
    if text is None:
        raise ChangelogRefused(f"{what}: build {build[:12]} has no uv.lock, so it pins no harbor")
    pin = UvLock.read(Path(f"uv.lock@{build[:12]}"), text).git_package(tpu.harbor_package)[1].commit
    return Endpoint(label=f"build {build[:8]}", harbor_commit=pin)


def _commit_of(git: GitRemotes, *, url: str, rev: str, branch: str) -> str | None:
    try:
        return git.resolve_commit(url=url, rev=rev, branch=branch)
    except RemoteUnreachable:
        raise
    except GitError:
        return None


def changelog_between(
    site: SiteConfig, git: GitRemotes, frm: Endpoint, to: Endpoint, limit: int = SHOWN
) -> CommitRange:
    """The harbor commits from `frm`'s harbor to `to`'s (added), or back (removed)."""
    found = commit_range(
        git,
        repo=HARBOR,
        url=site.tpu.harbor_repo,
        base=frm.harbor_commit,
        target=to.harbor_commit,
        limit=limit,
    )
    if found.error:
        raise ChangelogRefused(f"{frm.label} -> {to.label}: {found.error}")
    return found
