"""`rollback_tpu`'s scope: roll back the image
(`:tpu`), the runtime (the consumer's uv.lock), or both.

A `:tpu` rollback alone does not change what iris workers run: they install harbor from uv.lock at
start-up. So scope `runtime` pins the lock to the target build's harbor commit (runtime_pin.py) and
sets the harbor hold (harbor_hold.py), recorded as a `tpu/harbor_lock` materialization. The image
move comes first: if it fails, nothing is pushed; if the pin fails after it, the image rollback
stays recorded and the error says the runtime was not pinned.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import dagster as dg

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.site.schema import SiteConfig
from resources.uv import UvCli, UvLock
from tpu_assets.harbor_hold import hold_entries
from tpu_assets.history import tag_history, verified_history
from tpu_assets.keys import HARBOR_LOCK
from tpu_assets.lock_record import lock_metadata
from tpu_assets.models import HarborLock
from tpu_assets.partitions import tpu_builds
from tpu_assets.promotion import PromotionRefused, rollback_plan
from tpu_assets.rejection import refuse_rejected_rollback
from tpu_assets.rollback import (
    Candidate,
    RollbackPlan,
    TagMove,
    VerifiedBuild,
    VerifiedRecords,
    as_records,
)
from tpu_assets.runtime_pin import pin_runtime

Scope = Literal["auto", "image", "runtime", "both"]


class RuntimePinFailed(LockstepError):
    """The image rollback is done and recorded, but the runtime pin pushed nothing."""


def locked_harbor(site: SiteConfig, git: GitRemotes) -> tuple[str | None, str | None]:
    """(consumer branch tip, the harbor commit its uv.lock pins): what workers install now."""
    tpu = site.tpu
    head = git.ls_remote(url=tpu.consumer_repo, branch=tpu.consumer_branch)
    text = git.show_file(url=tpu.consumer_repo, sha=head, path="uv.lock") if head else None
    if text is None:
        return head, None
    return head, UvLock.read(Path("uv.lock"), text).git_package(tpu.harbor_package)[1].commit


def resolve_scope(
    scope: Scope, *, target_harbor: str | None, locked: str | None
) -> tuple[bool, bool]:
    """(move the image, pin the runtime). `auto`: both
    when the target bakes another harbor than the lock."""
    if scope == "auto":
        return True, target_harbor is not None and target_harbor != locked
    return scope in ("image", "both"), scope in ("runtime", "both")


def harbor_of(verified: Iterable[VerifiedBuild] | VerifiedRecords, build: str | None) -> str | None:
    found = (
        next((v for v in as_records(verified).named(build) if v.build == build), None)
        if build
        else None
    )
    return found.harbor_commit if found else None


def runtime_plan(
    site: SiteConfig,
    git: GitRemotes,
    *,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    moves: Iterable[TagMove],
    current: str | None,
    must_contain: str = "",
    build: str = "",
) -> RollbackPlan:
    """The plan for scope `runtime` alone: the image stays, so the build `:tpu` is at is a fine
    runtime target (it brings the workers back in line
    with the image); every other rule (verified only,
    `must_contain` ancestry, `build`) is the image rollback's."""
    plan = rollback_plan(
        site,
        git,
        verified=verified,
        moves=moves,
        current=None,
        must_contain=must_contain,
        build=build,
    )
    return plan.model_copy(update={"current_digest": current})


def _runtime_change(target: Candidate | None, *, where: str, locked: str | None) -> str:
    if target is None or target.harbor_commit is None:
        return f"nothing (no target): uv.lock on {where} stays at harbor {(locked or '?')[:8]}"
    if target.harbor_commit == locked:
        return f"nothing: uv.lock on {where} already pins harbor {target.harbor_commit[:8]}"
    return (
        f"one commit on {where}: uv.lock + HARBOR_COMMIT {(locked or '?')[:8]} -> "
        f"{target.harbor_commit[:8]} "
        f"(build {(target.build or '')[:8]}; pyproject pins rev), harbor hold set until "
        "release_harbor_hold"
    )


def scope_summary(
    plan: RollbackPlan,
    *,
    tag: str,
    consumer_branch: str,
    consumer_head: str | None,
    locked: str | None,
    runtime: RollbackPlan,
) -> str:
    """What each scope would change, in a person's
    words (the CLI prints it under the plan). `runtime`
    is the plan for scope runtime alone (runtime_plan)."""
    t, where = plan.target, f"{consumer_branch} @ {(consumer_head or '?')[:8]}"
    lines = ["What each scope changes:"]
    if t is None:
        lines.append(
            f"  image: nothing (no target): :{tag} stays at {plan.current_digest or 'nothing'}"
        )
    else:
        lines.append(
            f"  image: :{tag} {plan.current_digest or 'nothing'} -> {t.digest} (build "
            f"{(t.build or '')[:8]}), "
            f"tag hold set; workers still install harbor {(locked or '?')[:8]} from uv.lock"
        )
    lines.append(f"  runtime (with both): {_runtime_change(t, where=where, locked=locked)}")
    lines.append(
        "  runtime alone (the tag stays): "
        f"{_runtime_change(runtime.target, where=where, locked=locked)}"
    )
    _, pin = resolve_scope("auto", target_harbor=t.harbor_commit if t else None, locked=locked)
    why = (
        "the target bakes another harbor than the lock"
        if pin
        else "the target bakes the harbor the lock pins"
    )
    lines.append(f"  default (auto): {'both' if pin else 'image'} ({why})")
    return "\n".join(lines)


