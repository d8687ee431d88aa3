"""``[alerts]``: where lockstep tells people that something needs them (Slack-compatible webhooks).

The site names each webhook's URL only by the environment variable that holds it: a webhook URL is a
credential (anyone holding it can post), so it is resolved by the alert sensor at send time and
never logged. Every check raises through pydantic so the site loader adds file and line.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, HttpUrl, model_validator

from resources.site.fields import Table
from resources.site.rules import KeyRefused, refuse

AlertKind = Literal[
    "run_failure",
    "check_failure",
    "hold",
    "tag_moved",
    "branch_gone",
    "promotion",
    "rollback",
    "verified_build_waiting",
    "rev_adopted",
    "bench_filed",
    "check_warned",
]
# Bad news: something needs a person. Good news (and
# a WARN): something a person wants to know happened.
BAD_NEWS: tuple[AlertKind, ...] = (
    "run_failure",
    "check_failure",
    "hold",
    "tag_moved",
    "branch_gone",
)
GOOD_NEWS: tuple[AlertKind, ...] = (
    "promotion",
    "rollback",
    "verified_build_waiting",
    "rev_adopted",
    "bench_filed",
    "check_warned",
)
ALL_KINDS: tuple[AlertKind, ...] = BAD_NEWS + GOOD_NEWS


class Webhook(Table):
    """``[[alerts.webhook]]``: one receiver of alerts."""

    name: Annotated[
        str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ] = Field(description="Shown in logs instead of the URL, e.g. 'ops-slack'.")
    url_env: str = Field(
        description="NAME of the environment variable holding the webhook URL (a secret)."
    )
    events: list[AlertKind] | None = Field(
        default=None,
        description=(
            f"Only these kinds ({', '.join(ALL_KINDS)}); unset: all of them, the good news too. "
            "A pager that "
            f"wants only what needs a person lists {', '.join(BAD_NEWS)}."
        ),
    )

    def wants(self, *kinds: str) -> bool:
        """Whether this webhook takes an alert of any of
        `kinds` (an alert may stand for two: a rollback
        that set the hold is a `rollback` and a `hold`)."""
        return self.events is None or any(kind in self.events for kind in kinds)


class AlertsSection(Table):
    """``[alerts]``: the webserver the alerts link to and the webhooks they go to."""

    base_url: HttpUrl = Field(
        default=HttpUrl("http://127.0.0.1:3000"),
        description="The Dagster webserver's URL, for the run and asset links in each alert.",
    )
    webhook: list[Webhook] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> AlertsSection:
        seen: set[str] = set()
        problems: list[KeyRefused] = []
        for i, hook in enumerate(self.webhook):
            if hook.name in seen:
                problems.append(
                    KeyRefused(
                        ("webhook", i, "name"), f"webhook name {hook.name!r} appears more than once"
                    )
                )
            seen.add(hook.name)
        refuse(problems)
        return self

    def link(self, path: str) -> str:
        return f"{str(self.base_url).rstrip('/')}/{path.lstrip('/')}"
