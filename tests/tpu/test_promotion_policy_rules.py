"""The promotion rules at any time: soak, freeze (explicit
and cron, chained) and reject, with `now` injected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resources.site.promotion import FreezeWindow, PromotionSection
from tpu_assets.promotion_policy import (
    PolicyRefused,
    Rejection,
    judge,
    open_freeze,
    promotion_target,
)
from tpu_assets.rollback import VerifiedBuild

T = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)  # a Friday
B1 = VerifiedBuild(
    build="c1" * 20,
    digest="sha256:" + "1" * 64,
    harbor_commit="h1",
    verified_at=(T - timedelta(days=1)).timestamp(),
)
B2 = B1.model_copy(
    update={"build": "c2" * 20, "digest": "sha256:" + "2" * 64, "verified_at": T.timestamp()}
)
CAMPAIGN = FreezeWindow(
    name="q4-campaign", start=T - timedelta(hours=1), end=T + timedelta(hours=5)
)
WEEKEND = FreezeWindow(name="weekend", cron="0 18 * * fri", duration_minutes=63 * 60)


def refusal(build, policy: PromotionSection, now: datetime, **kwargs) -> PolicyRefused:  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyRefused) as info:
        judge(build, policy=policy, rejection=kwargs.pop("rejection", None), now=now, **kwargs)
    return info.value


def test_soak_refuses_until_verified_plus_soak_and_says_when() -> None:
    policy = PromotionSection(soak_minutes=120)
    err = refusal(B2, policy, T + timedelta(minutes=119, seconds=59))
    assert err.rule == "soak"
    assert str(err).startswith(
        f"soak: build {B2.build[:8]} was verified at 2026-12-04T12:00:00Z, soak 120 min, "
        "promotable at 2026-12-04T14:00:00Z"
    )
    assert judge(B2, policy=policy, rejection=None, now=T + timedelta(minutes=120)) is None


def test_explicit_freeze_names_the_window_and_its_end_and_only_a_noted_override_passes() -> None:
    policy = PromotionSection(freeze=[CAMPAIGN])
    err = refusal(B1, policy, T)
    assert (
        err.rule == "freeze"
        and "window 'q4-campaign' is open until 2026-12-04T17:00:00Z" in str(err)
    )
    assert "override_freeze" in str(err)
    assert "needs a note" in str(refusal(B1, policy, T, override_freeze=True, note="  "))
    override = judge(
        B1, policy=policy, rejection=None, now=T, override_freeze=True, note="hotfix for the eval"
    )
    assert (
        override is not None
        and override.window == "q4-campaign"
        and override.note == "hotfix for the eval"
    )
    # end is exclusive
    assert judge(B1, policy=policy, rejection=None, now=T + timedelta(hours=5)) is None
    assert judge(B1, policy=policy, rejection=None, now=T - timedelta(hours=1, seconds=1)) is None


def test_cron_window_opens_on_its_schedule_for_its_duration() -> None:
    friday_6pm = T.replace(hour=18)
    assert open_freeze([WEEKEND], now=friday_6pm - timedelta(seconds=1)) is None
    assert open_freeze([WEEKEND], now=friday_6pm) == (WEEKEND, friday_6pm + timedelta(hours=63))
    monday_9am = friday_6pm + timedelta(hours=63)
    assert open_freeze([WEEKEND], now=monday_9am - timedelta(minutes=1)) == (WEEKEND, monday_9am)
    assert open_freeze([WEEKEND], now=monday_9am) is None
    err = refusal(B1, PromotionSection(freeze=[WEEKEND]), friday_6pm + timedelta(hours=20))
    assert "window 'weekend' is open until 2026-12-07T09:00:00Z" in str(err)


def test_a_recurrence_that_opens_before_the_last_closed_extends_the_window() -> None:
    # 5 h every 4 h: never closes
    nightly = FreezeWindow(name="nightly-evals", cron="0 */4 * * *", duration_minutes=300)
    until = open_freeze([nightly], now=T)
    assert until is not None and until[1] > T + timedelta(days=100)
    both = open_freeze([CAMPAIGN, WEEKEND], now=T.replace(hour=18, minute=30))
    # the one that closes last is what a person waits for
    assert both is not None and both[0].name == "weekend"


def test_a_rejected_build_is_refused_whoever_asks_and_is_skipped_as_newest() -> None:
    rejected = Rejection(
        build=B2.build,
        rejected=True,
        by="ops@example.com",
        reason="leaks GPU memory",
        at=(T - timedelta(minutes=5)).timestamp(),
    )
    err = refusal(
        B2,
        PromotionSection(freeze=[CAMPAIGN]),
        T,
        rejection=rejected,
        override_freeze=True,
        note="n",
    )
    assert err.rule == "reject"
    assert (
        f"reject: build {B2.build[:8]} was rejected by ops@example.com at "
        "2026-12-04T11:55:00Z: leaks GPU memory"
    ) in str(err)
    assert promotion_target([B2, B1], build="", rejections={B2.build: rejected}) == B1
    # then refused
    assert promotion_target([B2, B1], build=B2.build[:8], rejections={B2.build: rejected}) == B2
    released = rejected.model_copy(update={"rejected": False})
    assert judge(B2, policy=PromotionSection(), rejection=released, now=T) is None
    assert promotion_target([B2, B1], build="", rejections={B2.build: released}) == B2