def pin_for_rollback(
    context: dg.AssetExecutionContext,
    site: SiteConfig,
    git: GitRemotes,
    uv: UvCli,
    *,
    build: str,
    harbor_commit: str,
    image_done: str,
) -> HarborLock:
    """Push the runtime pin and record it (hold set) on
    `tpu/harbor_lock`; RuntimePinFailed names what is done."""
    try:
        lock = pin_runtime(
            tpu=site.tpu,
            git=git,
            uv=uv,
            author=site.site.commit_author,
            harbor_commit=harbor_commit,
            build=build,
        )
    except LockstepError as exc:
        raise RuntimePinFailed(
            f"{image_done}the runtime pin to harbor {harbor_commit[:8]} pushed nothing: {exc}. "
            "Workers still install "
            "the harbor uv.lock pins; fix that, then run rollback_tpu with scope: runtime and "
            f"build: {build[:8]}"
        ) from None
    if not context.instance.has_dynamic_partition(tpu_builds.name, lock.consumer_commit):
        context.instance.add_dynamic_partitions(tpu_builds.name, [lock.consumer_commit])
    reason = (
        f"runtime rollback to build {build[:8]} (harbor {harbor_commit[:8]}) by run "
        f"{context.run.run_id}"
    )
    context.log_event(
        dg.AssetMaterialization(
            asset_key=HARBOR_LOCK,
            metadata=lock_metadata(lock, site)
            | hold_entries(action="runtime_pin", held=True, reason=reason),
            tags={"dagster/data_version": lock.consumer_commit},
        )
    )
    context.log.info(
        f"runtime pinned: consumer {lock.consumer_commit[:8]} locks harbor {harbor_commit[:8]} "
        f"(pushed={lock.pushed}); harbor hold set"
    )
    return lock


def runtime_only(
    context: dg.AssetExecutionContext,
    site: SiteConfig,
    git: GitRemotes,
    uv: UvCli,
    *,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    moves: Iterable[TagMove],
    current: str | None,
    must_contain: str,
    build: str,
) -> None:
    """Scope `runtime`: plan, refuse a no-op, pin. The
    floating tag is not touched (and records nothing)."""
    plan = runtime_plan(
        site,
        git,
        verified=verified,
        moves=moves,
        current=current,
        must_contain=must_contain,
        build=build,
    )
    context.log.info(plan.explain())
    if plan.target is None or plan.target.build is None or plan.target.harbor_commit is None:
        raise PromotionRefused(f"runtime rollback refused, nothing was pushed:\n{plan.explain()}")
    # as an image rollback's target is
    refuse_rejected_rollback(context.instance, plan.target.build)
    _, locked = locked_harbor(site, git)
    if plan.target.harbor_commit == locked:
        raise PromotionRefused(
            f"runtime rollback refused: uv.lock already pins harbor {locked[:8]} (build "
            f"{plan.target.build[:8]}'s): nothing to roll back, nothing was pushed"
        )
    pin_for_rollback(
        context,
        site,
        git,
        uv,
        build=plan.target.build,
        harbor_commit=plan.target.harbor_commit,
        image_done="",
    )


def pin_after_image_rollback(
    context: dg.AssetExecutionContext,
    site: SiteConfig,
    git: GitRemotes,
    uv: UvCli,
    *,
    scope: Scope,
    move: TagMove,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
) -> None:
    """After `:tpu` moved back (and that move is
    recorded), pin the runtime when the scope says so."""
    harbor = harbor_of(verified, move.build)
    if move.action != "rollback" or move.build is None or harbor is None:
        return
    head, locked = locked_harbor(site, git)
    _, pin = resolve_scope(scope, target_harbor=harbor, locked=locked)
    if not pin:
        context.log.info(
            f"scope {scope}: uv.lock at {(head or '?')[:8]} already pins harbor "
            f"{(locked or '?')[:8]}, "
            "the target's: the runtime needs no pin"
        )
        return
    done = (
        f"the image rollback is done and recorded (:{site.tpu.floating_tag} -> {move.to_digest}, "
        "build "
        f"{move.build[:8]}, tag hold set), but "
    )
    pin_for_rollback(
        context, site, git, uv, build=move.build, harbor_commit=harbor, image_done=done
    )


def explain_scopes(
    site: SiteConfig,
    instance: dg.DagsterInstance,
    git: GitRemotes,
    plan: RollbackPlan,
    *,
    must_contain: str = "",
    build: str = "",
    verified: VerifiedRecords | None = None,
    moves: Iterable[TagMove] | None = None,
) -> str:
    """`scope_summary` from the instance's history
    (or the histories already read) and the consumer's
    current lock (changes nothing)."""
    head, locked = locked_harbor(site, git)
    runtime = runtime_plan(
        site,
        git,
        verified=verified if verified is not None else verified_history(instance),
        moves=moves if moves is not None else tag_history(instance),
        current=plan.current_digest,
        must_contain=must_contain,
        build=build,
    )
    return scope_summary(
        plan,
        tag=site.tpu.floating_tag,
        consumer_branch=site.tpu.consumer_branch,
        consumer_head=head,
        locked=locked,
        runtime=runtime,
    )
