"""Promotion policy: may this verified build go onto
the floating tag now? Pure functions, no Dagster.

Three rules, judged for a person's promote_tpu and for auto_promote_sensor alike (Kargo's
`requiredSoakTime`, freeze windows, and rejected freight):
- soak: a build is promotable `[tpu.promotion] soak_minutes` after it was verified;
- freeze: no promotion while a `[[tpu.promotion.freeze]]` window is open, unless a person overrides
  it (`override_freeze` with a note; automation never does);
- reject: a build someone rejected (`lockstep reject` / reject_tpu_build) is promoted by nobody
  until it is released.
`now` is a parameter everywhere, so the rules are tested at any time without waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

from resources.model import Model
from resources.site.promotion import FreezeWindow, PromotionSection
from tpu_assets.promotion import PromotionRefused
from tpu_assets.rollback import VerifiedBuild, VerifiedRecords, as_records

Rule = Literal["soak", "freeze", "reject"]


class Rejection(Model):
    """The newest reject/release record of one build
    (an observation on its tpu_builds partition)."""

    build: str
    rejected: bool  # False: a release undid an earlier rejection
    by: str
    reason: str
    at: float


class PolicyRefused(PromotionRefused):
    """A promotion the site's policy forbids now; `rule` says which, the message says until when."""

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.rule = rule


class FreezeOverride(Model):
    """A freeze a person promoted through: recorded with the move."""

    window: str
    until: datetime
    note: str


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def shown(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def soak_refusal(build: VerifiedBuild, *, soak_minutes: int, now: datetime) -> str | None:
    verified = utc(build.verified_at)
    promotable = verified + timedelta(minutes=soak_minutes)
    if now >= promotable:
        return None
    return (
        f"soak: build {build.build[:8]} was verified at {shown(verified)}, soak {soak_minutes} "
        "min, "
        f"promotable at {shown(promotable)}; nothing was moved"
    )


def open_freeze(
    windows: Sequence[FreezeWindow], *, now: datetime
) -> tuple[FreezeWindow, datetime] | None:
    """The open window that closes last (the one a person
    waits for), with when it closes; None when none is open."""
    found = [(w, end) for w in windows if (end := w.open_until(now)) is not None]
    return max(found, key=lambda pair: pair[1]) if found else None


def rejection_refusal(rejection: Rejection | None) -> str | None:
    if rejection is None or not rejection.rejected:
        return None
    return (
        f"reject: build {rejection.build[:8]} was rejected by {rejection.by} at "
        f"{shown(utc(rejection.at))}: "
        f"{rejection.reason} (release it with `lockstep release {rejection.build[:12]}` or "
        "release_tpu_build); "
        "nothing was moved"
    )


def judge(
    build: VerifiedBuild,
    *,
    policy: PromotionSection,
    rejection: Rejection | None,
    now: datetime,
    override_freeze: bool = False,
    note: str = "",
) -> FreezeOverride | None:
    """Raise PolicyRefused when a rule forbids promoting `build` at `now`; otherwise the freeze a
    person overrode (None when no window was open). Rejection is judged first (no override lifts
    it), then soak, then freeze."""
    if said := rejection_refusal(rejection):
        raise PolicyRefused("reject", said)
    if said := soak_refusal(build, soak_minutes=policy.soak_minutes, now=now):
        raise PolicyRefused("soak", said)
    frozen = open_freeze(policy.freeze, now=now)
    if frozen is None:
        return None
    window, until = frozen
    if not override_freeze:
        raise PolicyRefused(
            "freeze",
            (
                f"freeze: window {window.name!r} is open until {shown(until)}: no promotion "
                "before then. A person may "
                "promote through it with promote_tpu config override_freeze: true and a note "
                "saying why; "
                "nothing was moved"
            ),
        )
    if not note.strip():
        raise PolicyRefused(
            "freeze",
            (
                f"freeze: window {window.name!r} is open until {shown(until)}, and "
                "override_freeze needs a note saying "
                "why (it is kept in the promotion log); nothing was moved"
            ),
        )
    return FreezeOverride(window=window.name, until=until, note=note.strip())


def promotion_target(
    verified: Iterable[VerifiedBuild] | VerifiedRecords,
    *,
    build: str,
    rejections: Mapping[str, Rejection],
) -> VerifiedBuild | None:
    """The build a promote means: the one `build` names (by prefix), else the newest verified build
    nobody rejected (a rejected build is not a candidate,
    as rejected freight in Kargo). None: no such
    build (promote_move says why)."""
    records = as_records(verified)
    if build:
        return next(records.named(build), None)
    # Newest first, stopping at the first build nobody
    # rejected: each build's rejection is looked up alone.
    return next((v for v in records if not (r := rejections.get(v.build)) or not r.rejected), None)
