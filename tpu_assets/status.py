"""Gathering what is deployed where (lockstep/status_model.py
`Status`) from the instance, the registry and git.

The instance holds the records (tpu/floating_tag's moves and tag hold, tpu/verified_image's builds
and rejections, tpu/harbor_lock's harbor hold, and the jovian location's jovian/lane,
jovian/distributed_image and jovian/bench_report, read by key: one instance serves both locations).
The registry (where `:tpu` is) and the consumer's uv.lock (what workers install) are read live. Each
verdict comes from the code that enforces it: the promotion policy's rules, the attestation check,
the rollback planner. A fact that cannot be read is left unknown and
named in `errors`; the rest of the status still stands.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import dagster as dg
from pydantic import Field, ValidationError

from lockstep.status_model import (
    STATUS_HASH,
    STATUS_JSON,
    ConsumerLock,
    Hold,
    LaneFacts,
    NewestBuild,
    Refusal,
    RollbackFacts,
    Status,
    TpuFacts,
    mismatch_warnings,
    render,
    short,
)
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.model import Model
from resources.registry import ImageRef, Registry
from resources.secrets import redact
from resources.site.schema import SiteConfig
from tpu_assets.harbor_hold import read_hold
from tpu_assets.history import TagHistory, tag_history, verified_history
from tpu_assets.keys import HARBOR_LOCK, STATUS
from tpu_assets.rollback import VerifiedRecords, current_state

T = TypeVar("T")


class _Errors(list[str]):
    def read(self, what: str, fn: Callable[[], T], default: T) -> T:
        """`fn()`, or `default` with the reason kept when it
        raises a LockstepError (unreachable, refused...)."""
        try:
            return fn()
        except LockstepError as exc:
            self.append(redact(f"{what}: {exc}")[:1000])
            return default


def _tag_hold(moves: TagHistory) -> Hold:
    """The tag hold, from the promotion log's newest
    record (the one that set it says why and when)."""
    if not current_state(moves)[1]:
        return Hold(held=False)
    newest = moves[0]
    reason = f"{newest.action} to build {short(newest.build)}" if newest.build else newest.action
    return Hold(
        held=True,
        reason=f"{reason}: nothing promotes until release_tpu_hold",
        since=newest.at or None,
        by=newest.recorded,
    )


def _harbor_hold(instance: dg.DagsterInstance) -> Hold:
    hold = read_hold(instance, HARBOR_LOCK)
    if not hold.held:
        return Hold(held=False)
    (record,) = instance.fetch_materializations(HARBOR_LOCK, limit=1).records
    return Hold(
        held=True,
        reason=f"{hold.reason}: no re-lock until release_harbor_hold",
        since=record.timestamp,
        by=f"run {record.run_id}" if record.run_id else "",
    )


def _verdict(
    site: SiteConfig,
    instance: dg.DagsterInstance,
    git: GitRemotes,
    registry: Registry,
    *,
    verified: VerifiedRecords,
    tpu: TpuFacts,
    tag_hold: Hold,
    now: datetime,
    errors: _Errors,
) -> NewestBuild | None:
    """The newest verified build, judged by every rule
    a promote of it would meet now, all of them listed
    (promote_tpu stops at the first)."""
    from resources.changelog import commit_range, range_summary
    from tpu_assets.attestation import AttestationRefused, require_attestation
    from tpu_assets.changelog import HARBOR
    from tpu_assets.promotion_policy import open_freeze, rejection_refusal, shown, soak_refusal
    from tpu_assets.rejection import rejections

    newest = next(iter(verified), None)
    if newest is None:
        return None
    refusals = []
    if tag_hold.held:
        refusals.append(
            Refusal(rule="hold", message=f"hold: :{tpu.tag} is on hold ({tag_hold.reason})")
        )
    if newest.digest == tpu.digest:
        refusals.append(Refusal(rule="already", message=f"already: :{tpu.tag} points at it"))
    if said := rejection_refusal(rejections(instance, [newest.build]).get(newest.build)):
        refusals.append(Refusal(rule="reject", message=said))
    policy = site.tpu.promotion
    if said := soak_refusal(newest, soak_minutes=policy.soak_minutes, now=now):
        refusals.append(Refusal(rule="soak", message=said))
    if frozen := open_freeze(policy.freeze, now=now):
        window, until = frozen
        refusals.append(
            Refusal(
                rule="freeze",
                message=(
                    f"freeze: window {window.name!r} is open until {shown(until)} (a person may "
                    "promote through it with "
                    "override_freeze and a note)"
                ),
            )
        )
    attestation = ""
    try:
        attestation = require_attestation(
            site,
            registry,
            repository=ImageRef.parse(site.tpu.image).repository,
            digest=newest.digest,
            target=newest,
        )
    except AttestationRefused as exc:
        refusals.append(Refusal(rule="attestation", message=redact(str(exc))[:2000]))
    except LockstepError as exc:
        errors.append(redact(f"attestation of {short(newest.digest)}: {exc}"))
    found = commit_range(
        git,
        repo=HARBOR,
        url=site.tpu.harbor_repo,
        base=tpu.baked_harbor,
        target=newest.harbor_commit,
    )
    return NewestBuild(
        build=newest.build,
        digest=newest.digest,
        harbor_commit=newest.harbor_commit,
        verified_at=newest.verified_at,
        promotable=not refusals,
        refusals=refusals,
        attestation=attestation,
        changelog=redact(range_summary(found)),
    )


def _rollback(
    site: SiteConfig,
    instance: dg.DagsterInstance,
    git: GitRemotes,
    registry: Registry,
    *,
    verified: VerifiedRecords,
    moves: TagHistory,
) -> RollbackFacts:
    """The default rollback plan, as `lockstep rollback
    plan` prints it (no build, no must_contain)."""
    from tpu_assets.promotion import plan_for
    from tpu_assets.runtime_rollback import explain_scopes

    plan = plan_for(site, instance, git, registry, verified=verified, moves=moves)
    try:  # the scopes read the consumer's lock: without git, the plan itself still stands
        scopes = explain_scopes(site, instance, git, plan, verified=verified, moves=moves)
    except LockstepError as exc:
        scopes = redact(f"what each scope changes: unknown ({exc})")[:1000]
    return RollbackFacts(
        target_build=plan.target.build if plan.target else None,
        target_digest=plan.target.digest if plan.target else None,
        explanation=plan.explain(),
        scopes=scopes,
    )


_SCORE = re.compile(r"^\s*(-?\d+)")


def _newest_of(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str
) -> dg.EventLogRecord | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    ).records
    return records[0] if records else None


def _values(record: dg.EventLogRecord | None) -> dict[str, object]:
    event = record.asset_materialization if record else None
    return {
        k: getattr(v, "value", getattr(v, "data", None))
        for k, v in (event.metadata if event else {}).items()
    }


class _LiveSeen(Model):
    """lane_watch_sensor's observation of jovian/lane,
    as read back (sensors/lane_watch.py writes it)."""

    live_nodes: dict[str, str | None]
    live_why: dict[str, str] = Field(default_factory=dict)
    container: str = ""


def _live(instance: dg.DagsterInstance, after: float | None) -> tuple[_LiveSeen, float] | None:
    """The newest lane_watch_sensor observation of
    jovian/lane when it is newer than `after` (the newest
    record): what the nodes run now. An observation that
    does not parse is not used (the record stands)."""
    from jovian_assets.keys import LANE, LANE_WATCH_SENSOR, LIVE_NODES, LIVE_WHY, OBSERVED_BY

    records = instance.fetch_observations(LANE, limit=1).records
    event = records[0].asset_observation if records else None
    if event is None or (after is not None and records[0].timestamp <= after):
        return None
    m = {k: getattr(v, "value", getattr(v, "data", None)) for k, v in event.metadata.items()}
    if m.get(OBSERVED_BY) != LANE_WATCH_SENSOR:
        return None
    try:
        seen = _LiveSeen.model_validate(
            {
                "live_nodes": m.get(LIVE_NODES),
                "live_why": m.get(LIVE_WHY) or {},
                "container": m.get("container") or "",
            }
        )
    except ValidationError:
        return None
    return seen, records[0].timestamp


def lane_facts(site: SiteConfig, instance: dg.DagsterInstance) -> list[LaneFacts]:
    """The site's lane as its newest jovian/lane record
    says, with its rev's distributed image and bench; the
    per-node image IDs read live (lane_watch_sensor) when
    the nodes were read after that record was written."""
    if site.jovian is None or site.jovian.lane is None:
        return []
    from jovian_assets.keys import BENCH, DISTRIBUTED
    from jovian_assets.lane import lane_history

    name = site.jovian.lane.name
    history = lane_history(instance, limit=1)
    if not history:
        return [LaneFacts(name=name)]
    now = history[0]
    facts = LaneFacts(
        name=name, action=now.action, rev=now.rev, tag=now.tag, nodes=now.nodes, ready_since=now.at
    )
    if (live := _live(instance, now.at)) is not None:
        seen, at = live
        facts.live, facts.live_at, facts.container = True, at, seen.container
        facts.nodes = {node: image_id for node, image_id in seen.live_nodes.items() if image_id}
        for node, image_id in seen.live_nodes.items():
            if image_id is None:
                why = seen.live_why.get(node, "no image ID")
                unread = why.startswith(("unreachable", "unreadable"))
                (facts.unread if unread else facts.idle)[node] = why
    if now.rev:
        facts.expected_image_id = (
            str(_values(_newest_of(instance, DISTRIBUTED, now.rev)).get("image_id") or "") or None
        )
        bench = _newest_of(instance, BENCH, now.rev)
        if bench is not None:
            m = _values(bench)
            facts.score = int(m["score"]) if isinstance(m.get("score"), int) else None  # type: ignore[arg-type]
            facts.baseline = str(m.get("baseline") or "")
            # A failed quality gate always puts the lane
            # back, and the report says where (`restored`).
            facts.gate_passed = "restored" not in m
            facts.bench_at = bench.timestamp
    return [facts]


def gather_status(
    site: SiteConfig,
    instance: dg.DagsterInstance,
    git: GitRemotes,
    registry: Registry,
    *,
    now: datetime,
    source: str = "status_sensor",
) -> Status:
    """Every fact of the status, read now; unreadable ones left unknown and named in `errors`."""
    from tpu_assets.changelog import baked_harbor
    from tpu_assets.runtime_rollback import locked_harbor

    errors = _Errors()
    tpu_cfg = site.tpu
    ref = ImageRef.parse(tpu_cfg.image)
    verified, moves = verified_history(instance), tag_history(instance)
    digest = errors.read(
        f"registry (:{tpu_cfg.floating_tag})",
        lambda: registry.resolve(repository=ref.repository, reference=tpu_cfg.floating_tag),
        None,
    )
    tpu = TpuFacts(
        image=f"{ref.registry}/{ref.repository}", tag=tpu_cfg.floating_tag, digest=digest
    )
    if digest is not None:
        record = verified.with_digest(digest)
        tpu.build = record.build if record else None
        tpu.baked_harbor = errors.read(
            f"what {short(digest)} bakes",
            lambda: baked_harbor(site, registry, digest=digest, verified=verified),
            None,
        )
        tpu.baked_from = "verified record" if record else "image layers" if tpu.baked_harbor else ""
    head, locked = errors.read(
        f"the consumer's uv.lock ({tpu_cfg.consumer_branch})",
        lambda: locked_harbor(site, git),
        (None, None),
    )
    consumer = ConsumerLock(branch=tpu_cfg.consumer_branch, head=head, harbor_commit=locked)
    tag_hold = _tag_hold(moves)
    newest = errors.read(
        "the newest verified build's verdict",
        lambda: _verdict(
            site,
            instance,
            git,
            registry,
            verified=verified,
            tpu=tpu,
            tag_hold=tag_hold,
            now=now,
            errors=errors,
        ),
        None,
    )
    rollback = errors.read(
        "the default rollback plan",
        lambda: _rollback(site, instance, git, registry, verified=verified, moves=moves),
        None,
    )
    lanes = errors.read("the lane", lambda: lane_facts(site, instance), [])
    for lane in lanes:  # a node lane_watch_sensor could not read is an unknown fact, not a mismatch
        errors.extend(
            redact(f"lane {lane.name} node {node}: {why}")[:1000]
            for node, why in sorted(lane.unread.items())
        )
    return Status(
        as_of=now.timestamp(),
        source=source,
        tpu=tpu,
        consumer=consumer,
        tag_hold=tag_hold,
        harbor_hold=_harbor_hold(instance),
        newest_build=newest,
        rollback=rollback,
        lanes=lanes,
        warnings=mismatch_warnings(tpu, consumer, lanes),
        errors=list(errors),
    )


def fingerprint(status: Status) -> str:
    """The record's hash without its time, and of each
    unknown fact only which one it is: a remote that stays
    down says it a little differently each tick (a
    timeout's seconds), which is not a change to record."""
    unknown = sorted(e.split(": ", 1)[0] for e in status.errors)
    facts = status.model_copy(update={"errors": unknown}).fingerprint_json()
    return hashlib.sha256(facts.encode()).hexdigest()[:32]


def status_observation(status: Status) -> dg.AssetObservation:
    """The status as an observation of lockstep/status:
    the whole record as JSON (what `lockstep status`
    reads), a few lines a person reads on the asset page, and the hash the sensor compares."""
    t, c = status.tpu, status.consumer
    b = status.newest_build
    return dg.AssetObservation(
        asset_key=STATUS,
        metadata={
            STATUS_JSON: dg.MetadataValue.json(status.model_dump(mode="json")),
            STATUS_HASH: dg.MetadataValue.text(fingerprint(status)),
            "warnings": dg.MetadataValue.text("\n".join(status.warnings) or "none"),
            "tpu": dg.MetadataValue.text(
                f":{t.tag} {t.digest or 'nothing'} (build {short(t.build)}, harbor "
                f"{short(t.baked_harbor)})"
            ),
            "lock": dg.MetadataValue.text(
                f"{c.branch} @ {short(c.head)} pins harbor {short(c.harbor_commit)}"
            ),
            "holds": dg.MetadataValue.text(
                f"tag {'HELD' if status.tag_hold.held else 'none'}, "
                f"harbor {'HELD' if status.harbor_hold.held else 'none'}"
            ),
            "newest_build": dg.MetadataValue.text(
                "none"
                if b is None
                else f"{short(b.build)} {short(b.digest)}: "
                + ("promotable" if b.promotable else ", ".join(r.rule for r in b.refusals))
            ),
            "summary": dg.MetadataValue.md(f"```\n{render(status, now=status.as_of)}\n```"),
        },
    )


def newest_status_hash(instance: dg.DagsterInstance) -> str | None:
    """The hash of the newest recorded status (whoever recorded it: the sensor or a refresh run)."""
    records = instance.fetch_observations(STATUS, limit=1).records
    event = records[0].asset_observation if records else None
    value = event.metadata.get(STATUS_HASH) if event else None
    return str(getattr(value, "value", "") or "") or None
