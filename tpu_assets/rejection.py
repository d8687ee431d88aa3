"""Rejecting one build so nothing promotes it
(akuity/kargo #6151), releasing it, and the policy gate.

A rejection is an AssetObservation of `tpu/verified_image` on the build's `tpu_builds` partition:
it says something ABOUT the build without changing it, so it is not a materialization (that would
read as the build being verified again, and `verified_history` would count it), and it shows on the
very partition page a person opens to look at the build. The newest reject/release observation of a
partition is that build's state. Both are written under the floating-tag lock: a promote that holds
the lock either ran before the rejection was recorded or sees it.
"""

# No `from __future__ import annotations`: Dagster
# reads the op's config annotation at definition time.
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from resources.errors import LockstepError
from resources.links import commit_entries
from resources.site.promotion import PromotionSection
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from tpu_assets.history import RECORD_KIND
from tpu_assets.keys import VERIFIED_IMAGE
from tpu_assets.partitions import tpu_builds
from tpu_assets.promotion import PromotionRefused, floating_tag_lock_name
from tpu_assets.promotion_policy import (
    FreezeOverride,
    PolicyRefused,
    Rejection,
    judge,
    promotion_target,
    rejection_refusal,
)
from tpu_assets.rollback import VerifiedBuild, VerifiedRecords
from tpu_assets.tag_lock import floating_tag_lock

