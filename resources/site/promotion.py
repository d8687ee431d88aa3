"""``[tpu.promotion]``: when a verified build may go
onto the floating tag (soak time, freeze windows).

A freeze window is either explicit (`start`/`end`, UTC timestamps) or recurring (`cron` + a
duration, evaluated in UTC). Cron expressions are parsed by cronsim: it has no dependencies, its
parser is strict (a typo is an error at load, not a schedule that never fires), and it iterates
backwards, which is what "is a window open now" needs. Every check raises NameRefused with the value
in its own words, so the site loader adds file and line.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from resources.names import NameRefused
from resources.site.fields import Table, checked
from resources.site.rules import KeyRefused, refuse

# A window may recur at most this often and last at most this long: past that it is a typo
# (a year-long weekly freeze), and the walk that finds a chained window's end stays short.
MAX_DURATION_MINUTES = 366 * 24 * 60
_CHAIN_LIMIT = 1000


def check_cron(kind: str, value: object) -> str:
    from cronsim import CronSim, CronSimError

    if not isinstance(value, str) or not value.strip():
        raise NameRefused(
            f"{kind} {value!r} is not a cron expression (five fields, e.g. '0 18 * * fri')"
        )
    try:
        CronSim(value, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise NameRefused(
            f"{kind} {value!r} is not a cron expression ({exc}): five fields, minute hour "
            "day-of-month month day-of-week, in UTC, e.g. '0 18 * * fri'"
        ) from None
    return value


def check_utc(value: datetime) -> datetime:
    # A naive time would be read in whatever zone the daemon runs in: refuse it rather than guess.
    if value.tzinfo is None or value.utcoffset() is None:
        raise NameRefused(
            f"timestamp {value.isoformat()} has no UTC offset: write it as UTC, e.g. "
            f"{value.isoformat()}Z"
        )
    return value.astimezone(UTC)


UtcTime = Annotated[datetime, AfterValidator(check_utc)]


class FreezeWindow(Table):
    """``[[tpu.promotion.freeze]]``: while open, no
    promotion (a person may override it, with a note)."""

    name: Annotated[
        str, Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.:-]*$")
    ] = Field(description="Shown in every refusal, e.g. 'q4-campaign'.")
    start: UtcTime | None = Field(
        default=None, description="Explicit window: UTC start, e.g. 2026-12-20T00:00:00Z."
    )
    end: UtcTime | None = Field(default=None, description="Explicit window: UTC end (exclusive).")
    cron: Annotated[str, checked(check_cron, "cron")] | None = Field(
        default=None,
        description=(
            "Recurring window: when it opens, a cron expression in UTC, e.g. '0 18 * * fri'."
        ),
    )
    duration_minutes: int | None = Field(
        default=None,
        gt=0,
        le=MAX_DURATION_MINUTES,
        description="Recurring window: how long it stays open.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> FreezeWindow:
        explicit = self.start is not None or self.end is not None
        recurring = self.cron is not None or self.duration_minutes is not None
        if explicit and recurring:
            raise KeyRefused(
                ("cron" if self.cron is not None else "duration_minutes",),
                (
                    f"freeze {self.name!r} mixes start/end with cron/duration_minutes: a "
                    "window is one or the other"
                ),
            )
        # Each refusal names a key that IS in the window's table, so the error points into it.
        if recurring and (self.cron is None or self.duration_minutes is None):
            missing, given = (
                ("cron", "duration_minutes") if self.cron is None else ("duration_minutes", "cron")
            )
            raise KeyRefused(
                (given,),
                f"freeze {self.name!r}: a recurring window needs both cron and "
                f"duration_minutes ({missing} is missing)",
            )
        if not recurring:
            if self.start is None or self.end is None:
                given = (
                    "start" if self.start is not None else "end" if self.end is not None else "name"
                )
                raise KeyRefused(
                    (given,),
                    f"freeze {self.name!r}: set start and end (UTC), or cron and duration_minutes",
                )
            if self.end <= self.start:
                raise KeyRefused(
                    ("end",),
                    f"freeze {self.name!r}: end {self.end.isoformat()} is not after start "
                    f"{self.start.isoformat()}",
                )
        return self

    def open_until(self, now: datetime) -> datetime | None:
        """When the window that is open at `now` closes (a recurrence that opens before the previous
        one closed extends it); None when it is closed at `now`."""
        from cronsim import CronSim

        if self.cron is None or self.duration_minutes is None:
            assert self.start is not None and self.end is not None
            return self.end if self.start <= now < self.end else None
        length = timedelta(minutes=self.duration_minutes)
        # cronsim steps strictly before its start point:
        # one second past `now` makes `now` itself count.
        opened = next(CronSim(self.cron, now + timedelta(seconds=1), reverse=True), None)
        if opened is None or now >= opened + length:
            return None
        end = opened + length
        later = CronSim(self.cron, now)
        for _ in range(_CHAIN_LIMIT):
            nxt = next(later, None)
            if nxt is None or nxt > end:
                break
            end = nxt + length
        return end


class PromotionSection(Table):
    """``[tpu.promotion]``: the rules a promotion (by a person or auto_promote) must pass."""

    soak_minutes: int = Field(
        default=0,
        ge=0,
        le=MAX_DURATION_MINUTES,
        description="A build is promotable this many minutes after it was verified.",
    )
    freeze: list[FreezeWindow] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> PromotionSection:
        seen: set[str] = set()
        problems: list[KeyRefused] = []
        for i, window in enumerate(self.freeze):
            if window.name in seen:
                problems.append(
                    KeyRefused(
                        ("freeze", i, "name"), f"freeze name {window.name!r} appears more than once"
                    )
                )
            seen.add(window.name)
        refuse(problems)
        return self
