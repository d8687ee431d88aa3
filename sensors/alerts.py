"""alert_sensor: one path from the event log (and the watched branches) to the site's webhooks.

Run failures, holds set and released, and tag moves made outside lockstep are read from the event
log after the cursor's storage id; each failed run's failed blocking checks from that run's own log
(run-failure sensors do not fire for a failed check: dagster-io/dagster #29896); a watched branch that
vanished is found with one ls-remote per branch.
The cursor only moves past an event once every webhook that wants it took it, so a receiver that is
down gets the event on a later tick; after MAX_FAILED_TICKS ticks of refusals the event is given up
(a warning in the tick's log), so one broken receiver cannot stop every later alert.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from resources.alerts import (
    HARBOR_LOCK,
    Alert,
    AlertNotDelivered,
    alert_for,
    branch_gone_alert,
    deliver,
)
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.model import Model
from resources.secrets import redact
from resources.site import SiteConfig, SiteResource
from resources.site_alerts import AlertsSection, Webhook
from sensors.harbor import default_sensor_status
from tpu_assets.history import FLOATING_TAG

MAX_FAILED_TICKS = 3
_PAGE = 100
# The sensors that watch each branch, by their pages in the UI (the default repository of a location).
HARBOR_SENSOR_PAGE = "locations/tpu/sensors/harbor_branch_sensor"
LAB_SENSOR_PAGE = "locations/jovian/sensors/lab_rev_sensor"



class AlertCursor(Model):
    after: int = 0                                           # storage id of the last event handled
    sent: list[str] = Field(default_factory=list)           # '<alert #>:<webhook>' that took the next event
    failed_ticks: int = 0                                    # ticks that event has been refused on
    gone: dict[str, bool] = Field(default_factory=dict)     # watched branch -> known gone (alerted)


def _pages(instance: dg.DagsterInstance, after: int) -> list[Sequence[dg.EventLogRecord]]:
    """One page of each kind of record after `after`, oldest first.

    Failed checks are not queried across runs: on the default (run-sharded) SQLite storage a check
    evaluation lives only in its run's shard, and storage ids are not global there. A failed blocking
    check fails its run, so they are read from each failed run's own log (`_alerts`).
    """
    def assets(key: dg.AssetKey) -> Sequence[dg.EventLogRecord]:
        return instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, after_storage_id=after),
                                               limit=_PAGE, ascending=True).records

    runs = instance.fetch_run_status_changes(
        dg.RunStatusChangeRecordsFilter(event_type=dg.DagsterEventType.RUN_FAILURE, after_storage_id=after),
        limit=_PAGE, ascending=True).records
    return [runs, assets(FLOATING_TAG), assets(HARBOR_LOCK)]


def new_records(instance: dg.DagsterInstance, after: int) -> list[dg.EventLogRecord]:
    """The records after `after`, oldest first; a full page bounds the rest so nothing is stepped over."""
    pages = _pages(instance, after)
    full = [page[-1].storage_id for page in pages if len(page) == _PAGE]
    bound = min(full) if full else None
    records = [r for page in pages for r in page if bound is None or r.storage_id <= bound]
    return sorted(records, key=lambda r: r.storage_id)


def _alerts(instance: dg.DagsterInstance, alerts: AlertsSection, record: dg.EventLogRecord) -> list[Alert]:
    """What one record calls for: a failed run's failed blocking checks (each names the run: one alert per
    incident, not a second one for the run they failed), else the run itself."""
    entry = record.event_log_entry
    checks: list[Alert] = []
    if entry.dagster_event is not None and entry.dagster_event.event_type == dg.DagsterEventType.RUN_FAILURE:
        evaluations = instance.all_logs(entry.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        checks = [a for e in evaluations if (a := alert_for(alerts, e)) is not None]
    own = alert_for(alerts, entry)
    return checks or ([own] if own is not None else [])


def _send(context: dg.SensorEvaluationContext, hooks: list[Webhook], alert: Alert, already: list[str]) -> list[str]:
    """Deliver to every hook that wants the alert and has not taken it; the names that took it."""
    took = list(already)
    for hook in hooks:
        if hook.name in took or not hook.wants(alert.kind):
            continue
        url = os.environ.get(hook.url_env, "")
        if not url:
            context.log.warning(f"webhook {hook.name}: ${hook.url_env} is unset; {alert.kind} alert not sent")
            continue
        try:
            deliver(url, alert)
        except AlertNotDelivered as exc:
            context.log.warning(redact(f"webhook {hook.name}: {alert.kind} alert not delivered: {exc}", [url]))
            continue
        took.append(hook.name)
    return took


def _wanting(hooks: list[Webhook], alert: Alert) -> set[str]:
    return {h.name for h in hooks if h.wants(alert.kind) and os.environ.get(h.url_env)}


def _branches(site: SiteConfig) -> list[tuple[str, str, str, str]]:
    out = [("harbor", site.tpu.harbor_repo, site.tpu.harbor_branch, HARBOR_SENSOR_PAGE)]
    if site.jovian is not None:
        out.append(("lab", site.jovian.lab_repo, site.jovian.lab_branch, LAB_SENSOR_PAGE))
    return out


def build_alert_sensor(*, minimum_interval_seconds: int = 30) -> dg.SensorDefinition:
    @dg.sensor(
        name="alert_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_sensor_status(),
        description=(
            "Posts to the site's [[alerts.webhook]]s, once per event: a failed run, a failed blocking check, a "
            "hold set or released (floating tag, harbor), a floating-tag move made outside lockstep, a watched "
            "branch (harbor, lab) that no longer exists. The cursor is an event-log storage id: it moves past "
            f"an event once every webhook took it, or after {MAX_FAILED_TICKS} ticks of refusals."
        ),
    )
    def alert_sensor(context: dg.SensorEvaluationContext, site: SiteResource, git: GitRemotes) -> dg.SensorResult:
        try:
            config = site.config()
        except LockstepError as exc:
            return dg.SensorResult(skip_reason=f"site file unusable: {exc}")
        alerts = config.alerts
        if context.cursor:
            cursor = AlertCursor.model_validate_json(context.cursor)
        else:
            # A new sensor starts at the present: a site's whole history is not news.
            cursor = AlertCursor(after=context.instance.event_log_storage.get_maximum_record_id() or 0)
        hooks = alerts.webhook
        sent = 0
        for which, repo, branch, page in _branches(config):
            try:
                gone = git.ls_remote(url=repo, branch=branch) is None
            except LockstepError as exc:  # unreachable is not gone: say nothing until it answers
                context.log.warning(f"cannot read the {which} branch: {exc}")
                continue
            if gone and not cursor.gone.get(which):
                alert = branch_gone_alert(alerts, which=which, branch=branch, where=redact(repo), sensor_page=page)
                if not _wanting(hooks, alert) <= set(_send(context, hooks, alert, [])):
                    continue  # not recorded as known: tried again next tick
                sent += 1
            cursor.gone[which] = gone
        for record in new_records(context.instance, cursor.after):
            refused = False
            for i, alert in enumerate(_alerts(context.instance, alerts, record)):
                already = [n.partition(":")[2] for n in cursor.sent if n.startswith(f"{i}:")]
                took = _send(context, hooks, alert, already)
                cursor.sent = sorted({*cursor.sent, *(f"{i}:{n}" for n in took)})
                if _wanting(hooks, alert) <= set(took):
                    sent += len(set(took) - set(already))  # deliveries made this tick
                else:
                    refused = True
            if refused:
                cursor.failed_ticks += 1
                if cursor.failed_ticks < MAX_FAILED_TICKS:
                    break
                context.log.warning(f"alert for event {record.storage_id} given up after {MAX_FAILED_TICKS} "
                                    f"ticks of refusals; delivered: {', '.join(cursor.sent) or 'none'}")
            cursor = cursor.model_copy(update={"after": record.storage_id, "sent": [], "failed_ticks": 0})
        return dg.SensorResult(cursor=cursor.model_dump_json(),
                               skip_reason=f"{sent} deliveries; event cursor at {cursor.after}")

    return alert_sensor
