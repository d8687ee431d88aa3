"""Promotion of the floating tag: the rules that need no Dagster run (planning, the CAS move).

The `tpu/floating_tag` asset (promotion_assets.py) calls these and records what they did.
"""

from __future__ import annotations

import dagster as dg

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.registry import ImageRef, Registry
from resources.site import SiteConfig
from tpu_assets.history import tag_history, verified_history
from tpu_assets.rollback import RollbackPlan, plan_rollback

# One promote / rollback / release at a time: the registry has no conditional PUT for tags.
TAG_MOVES_POOL = "tag_moves"


class PromotionRefused(LockstepError):
    """A promote, rollback or hold release that would be wrong; the floating tag was not touched."""


def plan_for(site: SiteConfig, instance: dg.DagsterInstance, git: GitRemotes, registry: Registry, *,
             must_contain: str = "", build: str = "") -> RollbackPlan:
    """The rollback plan from the instance's history and the registry's current state (changes nothing)."""
    ref = ImageRef.parse(site.tpu.image)
    current = registry.resolve(repository=ref.repository, reference=site.tpu.floating_tag)
    required = None
    if must_contain:
        required = git.resolve_commit(url=site.tpu.harbor_repo, rev=must_contain, branch=site.tpu.harbor_branch)

    def contains(harbor_commit: str, req: str) -> bool:
        return git.is_ancestor(url=site.tpu.harbor_repo, ancestor=req, descendant=harbor_commit)

    return plan_rollback(verified=verified_history(instance), moves=tag_history(instance), current_digest=current,
                         must_contain=required, explicit_build=build or None, contains=contains)


def move_floating_tag(registry: Registry, site: SiteConfig, *, to_digest: str, expect_from: str | None) -> str | None:
    ref = ImageRef.parse(site.tpu.image)
    return registry.move_tag(repository=ref.repository, tag=site.tpu.floating_tag, to_digest=to_digest, expect_from=expect_from)
