"""Promotion of the floating tag: the rules that need no Dagster run, and the one guarded write.

The `tpu/floating_tag` asset (promotion_assets.py) calls these inside the floating-tag lock
(tag_lock.py) and records what they decided; tag_log.py decides what the log records once the
registry has answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg

from resources.errors import LockstepError, Refused
from resources.git import GitRemotes
from resources.registry import ImageRef, Registry, RegistryError, digest_of
from resources.site.schema import SiteConfig
from tpu_assets.history import tag_history, verified_history
from tpu_assets.rollback import (
    NewestFirst,
    RollbackPlan,
    TagMove,
    VerifiedBuild,
    VerifiedRecords,
    as_records,
    current_state,
    plan_rollback,
)
from tpu_assets.tag_lock import lock_name
from tpu_assets.tag_log import TagWrite

# Runs queued by one instance's daemon take turns through this pool; the floating-tag lock covers
# every other writer (a second daemon, a shell, an in-process run, the watch).
TAG_MOVES_POOL = "tag_moves"


class PromotionRefused(Refused):
    """A promote, rollback or hold release that would be wrong; the floating tag was not touched."""


class AlreadyThere(PromotionRefused):
    """The promote's target is already on the tag (decide_move
    refuses that only when the log says so too)."""


class TagStateUnknown(LockstepError):
    """The registry could not be read right after a write: whether the tag moved is not known."""


class PhantomDigest(LockstepError):
    """The registry says a tag is at a digest whose
    manifest it cannot serve: nothing is recorded."""


def served(registry: Registry, *, repository: str, tag: str, digest: str | None) -> str | None:
    """`digest` (where the registry's HEAD says `tag` is) once the registry serves that manifest: a
    GET by digest whose bytes hash to it. A move is recorded only to such a digest: a HEAD is only a
    header, and a registry (or a proxy, or a cache) that names a digest it does not hold would
    otherwise put a move to nothing into the log, and make that nothing a rollback target.
    None (no tag) passes as None. A registry that cannot be read raises its own RegistryError.
    """
    if digest is None:
        return None
    try:
        stored = registry.stored(repository=repository, reference=digest)
        why = (
            "it has no manifest by that digest"
            if stored is None
            else (
                ""
                if digest_of(stored.raw) == digest
                else f"the manifest it serves hashes to {digest_of(stored.raw)}"
            )
        )
    except RegistryError as exc:
        if "hash to" not in str(exc):  # unreachable, refused...: not an answer about the digest
            raise
        why = str(exc)
    if why:
        raise PhantomDigest(
            f"the registry says :{tag} of {repository} is at {digest}, but {why}: a tag cannot "
            "point at a manifest "
            "the registry does not hold, so the registry (or a proxy or cache in front of it) is "
            "lying or "
            "broken. Nothing was recorded; check with `lockstep image digest` and `crane "
            f"manifest {repository}@{digest}`"
        )
    return digest


def resolve_served(registry: Registry, *, repository: str, tag: str) -> str | None:
    """Where `tag` is, as `served` vouches for it (None: no such tag)."""
    return served(
        registry,
        repository=repository,
        tag=tag,
        digest=registry.resolve(repository=repository, reference=tag),
    )


def floating_tag_lock_name(site: SiteConfig) -> str:
    ref = ImageRef.parse(site.tpu.image)
    return lock_name(registry=ref.registry, repository=ref.repository, tag=site.tpu.floating_tag)


# -- the rules: which target, or why not ---------------------------------------------------------


def promote_move(
    *,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    build: str,
    current: str | None,
    hold: bool,
    tag: str,
) -> TagMove:
    """Promote a verified build (the newest, or the one `build` names by prefix) onto the tag."""
    if hold:
        raise PromotionRefused(
            f":{tag} is on hold after a rollback: run release_tpu_hold first (nothing was moved)"
        )
    records = as_records(verified)
    target = next(records.named(build) if build else iter(records), None)
    if target is None:
        raise PromotionRefused(
            f"build {build or '(newest)'} has no tpu/verified_image record: only verified builds "
            "are "
            "promoted (build -> checks -> smoke -> verified first); nothing was moved"
        )
    if target.digest == current:
        raise AlreadyThere(f":{tag} already points at {target.digest} (build {target.build[:8]})")
    return TagMove(
        action="promote", from_digest=current, to_digest=target.digest, build=target.build
    )


def rollback_move(*, plan: RollbackPlan, current: str | None) -> TagMove:
    """Roll back to the plan's target, setting the hold (automation must not re-promote over it)."""
    if plan.target is None:
        raise PromotionRefused(f"rollback refused, nothing was moved:\n{plan.explain()}")
    return TagMove(
        action="rollback",
        from_digest=current,
        to_digest=plan.target.digest,
        build=plan.target.build,
        hold=True,
    )


def release_move(*, current: str | None, hold: bool) -> TagMove:
    """Release the hold; the tag stays where it is (no registry write)."""
    if not hold:
        raise PromotionRefused("there is no hold to release")
    return TagMove(action="release_hold", from_digest=current, to_digest=current, hold=False)


# -- planning and writing ------------------------------------------------------------------------


def rollback_plan(
    site: SiteConfig,
    git: GitRemotes,
    *,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    moves: Iterable[TagMove],
    current: str | None,
    must_contain: str = "",
    build: str = "",
) -> RollbackPlan:
    """The rollback plan over this history, with harbor ancestry from git (changes nothing)."""
    required = None
    if must_contain:
        required = git.resolve_commit(
            url=site.tpu.harbor_repo, rev=must_contain, branch=site.tpu.harbor_branch
        )

    def contains(harbor_commit: str, req: str) -> bool:
        return git.is_ancestor(url=site.tpu.harbor_repo, ancestor=req, descendant=harbor_commit)

    return plan_rollback(
        verified=verified,
        moves=moves,
        current_digest=current,
        must_contain=required,
        explicit_build=build or None,
        contains=contains,
    )


def plan_for(
    site: SiteConfig,
    instance: dg.DagsterInstance,
    git: GitRemotes,
    registry: Registry,
    *,
    must_contain: str = "",
    build: str = "",
    verified: VerifiedRecords | None = None,
    moves: Iterable[TagMove] | None = None,
) -> RollbackPlan:
    """The rollback plan from the instance's history
    and the registry's current state (changes nothing).

    The registry, not the log, says where the tag is: a move the watch has not recorded yet is still
    the current digest (and, unverified, never a
    target). `verified`/`moves`: histories already read.
    """
    ref = ImageRef.parse(site.tpu.image)
    current = registry.resolve(repository=ref.repository, reference=site.tpu.floating_tag)
    return rollback_plan(
        site,
        git,
        verified=verified if verified is not None else verified_history(instance),
        moves=moves if moves is not None else tag_history(instance),
        current=current,
        must_contain=must_contain,
        build=build,
    )


def put_and_reread(registry: Registry, *, repository: str, tag: str, target: str) -> TagWrite:
    """PUT the exact manifest bytes of `target` under `tag`, then read the tag back.

    A PUT that raises is not taken at its word (a registry can store the manifest and still answer
    500): the re-read decides. A re-read that fails leaves the outcome unknown: TagStateUnknown.
    """
    error = ""
    try:
        registry.tag(repository=repository, digest=target, tag=tag)
    except RegistryError as exc:
        error = str(exc)
    try:
        after = registry.resolve(repository=repository, reference=tag)
    except RegistryError as exc:
        said = f"raised ({error})" if error else "succeeded"
        raise TagStateUnknown(
            f"the PUT of :{tag} -> {target} {said}, and reading :{tag} back failed ({exc}): "
            "whether it moved is "
            "unknown, so nothing was recorded. The intent is logged: floating_tag_watch records "
            "the move once "
            "the registry answers and shows it; check `lockstep image digest` before running again"
        ) from None
    # After the PUT and the re-read: a phantom is refused here, with the run's intent still logged.
    return TagWrite(
        target=target,
        after=served(registry, repository=repository, tag=tag, digest=after),
        put_error=error,
    )


def decide_move(
    action: str,
    *,
    site: SiteConfig,
    git: GitRemotes,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    logged: Sequence[TagMove],
    found: Sequence[TagMove],
    current: str | None,
    build: str = "",
    must_contain: str = "",
) -> tuple[TagMove | None, str]:
    """The move `action` asks for, and the rollback plan's text when there is one; PromotionRefused
    when the rules say no.

    `logged` is the log as this run found it (newest first), `found` the records (oldest first) this
    run is about to add so that it ends where the registry is (`current`): the move of a run that
    died after its PUT, or one made by hand. The rules judge the log with those added, except when
    the tag already is where this action leads and `found` says how it got there: then those
    records ARE the move and the answer is None (nothing more to write). A promote is refused
    "already points at" only when the log already said so. A rollback whose run died after its PUT
    is not walked one build further back by its re-run: when the last found record is that
    rollback and this one, planned from the log's old state, picks the same target, it is done.
    """
    moves = NewestFirst(list(reversed(found)), logged)
    hold = current_state(moves.first or logged)[1]
    tag = site.tpu.floating_tag
    if action == "promote":
        try:
            return promote_move(
                verified=verified, build=build, current=current, hold=hold, tag=tag
            ), ""
        except AlreadyThere:
            if found:
                return None, ""
            raise
    if action == "release_hold":
        return release_move(current=current, hold=hold), ""
    if action == "rollback":
        if found and found[-1].action == "rollback":
            before = rollback_plan(
                site,
                git,
                verified=verified,
                moves=logged,
                current=current_state(logged)[0],
                must_contain=must_contain,
                build=build,
            )
            if before.target is not None and before.target.digest == current:
                return None, before.explain()
        plan = rollback_plan(
            site,
            git,
            verified=verified,
            moves=moves,
            current=current,
            must_contain=must_contain,
            build=build,
        )
        return rollback_move(plan=plan, current=current), plan.explain()
    raise PromotionRefused(f"action {action!r} is not one of promote, rollback, release_hold")
