"""`tpu/floating_tag`: every move of the floating `:tpu`
— its materialization history IS the promotion log.

Promote moves the tag to a verified build, recording the pre-promote digest (the rollback target).
Rollback promotes older verified freight chosen by `plan_rollback` and sets a hold; while a hold is
set nothing promotes until a person releases it. The rules are plain functions (promotion.py); the
log's bookkeeping is tag_log.py; this body holds the lock, asks the registry, and records. The
attestation, changelog and inspection code loads with
the first run that needs it, not with the location.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from resources.git import GitRemotes
from resources.registry import ImageRef, Registry
from resources.site.resource import SiteResource
from resources.uv import UvCli, UvLock
from tpu_assets.history import (
    FIRST_PAGE,
    FLOATING_TAG,
    PROMOTE_FIRST,
    VERIFIED_IMAGE,
    acted_by,
    intent_observation,
    log_state,
    move_materialization,
    move_metadata,
    read_ahead,
    tag_history,
    verified_history,
)
from tpu_assets.promotion import (
    TAG_MOVES_POOL,
    decide_move,
    floating_tag_lock_name,
    put_and_reread,
    resolve_served,
)
from tpu_assets.rejection import (
    now_utc,
    override_entries,
    policy_gate,
    refuse_rejected_rollback,
)
from tpu_assets.rollback import TagMove
from tpu_assets.runtime_rollback import Scope, pin_after_image_rollback, runtime_only
from tpu_assets.tag_lock import floating_tag_lock
from tpu_assets.tag_log import TagIntent, noted, records_after_write, unrecorded_moves


class FloatingTagConfig(dg.Config):
    action: Literal["promote", "rollback", "release_hold"] = Field(
        description="What to do with the floating tag."
    )
    build: str = Field(
        default="",
        description="promote/rollback: a tpu_builds partition (or its prefix); empty = choose.",
    )
    must_contain: str = Field(
        default="",
        description=(
            "rollback: a harbor commit the target must contain (the fix); promote and rollback: "
            "marked in the changelog."
        ),
    )
    note: str = Field(
        default="", description="Why, in a person's words; kept in the promotion log."
    )
    by: str = Field(
        default="",
        description=(
            "Who acts, kept in the promotion log and named in the alert; empty: the run's "
            "`lockstep/by` tag, else "
            "its `dagster/user` tag (set by Dagster+)."
        ),
    )
    scope: Scope = Field(
        default="auto",
        description=(
            "rollback: `image` moves :tpu only; `runtime` pins harbor in the consumer's uv.lock "
            "to the target's "
            "(workers install from the lock) and sets the harbor hold; `both`; `auto` = both "
            "when the target "
            "bakes another harbor than the lock, else image."
        ),
    )
    override_freeze: bool = Field(
        default=False,
        description=(
            "promote: go through an open [[tpu.promotion.freeze]] window (needs a note; recorded)."
        ),
    )
    lock_timeout_s: float = Field(
        default=300.0,
        description=(
            "How long to wait for another lockstep writer of the floating tag (a run or the "
            "watch) to finish."
        ),
    )


@dg.asset(
    key=FLOATING_TAG,
    deps=[VERIFIED_IMAGE],
    group_name="tpu",
    kinds={"oci"},
    pool=TAG_MOVES_POOL,
    code_version="2",
    output_required=False,  # a runtime-only rollback does not touch the tag, so it records no move
    description=(
        "The floating tag other users pull (site `[tpu].floating_tag`, `:tpu`). Each "
        "materialization is "
        "one state of the tag: from-digest (the rollback target), to-digest, build, action "
        "(promote / "
        "rollback / release_hold, or observed for a move made outside lockstep) and the hold "
        "flag, so "
        "this asset's history is the promotion log. A move holds the floating-tag lock (Postgres "
        "advisory "
        "lock, or a file lock on a local instance) from its read to its record, logs its intent "
        "before the "
        "registry write, and records what the re-read shows. Each move's `changelog` lists the "
        "harbor commits "
        "between what the tag baked and what it bakes now (added by a promote, removed by a "
        "rollback), "
        "`must_contain` marked."
    ),
)
def floating_tag(
    context: dg.AssetExecutionContext,
    config: FloatingTagConfig,
    site: SiteResource,
    git: GitRemotes,
    registry: Registry,
    uv: UvCli,
) -> Iterator[dg.MaterializeResult]:
    from tpu_assets.attestation import require_attestation
    from tpu_assets.changelog import move_changelog

    cfg = site.config()
    by = acted_by(config.by, context.run.tags)
    context.log.info(
        f"{config.action} by {by or 'nobody named (set `by` in the config)'}"
        + (f": {config.note}" if config.note else "")
    )
    repository, tag, run_id = (
        ImageRef.parse(cfg.tpu.image).repository,
        cfg.tpu.floating_tag,
        context.run.run_id,
    )
    if config.action == "rollback" and config.scope == "runtime":
        runtime_only(
            context,
            cfg,
            git,
            uv,
            verified=verified_history(context.instance),
            moves=tag_history(context.instance),
            current=registry.resolve(repository=repository, reference=tag),
            must_contain=config.must_contain,
            build=config.build,
        )
        return
    with floating_tag_lock(
        context.instance,
        name=floating_tag_lock_name(cfg),
        timeout_s=config.lock_timeout_s,
        holder=f"run {run_id}",
    ) as held:
        context.log.info(f"holding the {held}")

        def record(move: TagMove) -> None:
            context.log.warning(move.recorded)
            context.log_event(move_materialization(cfg, move))

        # Only a digest the registry serves is ever recorded
        # as where the tag is (PhantomDigest otherwise).
        current = resolve_served(registry, repository=repository, tag=tag)
        # A promote or a release judges the newest record (where the tag is, its hold) and the
        # newest build or two; a rollback walks back a few: each reads only that to begin with.
        rolling_back = config.action == "rollback"
        verified = (
            verified_history(context.instance)
            if rolling_back
            else verified_history(context.instance, first=PROMOTE_FIRST)
        )
        # A promote's policy reads none of the log: on Postgres it is judged while the log is read.
        # A rollback is remedial: soak and freeze do not apply to it, a rejection does (below).
        gate = (
            read_ahead(
                context.instance,
                lambda: policy_gate(
                    context.instance,
                    cfg.tpu.promotion,
                    verified=verified,
                    build=config.build,
                    now=now_utc(),
                    override_freeze=config.override_freeze,
                    note=config.note,
                ),
            )
            if config.action == "promote"
            else None
        )
        # The log must end where the registry is before a
        # rule is judged on it (a dead run, a hand move).
        logged = tag_history(context.instance, first=FIRST_PAGE if rolling_back else 1)
        found = unrecorded_moves(
            log_state(context.instance, logged, registry_at=current),
            current,
            recorder=f"run {run_id}",
        )
        attested = ""
        try:
            build, override = (config.build, None) if gate is None else gate.result()
            move, plan_text = decide_move(
                config.action,
                site=cfg,
                git=git,
                verified=verified,
                logged=logged,
                found=found,
                current=current,
                build=build,
                must_contain=config.must_contain,
            )
            if config.action == "rollback" and move is not None:
                refuse_rejected_rollback(context.instance, move.build)
            if move is not None and move.to_digest is not None and move.to_digest != current:
                target = (
                    verified.with_digest(move.to_digest, build=move.build) if move.build else None
                )
                attested = require_attestation(
                    cfg, registry, repository=repository, digest=move.to_digest, target=target
                )
                if attested.startswith("attested"):
                    context.log.info(attested)
                # the site has no [attest]: said on every move, so nobody mistakes it for checked
                else:
                    context.log.warning(f"attestation {attested}")
        except Exception:  # refused (or git failed): what the registry showed is still recorded
            for outside in found:
                record(outside)
            raise
        if plan_text:
            context.log.info(plan_text)
        # Before the intent and the PUT: listing commits
        # never stands between a write and its record.
        changes = (
            {}
            if move is None
            else move_changelog(
                cfg, git, registry, move=move, verified=verified, must_contain=config.must_contain
            )
        )
        # the tag already is where this action leads, and the records found say how
        if move is None:
            *before, last = found
            for outside in before:
                record(outside)
            ours, later = (
                noted(
                    last, f"this {config.action} run found :{tag} already there: nothing to write"
                ),
                [],
            )
        else:
            # before the intent: an intent older than the log's newest record is settled
            for outside in found:
                record(outside)
            records = [move]
            if move.to_digest is not None and move.to_digest != current:
                context.log_event(
                    intent_observation(
                        cfg,
                        TagIntent(
                            run_id=run_id,
                            action=move.action,
                            from_digest=current,
                            to_digest=move.to_digest,  # type: ignore[arg-type]
                            build=move.build,
                            hold=move.hold,
                        ),
                    )
                )
                write = put_and_reread(
                    registry, repository=repository, tag=tag, target=move.to_digest
                )
                records = records_after_write(move, write, tag=tag)
            ours, *later = records
        # Yielded inside the lock: Dagster stores the materialization before this generator resumes
        # (tests/tpu/test_floating_tag_log.py proves it), so the next writer reads it.
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(ours.to_digest or "none"),
            metadata={
                **move_metadata(
                    cfg,
                    ours,
                    note=config.note,
                    must_contain=config.must_contain,
                    plan_text=plan_text,
                    by=by,
                ),
                **changes,
                **override_entries(override),
                **({"attestation": dg.MetadataValue.text(attested)} if attested else {}),
            },
        )
        for outside in later:
            record(outside)
    if config.action == "rollback" and config.scope != "image":
        pin_after_image_rollback(
            context, cfg, git, uv, scope=config.scope, move=ours, verified=verified
        )


@dg.asset_check(
    asset=FLOATING_TAG,
    description=(
        "WARN when the harbor baked into the image at the floating tag differs from the "
        "consumer's current "
        "uv.lock pin. Workers still run the locked harbor (they re-sync from the lock); this "
        "shows the "
        "image is behind, so first-serve does a big reinstall. A rebuild is optional (runbook §7)."
    ),
)
def floating_tag_bakes_locked_harbor(
    site: SiteResource, git: GitRemotes, registry: Registry
) -> dg.AssetCheckResult:
    from tpu_assets.inspection import read_installed

    cfg = site.config()
    tpu = cfg.tpu
    repository = ImageRef.parse(tpu.image).repository
    installed = read_installed(
        registry,
        repository=repository,
        reference=tpu.floating_tag,
        site_packages=tpu.site_packages,
        package=tpu.harbor_package,
    )
    head = git.ls_remote(url=tpu.consumer_repo, branch=tpu.consumer_branch)
    lock_text = git.show_file(url=tpu.consumer_repo, sha=head, path="uv.lock") if head else None
    locked = (
        UvLock.read(Path("uv.lock"), lock_text).git_package(tpu.harbor_package)[1].commit
        if lock_text
        else None
    )
    baked = installed.commit if installed else None
    same = baked is not None and baked == locked
    return dg.AssetCheckResult(
        passed=same,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f":{tpu.floating_tag} bakes harbor {(baked or 'none')[:8]} = uv.lock"
            if same
            else f":{tpu.floating_tag} bakes harbor {(baked or 'nothing')[:8]} but uv.lock at "
            f"{(head or '?')[:8]} pins "
            f"{(locked or '?')[:8]}: workers install the lock's harbor at start-up; rebuild only "
            "for first-serve latency"
        ),
        metadata={
            "baked": dg.MetadataValue.text(baked or ""),
            "locked": dg.MetadataValue.text(locked or ""),
        },
    )
