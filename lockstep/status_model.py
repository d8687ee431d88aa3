"""What is deployed where, as one record: the `Status` model, its mismatch warnings, and its text.

The tpu code location computes a `Status` (tpu_assets/status.py, on a sensor tick) and records it as
an observation of `lockstep/status`; `lockstep status` reads the newest one through the webserver's
GraphQL and prints it. This module is shared by both sides and imports only pydantic and the
standard library: the command must answer from a fresh process without importing dagster (~1.9 s
here). Everything read back through GraphQL is untrusted: `Status.model_validate` is the check.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from resources.model import Model

SCHEMA_VERSION = 1
STATUS_PATH = ["lockstep", "status"]  # the asset key, as a path (no dagster here)
STATUS_JSON = "status"  # the metadata entry holding the whole record as JSON
# the record's hash without its time: the sensor emits only when it changes
STATUS_HASH = "status_hash"

Rule = Literal["hold", "already", "reject", "soak", "freeze", "attestation"]


class TpuFacts(Model):
    """Where the floating tag is (read live from the registry) and what that image bakes."""

    image: str  # the repository, e.g. 127.0.0.1:5000/lockstep/tpu-runtime (no credentials)
    tag: str  # `tpu`
    digest: str | None  # None: the tag does not exist (or could not be read: see Status.errors)
    # the tpu_builds partition verified with that digest; None: not lockstep's build
    build: str | None = None
    baked_harbor: str | None = None  # the harbor commit installed in that image
    baked_from: Literal["verified record", "image layers", ""] = ""


class ConsumerLock(Model):
    """The consumer branch as git says it is now: the harbor its uv.lock makes workers install."""

    branch: str
    head: str | None  # the branch tip; None: no such branch (or unreadable)
    harbor_commit: str | None  # what its uv.lock pins


class Hold(Model):
    held: bool
    reason: str = ""
    since: float | None = None  # when the record that set it was written (epoch s)
    by: str = ""  # who or what set it


class Refusal(Model):
    rule: Rule
    message: str


class NewestBuild(Model):
    """The newest verified build and whether a promote may put it on the tag now."""

    build: str
    digest: str
    harbor_commit: str
    verified_at: float
    promotable: bool
    refusals: list[Refusal] = Field(default_factory=list)
    attestation: str = ""  # what promotion would say of its signature (when none refused it)
    changelog: str = ""  # harbor from what :tpu bakes to what this build bakes (one line)


class RollbackFacts(Model):
    """What a default rollback (no build, no must_contain) would do now: the planner's own words."""

    target_build: str | None
    target_digest: str | None
    explanation: str  # RollbackPlan.explain()
    scopes: str = ""  # explain_scopes: what each scope changes

    @property
    def ok(self) -> bool:
        return self.target_digest is not None


class LaneFacts(Model):
    """One lane: what its newest jovian/lane record says it serves, and the rev's bench."""

    name: str
    action: str = ""  # boot | restore | stop (the newest record); "" when nothing was ever recorded
    rev: str | None = None
    tag: str | None = None
    expected_image_id: str | None = None  # jovian/distributed_image's for the rev
    nodes: dict[str, str] = Field(default_factory=dict)  # lane node -> image ID it serves
    ready_since: float | None = None  # when that record was written: the rev was serving then
    # From lane_watch_sensor's newest observation when it is newer than the record: `nodes` are then
    # what each node's container runs (read live), `idle` the nodes where none runs and why,
    # `unread` those it could not read (unreachable), `live_at` when it looked.
    live: bool = False
    live_at: float | None = None
    container: str = ""  # the lane's container name, lockstep-<lane>
    idle: dict[str, str] = Field(default_factory=dict)
    unread: dict[str, str] = Field(default_factory=dict)
    score: int | None = None  # the rev's newest jovian/bench_report
    baseline: str = ""  # as the report states it: "<score> (<rev>, run <id>)" or "none recorded"
    gate_passed: bool | None = None
    bench_at: float | None = None