REJECTION, RELEASE = "rejection", "rejection_release"
_PAGE = 500
_BUILD = re.compile(r"^[0-9a-f]{4,40}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_TEXT = 500


def rejections(
    instance: dg.DagsterInstance, builds: Sequence[str] | None = None
) -> dict[str, Rejection]:
    """Each build's newest reject/release record, by build (builds never rejected are absent);
    `builds`: only those partitions' records are read (a sensor tick asks about one)."""
    out: dict[str, Rejection] = {}
    cursor = None
    records = dg.AssetRecordsFilter(
        asset_key=VERIFIED_IMAGE, asset_partitions=list(builds) if builds else None
    )
    while True:
        page = instance.fetch_observations(records, limit=_PAGE, cursor=cursor)
        for r in page.records:  # newest first
            obs = r.asset_observation
            meta = {k: getattr(v, "value", None) for k, v in (obs.metadata if obs else {}).items()}
            if (
                meta.get(RECORD_KIND) in (REJECTION, RELEASE)
                and r.partition_key
                and r.partition_key not in out
            ):
                out[r.partition_key] = Rejection(
                    build=r.partition_key,
                    rejected=meta[RECORD_KIND] == REJECTION,
                    by=str(meta.get("by") or ""),
                    reason=str(meta.get("reason") or ""),
                    at=r.timestamp,
                )
        if not page.has_more:
            return out
        cursor = page.cursor


class RejectionsByBuild(Mapping[str, Rejection]):
    """`rejections` read one build's partition at a time, when that build is asked about: a promote
    judges the newest build or two, whatever the number of builds ever rejected."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self._instance = instance
        self._known: dict[str, Rejection | None] = {}

    def __getitem__(self, build: str) -> Rejection:
        if build not in self._known:
            self._known[build] = rejections(self._instance, [build]).get(build)
        if (found := self._known[build]) is None:
            raise KeyError(build)
        return found

    # the whole record: only for a caller that asks for every build
    def __iter__(self) -> Iterator[str]:
        return iter(rejections(self._instance))

    def __len__(self) -> int:
        return len(rejections(self._instance))


def rejection_observation(
    site: SiteConfig, *, build: str, rejected: bool, by: str, reason: str
) -> dg.AssetObservation:
    verb = "REJECTED" if rejected else "released (promotable again)"
    return dg.AssetObservation(
        asset_key=VERIFIED_IMAGE,
        partition=build,
        metadata={
            RECORD_KIND: dg.MetadataValue.text(REJECTION if rejected else RELEASE),
            **commit_entries(site.links, "build", site.tpu.consumer_repo, build),
            "by": dg.MetadataValue.text(by),
            "reason": dg.MetadataValue.text(reason),
            "summary": dg.MetadataValue.md(
                f"build `{build[:12]}` **{verb}** by {by}"
                + (
                    (
                        ": nothing promotes it (promote_tpu, auto_promote) until `lockstep "
                        "release` or release_tpu_build"
                    )
                    if rejected
                    else ""
                )
            ),
        },
    )


def checked_text(kind: str, value: str, *, required: bool) -> str:
    value = value.strip()
    if required and not value:
        raise LockstepError(f"{kind} is empty: say it, it is kept with the record")
    if _CONTROL.search(value) or len(value) > MAX_TEXT:
        raise LockstepError(
            f"{kind} must be one line of at most {MAX_TEXT} characters (got {len(value)}, "
            f"control characters: {'yes' if _CONTROL.search(value) else 'no'})"
        )
    return value


def find_build(instance: dg.DagsterInstance, build: str) -> str:
    """The tpu_builds partition `build` (a commit sha or its prefix) names, exactly one."""
    if not _BUILD.match(build):
        raise LockstepError(
            f"build {build!r} is not a commit sha or a prefix of one (4 to 40 lower-case hex "
            "digits)"
        )
    matches = [p for p in instance.get_dynamic_partitions(tpu_builds.name) if p.startswith(build)]
    if len(matches) != 1:
        raise PromotionRefused(
            f"build {build} names {'no' if not matches else len(matches)} tpu_builds partitions"
            + (f" ({', '.join(m[:12] for m in matches)}): give more of the sha" if matches else "")
        )
    return matches[0]


def record_rejection(
    instance: dg.DagsterInstance,
    site: SiteConfig,
    *,
    build: str,
    rejected: bool,
    by: str,
    reason: str,
    emit: Callable[[dg.AssetObservation], None],
    holder: str,
    lock_timeout_s: float = 300.0,
) -> Rejection:
    """Record that `build` is rejected (or released), under the floating-tag lock. `emit` logs the
    observation: a run's `context.log_event`, or the instance's runless write for the CLI."""
    full = find_build(instance, build)
    by = checked_text("by (who)", by, required=True)
    reason = checked_text("reason", reason, required=rejected)
    with floating_tag_lock(
        instance, name=floating_tag_lock_name(site), timeout_s=lock_timeout_s, holder=holder
    ):
        before = rejections(instance, [full]).get(full)
        if (before is not None and before.rejected) == rejected:
            raise PromotionRefused(  # a "no", not a failure: the CLI exits 1
                f"build {full[:12]} is {'already rejected' if rejected else 'not rejected'}"
                + (f" (by {before.by}: {before.reason})" if before and rejected else "")
                + ": nothing recorded"
            )
        emit(rejection_observation(site, build=full, rejected=rejected, by=by, reason=reason))
    return Rejection(build=full, rejected=rejected, by=by, reason=reason, at=time.time())


def policy_gate(
    instance: dg.DagsterInstance,
    policy: PromotionSection,
    *,
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    build: str,
    now: datetime,
    override_freeze: bool = False,
    note: str = "",
) -> tuple[str, FreezeOverride | None]:
    """The build a promote means (full sha; `build` itself when there is none, for promote_move to
    refuse) and the freeze it overrode; PolicyRefused when the site's rules say not now."""
    known = RejectionsByBuild(instance)
    target = promotion_target(verified, build=build, rejections=known)
    if target is None:
        # every verified build is rejected
        if not build and (newest := next(iter(verified), None)) is not None:
            raise PolicyRefused(
                "reject",
                rejection_refusal(known.get(newest.build)) or "every verified build is rejected",
            )
        return build, None
    return target.build, judge(
        target,
        policy=policy,
        rejection=known.get(target.build),
        now=now,
        override_freeze=override_freeze,
        note=note,
    )


def auto_promote_refusal(
    instance: dg.DagsterInstance,
    policy: PromotionSection,
    record: dg.EventLogRecord,
    *,
    now: datetime,
) -> PolicyRefused | None:
    """Why auto_promote must not promote the build
    `record` (a verified_image materialization) verified,
    or None. Automation never overrides a freeze."""
    meta = record.asset_materialization.metadata if record.asset_materialization else {}
    build = VerifiedBuild(
        build=record.partition_key or "",
        digest=str(getattr(meta.get("digest"), "value", "")),
        harbor_commit=str(getattr(meta.get("harbor_commit"), "value", "")),
        verified_at=record.timestamp,
    )
    try:
        judge(
            build,
            policy=policy,
            rejection=rejections(instance, [build.build]).get(build.build),
            now=now,
        )
    except PolicyRefused as exc:
        return exc
    return None


def refuse_rejected_rollback(instance: dg.DagsterInstance, target: str | None) -> None:
    """A rollback is a promotion of older freight: it must not land on a build someone rejected."""
    if target and (said := rejection_refusal(rejections(instance, [target]).get(target))):
        raise PolicyRefused(
            "reject",
            f"rollback target {said}. Name another target with `build`, or release it first",
        )


def override_entries(override: FreezeOverride | None) -> dict[str, dg.MetadataValue]:
    """What a promote through a freeze adds to its
    floating-tag record (nothing when there was none)."""
    if override is None:
        return {}
    return {
        "override_freeze": dg.MetadataValue.bool(True),
        "freeze_window": dg.MetadataValue.text(override.window),
        "freeze_until": dg.MetadataValue.timestamp(override.until),
        "override_note": dg.MetadataValue.text(override.note),
    }


def now_utc() -> datetime:
    return datetime.now(UTC)


class RejectionConfig(dg.Config):
    build: str = Field(
        description="The tpu_builds partition (a consumer commit sha, or a prefix of it)."
    )
    reason: str = Field(default="", description="Why (required to reject): shown in every refusal.")
    by: str = Field(
        default="", description="Who; empty: the run's dagster/user tag (set by Dagster+)."
    )


def rejection_op(rejected: bool):  # type: ignore[no-untyped-def]
    """The op of reject_tpu_build / release_tpu_build (tpu_assets/jobs.py)."""

    @dg.op(
        name="reject_build" if rejected else "release_build",
        description=(
            (
                "Record that the build is rejected: neither promote_tpu nor "
                "auto_promote_sensor promotes it."
            )
            if rejected
            else "Undo a rejection: the build may be promoted again (soak and freeze still apply)."
        ),
    )
    def record(context: dg.OpExecutionContext, config: RejectionConfig, site: SiteResource) -> None:
        by = config.by or context.run.tags.get("dagster/user", "")
        if not by:
            raise PromotionRefused("say who you are: set `by` in the run config (nothing recorded)")
        done = record_rejection(
            context.instance,
            site.config(),
            build=config.build,
            rejected=rejected,
            by=by,
            reason=config.reason,
            emit=context.log_event,
            holder=f"run {context.run.run_id}",
        )
        context.log.info(
            f"build {done.build[:12]} {'rejected' if rejected else 'released'} by {done.by}"
        )

    return record
