"""Alerts: what happened (pure, from event-log records), the Slack-compatible payload, and its delivery.

Delivery is one POST per webhook with bounded retries (urllib3's Retry: 3 tries with backoff on a
connection error or a 429/5xx), so a receiver that keeps failing costs a tick a few seconds, never
more. The URL is a secret: every error that leaves `deliver` has it redacted.
"""

from __future__ import annotations

import dagster as dg

from resources.errors import LockstepError
from resources.model import Model
from resources.secrets import quiet_urllib3
from resources.site_alerts import AlertKind, AlertsSection
from tpu_assets.harbor_hold import HOLD, HOLD_REASON, LOCK_ACTION
from tpu_assets.history import FLOATING_TAG

TRIES = 3
TIMEOUT_S = 10
HARBOR_LOCK = dg.AssetKey(["tpu", "harbor_lock"])


class Alert(Model):
    kind: AlertKind
    text: str
    url: str


class AlertNotDelivered(LockstepError):
    """A webhook refused or could not be reached, after every try."""


def _value(metadata: dict[str, dg.MetadataValue], key: str) -> object:
    return getattr(metadata.get(key), "value", None)


def asset_link(alerts: AlertsSection, key: dg.AssetKey) -> str:
    return alerts.link(f"assets/{'/'.join(key.path)}")


def alert_for(alerts: AlertsSection, entry: dg.EventLogEntry) -> Alert | None:
    """The alert one event-log entry calls for, or None (a passed check, an ordinary re-lock...)."""
    event = entry.dagster_event
    if event is None:
        return None
    run_url = alerts.link(f"runs/{entry.run_id}")
    if event.event_type == dg.DagsterEventType.RUN_FAILURE:
        why = event.message or entry.user_message or "no reason recorded"
        return Alert(kind="run_failure", url=run_url,
                     text=f":red_circle: run of `{event.job_name}` failed: {why}\n{run_url}")
    if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
        check = event.asset_check_evaluation_data
        if check.passed or not check.blocking:
            return None
        url = asset_link(alerts, check.asset_key) + "?view=checks"
        return Alert(kind="check_failure", url=url,
                     text=f":no_entry: blocking check `{check.check_name}` on `{check.asset_key.to_user_string()}` "
                          f"failed (run {run_url}): downstream assets did not run\n{url}")
    mat = entry.asset_materialization
    if mat is None:
        return None
    url = asset_link(alerts, mat.asset_key)
    meta = mat.metadata
    if mat.asset_key == FLOATING_TAG:
        action = str(_value(meta, "action") or "")
        to = _value(meta, "to_digest") or "nothing"
        if action == "observed":
            return Alert(kind="tag_moved", url=url,
                         text=f":warning: the floating tag moved outside lockstep, to {to}\n{url}")
        if action in ("rollback", "release_hold"):  # a promote is the expected path: not news
            held = bool(_value(meta, "hold"))
            state = "HOLD set" if held else "hold released" if action == "release_hold" else "no hold"
            return Alert(kind="hold", url=url,
                         text=f":pause_button: floating tag {action} to {to}: {state}\n{url}")
        return None
    if mat.asset_key == HARBOR_LOCK:
        action = str(_value(meta, LOCK_ACTION) or "")
        if action not in ("runtime_pin", "release_hold"):
            return None
        state = f"harbor HOLD set ({_value(meta, HOLD_REASON) or 'no reason'})" if _value(meta, HOLD) else \
            "harbor hold released: re-locked to the branch tip"
        return Alert(kind="hold", url=url, text=f":pause_button: {state}\n{url}")
    return None


def branch_gone_alert(alerts: AlertsSection, *, which: str, branch: str, where: str, sensor_page: str) -> Alert:
    """`sensor_page`: the watching sensor's page (`locations/<location>/sensors/<name>`), where its skips show."""
    url = alerts.link(sensor_page)
    return Alert(kind="branch_gone", url=url,
                 text=f":warning: the {which} branch `{branch}` no longer exists on {where}: nothing follows it "
                      f"until the site names the branch that replaced it\n{url}")


def payload(alert: Alert) -> dict[str, object]:
    """Slack-compatible: `text` for every receiver, one section block for those that render blocks."""
    return {"text": alert.text,
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": alert.text}}]}


def deliver(url: str, alert: Alert, *, backoff_s: float = 0.5) -> None:
    """POST the alert to `url`, up to TRIES times; AlertNotDelivered (URL redacted) when every try failed."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    quiet_urllib3()
    retry = Retry(total=TRIES - 1, backoff_factor=backoff_s, status_forcelist=(429, 500, 502, 503, 504),
                  allowed_methods=None, raise_on_status=False)
    with requests.Session() as session:
        session.mount("http://", HTTPAdapter(max_retries=retry))
        session.mount("https://", HTTPAdapter(max_retries=retry))
        try:
            response = session.post(url, json=payload(alert), timeout=TIMEOUT_S, allow_redirects=False)
        except requests.RequestException as exc:
            # Only the exception's type: urllib3's messages carry the URL's path apart from its host,
            # where redacting the whole URL would not catch it.
            raise AlertNotDelivered(f"{type(exc).__name__} after {TRIES} tries") from None
    if not response.ok:
        raise AlertNotDelivered(f"HTTP {response.status_code} after {TRIES} tries")