class Status(Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    as_of: float  # when it was computed (epoch s)
    source: str = "status_sensor"
    tpu: TpuFacts
    consumer: ConsumerLock
    tag_hold: Hold
    harbor_hold: Hold
    newest_build: NewestBuild | None = None
    rollback: RollbackFacts | None = None
    lanes: list[LaneFacts] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)  # facts that could not be read, and why

    def fingerprint_json(self) -> str:
        """The record without its time, canonical: equal when nothing but the clock moved."""
        return self.model_dump_json(exclude={"as_of"})


def short(value: str | None, n: int = 8) -> str:
    if not value:
        return "none"
    if value.startswith("sha256:"):
        return value[: 7 + 12]
    return value[:n]


def mismatch_warnings(tpu: TpuFacts, consumer: ConsumerLock, lanes: list[LaneFacts]) -> list[str]:
    """One line per fact that contradicts another: the image at the tag bakes another harbor than
    the consumer's lock makes workers install; a lane node
    serves another image ID than the rev's distributed one;
    a lane node runs no container while the lane's record
    says it serves (read live by lane_watch_sensor)."""
    out = []
    if tpu.baked_harbor and consumer.harbor_commit and tpu.baked_harbor != consumer.harbor_commit:
        out.append(
            f":{tpu.tag} ({short(tpu.digest)}) bakes harbor {short(tpu.baked_harbor)} but "
            f"uv.lock on {consumer.branch} "
            f"@ {short(consumer.head)} pins harbor {short(consumer.harbor_commit)}: workers "
            "install the lock's harbor "
            "at start-up (a big first-serve reinstall); rebuild, or roll the runtime back, to "
            "make them agree"
        )
    for lane in lanes:
        if lane.action in ("boot", "restore"):
            for node, why in sorted(lane.idle.items()):
                out.append(
                    f"lane {lane.name}: node {node} runs no container "
                    f"{lane.container or '(lane container)'} "
                    f"({why}, seen {when(lane.live_at)}): the lane serves on fewer nodes than it "
                    "should"
                )
        if not lane.expected_image_id:
            continue
        for node, image_id in sorted(lane.nodes.items()):
            if image_id != lane.expected_image_id:
                out.append(
                    f"lane {lane.name}: node {node} serves image {short(image_id)}, not "
                    f"{lane.rev}'s distributed image "
                    f"{short(lane.expected_image_id)}: the lane serves two builds at once"
                )
    return out


# -- text ------------------------------------------------------------------------------------------


def when(ts: float | None) -> str:
    return (
        "unknown" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )


def age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _hold(name: str, hold: Hold) -> str:
    if not hold.held:
        return f"{name}: none"
    extra = ", ".join(
        x
        for x in (
            f"since {when(hold.since)}" if hold.since else "",
            f"by {hold.by}" if hold.by else "",
        )
        if x
    )
    return f"{name}: HELD ({hold.reason or 'no reason recorded'}{'; ' + extra if extra else ''})"


def verdict_line(b: NewestBuild) -> str:
    return (
        "promotable now"
        if b.promotable
        else "NOT promotable: " + "; ".join(r.rule for r in b.refusals)
    )


def _details(b: NewestBuild) -> list[str]:
    """Each refusal in the policy's own words, the
    signature promotion would check, the changelog."""
    lines = [f"  - {r.message}" for r in b.refusals]
    if b.attestation:
        lines.append(f"  attestation: {b.attestation}")
    if b.changelog:
        lines.append(f"  changelog: {b.changelog}")
    return lines


