"""`tpu/floating_tag`: every move of the floating `:tpu` — its materialization history IS the promotion log.

Promote moves the tag to a verified build by compare-and-swap, recording the pre-promote digest
(the rollback target). Rollback promotes older verified freight chosen by `plan_rollback` and sets
a hold; while a hold is set nothing promotes until a person releases it.
"""

from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from resources.git import GitRemotes
from resources.links import commit_entries, digest_entries
from resources.registry import ImageRef, Registry
from resources.site import SiteResource
from resources.uv import UvLock
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE, tag_history, verified_history
from tpu_assets.inspection import read_installed
from tpu_assets.promotion import TAG_MOVES_POOL, PromotionRefused, move_floating_tag, plan_for
from tpu_assets.rollback import TagMove, current_state


class FloatingTagConfig(dg.Config):
    action: Literal["promote", "rollback", "release_hold"] = Field(description="What to do with the floating tag.")
    build: str = Field(default="", description="promote/rollback: a tpu_builds partition (or its prefix); empty = choose.")
    must_contain: str = Field(default="", description="rollback: a harbor commit the target must contain (the fix).")
    note: str = Field(default="", description="Why, in a person's words; kept in the promotion log.")


@dg.asset(
    key=FLOATING_TAG,
    deps=[VERIFIED_IMAGE],
    group_name="tpu",
    kinds={"oci"},
    pool=TAG_MOVES_POOL,
    code_version="1",
    description=(
        "The floating tag other users pull (site `[tpu].floating_tag`, `:tpu`). Each materialization is "
        "one move: from-digest (the rollback target), to-digest, build, reason (promote / rollback / "
        "release_hold) and the hold flag, so this asset's history is the promotion log. Moves are "
        "compare-and-swap: if someone else moved the tag, nothing is written."
    ),
)
def floating_tag(context: dg.AssetExecutionContext, config: FloatingTagConfig, site: SiteResource, git: GitRemotes,
                 registry: Registry) -> dg.MaterializeResult:
    cfg = site.config()
    repository = ImageRef.parse(cfg.tpu.image).repository
    current = registry.resolve(repository=repository, reference=cfg.tpu.floating_tag)
    _, hold = current_state(tag_history(context.instance))
    plan_text = ""
    if config.action == "release_hold":
        if not hold:
            raise PromotionRefused("there is no hold to release")
        move = TagMove(action="release_hold", from_digest=current, to_digest=current, hold=False)
    elif config.action == "promote":
        if hold:
            raise PromotionRefused(
                f":{cfg.tpu.floating_tag} is on hold after a rollback: run release_tpu_hold first (nothing was moved)"
            )
        verified = verified_history(context.instance)
        chosen = [v for v in verified if v.build.startswith(config.build)] if config.build else verified[:1]
        if not chosen:
            raise PromotionRefused(
                f"build {config.build or '(newest)'} has no tpu/verified_image record: only verified builds are "
                "promoted (build -> checks -> smoke -> verified first); nothing was moved"
            )
        target = chosen[0]
        if target.digest == current:
            raise PromotionRefused(f":{cfg.tpu.floating_tag} already points at {target.digest} (build {target.build[:8]})")
        before = move_floating_tag(registry, cfg, to_digest=target.digest, expect_from=current)
        move = TagMove(action="promote", from_digest=before, to_digest=target.digest, build=target.build)
    else:
        plan = plan_for(cfg, context.instance, git, registry, must_contain=config.must_contain, build=config.build)
        plan_text = plan.explain()
        context.log.info(plan_text)
        if plan.target is None:
            raise PromotionRefused(f"rollback refused, nothing was moved:\n{plan_text}")
        before = move_floating_tag(registry, cfg, to_digest=plan.target.digest, expect_from=current)
        move = TagMove(action="rollback", from_digest=before, to_digest=plan.target.digest, build=plan.target.build, hold=True)

    summary = f"**{move.action}** `:{cfg.tpu.floating_tag}` {move.from_digest or 'nothing'} -> {move.to_digest}"
    if move.build:
        summary += f" (build {move.build[:8]})"
    if move.hold:
        summary += "\n\nHOLD set: nothing promotes until `release_tpu_hold` runs."
    return dg.MaterializeResult(
        data_version=dg.DataVersion(move.to_digest or "none"),
        metadata={
            "action": dg.MetadataValue.text(move.action),
            **digest_entries(cfg.links, "from_digest", cfg.tpu.image, move.from_digest or ""),
            **digest_entries(cfg.links, "to_digest", cfg.tpu.image, move.to_digest or ""),
            **commit_entries(cfg.links, "build", cfg.tpu.consumer_repo, move.build or ""),
            "hold": dg.MetadataValue.bool(move.hold),
            "note": dg.MetadataValue.text(config.note),
            "must_contain": dg.MetadataValue.text(config.must_contain),
            "summary": dg.MetadataValue.md(summary + (f"\n\n```\n{plan_text}\n```" if plan_text else "")),
        },
    )


def _action_job(name: str, action: str, description: str):  # type: ignore[no-untyped-def]
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(FLOATING_TAG),
        config={"ops": {"tpu__floating_tag": {"config": {"action": action}}}},
        # Never retried by the daemon: a retried rollback would walk one build further back.
        tags={"dagster/max_retries": "0"},
        description=description,
    )


promote_tpu = _action_job("promote_tpu", "promote", "Move the floating tag to a verified build (newest, or `build`), compare-and-swap.")
rollback_tpu = _action_job(
    "rollback_tpu", "rollback",
    "Move the floating tag back to a verified build that contains `must_contain` (or to `build`); refuses "
    "no-op targets and sets a hold.",
)
release_tpu_hold = _action_job("release_tpu_hold", "release_hold", "Release the hold a rollback set, so promotions can resume.")


@dg.asset_check(
    asset=FLOATING_TAG,
    description=(
        "WARN when the harbor baked into the image at the floating tag differs from the consumer's current "
        "uv.lock pin. Workers still run the locked harbor (they re-sync from the lock); this shows the "
        "image is behind, so first-serve does a big reinstall. A rebuild is optional (runbook §7)."
    ),
)
def floating_tag_bakes_locked_harbor(site: SiteResource, git: GitRemotes, registry: Registry) -> dg.AssetCheckResult:
    cfg = site.config()
    tpu = cfg.tpu
    repository = ImageRef.parse(tpu.image).repository
    installed = read_installed(registry, repository=repository, reference=tpu.floating_tag,
                               site_packages=tpu.site_packages, package=tpu.harbor_package)
    head = git.ls_remote(url=tpu.consumer_repo, branch=tpu.consumer_branch)
    lock_text = git.show_file(url=tpu.consumer_repo, sha=head, path="uv.lock") if head else None
    locked = UvLock.read(Path("uv.lock"), lock_text).git_package(tpu.harbor_package)[1].commit if lock_text else None
    baked = installed.commit if installed else None
    same = baked is not None and baked == locked
    return dg.AssetCheckResult(
        passed=same,
        severity=dg.AssetCheckSeverity.WARN,
        description=(f":{tpu.floating_tag} bakes harbor {(baked or 'none')[:8]} = uv.lock" if same else
                     f":{tpu.floating_tag} bakes harbor {(baked or 'nothing')[:8]} but uv.lock at {(head or '?')[:8]} pins "
                     f"{(locked or '?')[:8]}: workers install the lock's harbor at start-up; rebuild only for first-serve latency"),
        metadata={"baked": dg.MetadataValue.text(baked or ""), "locked": dg.MetadataValue.text(locked or "")},
    )
