"""Alerts: the alert, the Slack-compatible payload and its delivery, and the alerts any location's
events call for alike (a failed WARN check, a vanished branch).

What a tpu or jovian record means as an alert (a move, a hold, a verified build, an adopted rev, a
filed bench) is tpu_assets/alert_events.py's: resources import no location.

Delivery is one POST per webhook with bounded retries (urllib3's Retry: 3 tries with backoff on a
connection error or a 429/5xx), so a receiver that keeps failing costs a tick a few seconds, never
more. The URL is a secret: every error that leaves `deliver` has it redacted.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from resources.errors import LockstepError
from resources.model import Model
from resources.secrets import quiet_urllib3, redact
from resources.site.alerts import AlertKind, AlertsSection

TRIES = 3
TIMEOUT_S = 10
MAX_LINE = 300  # a check's description or a note, as an alert quotes it


class Alert(Model):
    kind: AlertKind
    # other kinds it stands for: a rollback that set the hold
    also: list[AlertKind] = Field(default_factory=list)
    text: str
    url: str

    @property
    def kinds(self) -> list[AlertKind]:
        return [self.kind, *self.also]


class AlertNotDelivered(LockstepError):
    """A webhook refused or could not be reached, after every try."""


def asset_link(alerts: AlertsSection, key: dg.AssetKey, partition: str | None = None) -> str:
    return alerts.link(
        f"assets/{'/'.join(key.path)}" + (f"?partition={partition}" if partition else "")
    )


def short(digest: str) -> str:
    """`sha256:` and 12 hex digits: enough to tell digests apart in a chat line."""
    algo, _, hexes = digest.partition(":")
    return f"{algo}:{hexes[:12]}" if hexes else (digest or "nothing")


def one_line(text: str, width: int = MAX_LINE) -> str:
    """A person's or a tool's text as one printable line, bounded, with no URL credentials (as
    resources/changelog.py's shown_line, which is not
    imported: it loads with the first run that needs it)."""
    lines = redact(text).strip().splitlines()
    line = "".join(c if c.isprintable() else "?" for c in lines[0]) if lines else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def check_warned_alert(alerts: AlertsSection, entry: dg.EventLogEntry) -> Alert | None:
    """A failed WARN-severity check (a failed blocking check is `check_failure`, in alert_for)."""
    event = entry.dagster_event
    if event is None or event.event_type != dg.DagsterEventType.ASSET_CHECK_EVALUATION:
        return None
    check = event.asset_check_evaluation_data
    if check.passed or check.severity != dg.AssetCheckSeverity.WARN:
        return None
    url = asset_link(alerts, check.asset_key) + "?view=checks"
    why = one_line(check.description or "") or "no description"
    return Alert(
        kind="check_warned",
        url=url,
        text=(
            f":warning: WARN check `{check.check_name}` on "
            f"`{check.asset_key.to_user_string()}`: {why}\n{url}"
        ),
    )


def branch_gone_alert(
    alerts: AlertsSection, *, which: str, branch: str, where: str, sensor_page: str
) -> Alert:
    """`sensor_page`: the watching sensor's page
    (`locations/<location>/sensors/<name>`), where its skips show."""
    url = alerts.link(sensor_page)
    return Alert(
        kind="branch_gone",
        url=url,
        text=f":warning: the {which} branch `{branch}` no longer exists on {where}: nothing "
        "follows it "
        f"until the site names the branch that replaced it\n{url}",
    )


def payload(alert: Alert) -> dict[str, object]:
    """Slack-compatible: `text` for every receiver,
    one section block for those that render blocks."""
    return {
        "text": alert.text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": alert.text}}],
    }


def deliver(url: str, alert: Alert, *, backoff_s: float = 0.5) -> None:
    """POST the alert to `url`, up to TRIES times;
    AlertNotDelivered (URL redacted) when every try failed."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    quiet_urllib3()
    retry = Retry(
        total=TRIES - 1,
        backoff_factor=backoff_s,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=None,
        raise_on_status=False,
    )
    with requests.Session() as session:
        session.mount("http://", HTTPAdapter(max_retries=retry))
        session.mount("https://", HTTPAdapter(max_retries=retry))
        try:
            response = session.post(
                url, json=payload(alert), timeout=TIMEOUT_S, allow_redirects=False
            )
        except requests.RequestException as exc:
            # Only the exception's type: urllib3's messages carry the URL's path apart from its
            # host, where redacting the whole URL would not catch it.
            raise AlertNotDelivered(f"{type(exc).__name__} after {TRIES} tries") from None
    if not response.ok:
        raise AlertNotDelivered(f"HTTP {response.status_code} after {TRIES} tries")