def render(status: Status, *, now: float) -> str:
    """The human form: warnings first and loud, then each fact on a line or two."""
    lines = []
    for w in status.warnings:
        lines.append(f"WARNING: {w}")
    for e in status.errors:
        lines.append(f"UNKNOWN: {e}")
    if lines:
        lines.append("")
    t, c = status.tpu, status.consumer
    lines.append(f"as of {age(now - status.as_of)} ago ({when(status.as_of)}, {status.source})")
    where = f"build {short(t.build)}" if t.build else "not a build lockstep verified"
    lines.append(f":{t.tag}  {t.image}@{t.digest or 'nothing'}")
    lines.append(
        f"        {where}, bakes harbor {short(t.baked_harbor)}"
        + (f" (from its {t.baked_from})" if t.baked_from else "")
    )
    lines.append(
        f"lock    {c.branch} @ {short(c.head)}: uv.lock makes workers install harbor "
        f"{short(c.harbor_commit)}"
    )
    lines.append(_hold("tag hold   ", status.tag_hold))
    lines.append(_hold("harbor hold", status.harbor_hold))
    b = status.newest_build
    if b is None:
        lines.append("newest verified build: none")
    else:
        lines.append(
            f"newest verified build {short(b.build)} {short(b.digest)} (harbor "
            f"{short(b.harbor_commit)}, "
            f"verified {when(b.verified_at)}): {verdict_line(b)}"
        )
        lines.extend(_details(b))
    r = status.rollback
    if r is not None:
        lines.append(
            "default rollback: "
            + (
                f"to build {short(r.target_build)} {short(r.target_digest)}"
                if r.ok
                else "no target"
            )
        )
        lines.extend(f"  {line}" for line in r.explanation.splitlines())
    for lane in status.lanes:
        if not lane.action:
            lines.append(f"lane {lane.name}: nothing recorded")
            continue
        serving = f"rev {lane.rev} ({lane.tag})" if lane.rev or lane.tag else "nothing"
        lines.append(
            f"lane {lane.name}: {lane.action} -> serves {serving}, ready since "
            f"{when(lane.ready_since)}; "
            f"expected image {short(lane.expected_image_id)}"
        )
        if lane.live:
            lines.append(
                f"  node image IDs read live from the nodes at {when(lane.live_at)} "
                "(lane_watch_sensor)"
            )
        else:
            lines.append(
                "  node image IDs as the lane record says (not read live since it was written)"
            )
        for node, image_id in sorted(lane.nodes.items()):
            mark = (
                ""
                if image_id == lane.expected_image_id or not lane.expected_image_id
                else "  <- MISMATCH"
            )
            lines.append(f"  {node}: {short(image_id)}{mark}")
        for node, why in sorted(lane.idle.items()):
            lines.append(f"  {node}: no container  <- {why}")
        for node, why in sorted(lane.unread.items()):
            lines.append(f"  {node}: unknown ({why})")
        if lane.score is not None:
            gate = {True: "gate passed", False: "gate FAILED", None: "gate unknown"}[
                lane.gate_passed
            ]
            lines.append(
                f"  last score {lane.score} vs baseline {lane.baseline or 'none recorded'} "
                f"({gate}, {when(lane.bench_at)})"
            )
        else:
            lines.append("  no bench report for this rev")
    return "\n".join(lines)


def promote_plan(status: Status) -> tuple[str, bool]:
    """What `promote` (the newest verified build) would do now, and whether it may."""
    b, t = status.newest_build, status.tpu
    if b is None:
        return (
            (
                f"promote: no verified build: nothing to put on :{t.tag} (build -> checks -> "
                "smoke -> verified first)"
            ),
            False,
        )
    lines = [
        f"promote build {short(b.build)}: :{t.tag} {t.digest or 'nothing'} -> {b.digest}",
        f"  verdict: {verdict_line(b)}",
        *_details(b),
    ]
    return "\n".join(lines), b.promotable


def rollback_plan(status: Status) -> tuple[str, bool]:
    """What a default `rollback` would do now (target and
    why, then each scope), and whether it has a target."""
    r = status.rollback
    if r is None:
        return "rollback: the status has no rollback plan (see its errors)", False
    head = (
        f"rollback to build {short(r.target_build)}: :{status.tpu.tag} "
        f"{status.tpu.digest or 'nothing'} -> "
        f"{r.target_digest}"
        if r.ok
        else "rollback: no target"
    )
    return "\n".join([head, r.explanation, *([r.scopes] if r.scopes else [])]), r.ok
