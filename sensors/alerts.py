"""alert_sensor: one path from the event log (and the watched branches) to the site's webhooks.

Run failures, holds set and released, tag moves (lockstep's promotions and rollbacks, and those made
outside it), verified builds, adopted lab revs and filed benches are read from the event log after
the cursor's storage id; each finished run's failed checks (blocking ones fail the run, WARN ones do
not) from that run's own log (run-failure sensors do not fire for a failed check: dagster-io/dagster
#29896); a watched branch that vanished is found with one ls-remote per branch.
The cursor only moves past an event once every webhook that wants it took it, so a receiver that is
down gets the event on a later tick; after MAX_FAILED_TICKS ticks of refusals the event is given up
(a warning in the tick's log), so one broken receiver cannot stop every later alert.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from jovian_assets.keys import BENCH as BENCH_REPORT
from jovian_assets.keys import BUILD_PROFILE
from resources.alerts import (
    Alert,
    AlertNotDelivered,
    branch_gone_alert,
    check_warned_alert,
    deliver,
)
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.model import Model
from resources.secrets import redact
from resources.site.alerts import AlertsSection, Webhook
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from sensors.tick_resources import default_sensor_status, site_config, skipping
from tpu_assets.alert_events import (
    alert_for,
    bench_alert,
    rev_adopted_alert,
    verified_waiting_alert,
)
from tpu_assets.history import tag_history
from tpu_assets.keys import FLOATING_TAG, HARBOR_LOCK, VERIFIED_IMAGE
from tpu_assets.rejection import auto_promote_refusal, now_utc

MAX_FAILED_TICKS = 3
_PAGE = 100
# The sensors that watch each branch, by their pages
# in the UI (the default repository of a location).
HARBOR_SENSOR_PAGE = "locations/tpu/sensors/harbor_branch_sensor"
LAB_SENSOR_PAGE = "locations/jovian/sensors/lab_rev_sensor"


class AlertCursor(Model):
    after: int = 0  # storage id of the last event handled
    # '<alert #>:<webhook>' that took the next event
    sent: list[str] = Field(default_factory=list)
    failed_ticks: int = 0  # ticks that event has been refused on
    gone: dict[str, bool] = Field(default_factory=dict)  # watched branch -> known gone (alerted)


def _pages(instance: dg.DagsterInstance, after: int) -> list[Sequence[dg.EventLogRecord]]:
    """One page of each kind of record after `after`, oldest first.

    Failed checks are not queried across runs: on the default (run-sharded) SQLite storage a check
    evaluation lives only in its run's shard, and storage ids are not global there. Every check runs
    in a run, so they are read from each finished (failed or succeeded) run's own log (`_alerts`):
    the same on SQLite and Postgres.
    """

    def assets(key: dg.AssetKey) -> Sequence[dg.EventLogRecord]:
        return instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_storage_id=after),
            limit=_PAGE,
            ascending=True,
        ).records

    def runs(status: dg.DagsterEventType) -> Sequence[dg.EventLogRecord]:
        return instance.fetch_run_status_changes(
            dg.RunStatusChangeRecordsFilter(event_type=status, after_storage_id=after),
            limit=_PAGE,
            ascending=True,
        ).records

    return [
        runs(dg.DagsterEventType.RUN_FAILURE),
        runs(dg.DagsterEventType.RUN_SUCCESS),
        *(
            assets(key)
            for key in (FLOATING_TAG, HARBOR_LOCK, VERIFIED_IMAGE, BUILD_PROFILE, BENCH_REPORT)
        ),
    ]


def new_records(instance: dg.DagsterInstance, after: int) -> list[dg.EventLogRecord]:
    """The records after `after`, oldest first; a full
    page bounds the rest so nothing is stepped over."""
    pages = _pages(instance, after)
    full = [page[-1].storage_id for page in pages if len(page) == _PAGE]
    bound = min(full) if full else None
    records = [r for page in pages for r in page if bound is None or r.storage_id <= bound]
    return sorted(records, key=lambda r: r.storage_id)


def _first_of_partition(instance: dg.DagsterInstance, record: dg.EventLogRecord) -> bool:
    """Whether `record` is its asset partition's first
    materialization: a build verified again, a rev
    adopted again, is not news twice."""
    key, partition = record.asset_key, record.partition_key
    if key is None or partition is None:
        return True
    earlier = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=key, asset_partitions=[partition], before_storage_id=record.storage_id
        ),
        limit=1,
    ).records
    return not earlier


def _adopted_before(
    instance: dg.DagsterInstance, record: dg.EventLogRecord, alerts: AlertsSection
) -> bool:
    """Whether the rev's profile was written by an earlier
    build_profile record (one that was not refused)."""
    earlier = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=BUILD_PROFILE,
            asset_partitions=[record.partition_key or ""],
            before_storage_id=record.storage_id,
        ),
        limit=_PAGE,
    ).records
    return any(rev_adopted_alert(alerts, r.event_log_entry) is not None for r in earlier)


def _waiting(
    instance: dg.DagsterInstance, site: SiteConfig, record: dg.EventLogRecord
) -> Alert | None:
    """A build's first verified record, unless the
    tag is at that build by the time the tick reads it
    (auto_promote got there first: the promotion says
    so). The verdict is the auto_promote rule's."""
    if not _first_of_partition(instance, record):
        return None
    newest = next(iter(tag_history(instance, first=1)), None)
    build = record.partition_key or ""
    if newest is not None and newest.build == build:
        return None
    if newest is not None and newest.hold:
        verdict = (
            f"`:{site.tpu.floating_tag}` is on hold after a rollback: release_tpu_hold first, "
            "then promote_tpu."
        )
    elif refused := auto_promote_refusal(instance, site.tpu.promotion, record, now=now_utc()):
        verdict = f"Not promotable now: {refused}"
    elif site.tpu.auto_promote:
        verdict = (
            "Promotable now: auto_promote_sensor promotes the newest verified build on its "
            "next tick."
        )
    else:
        verdict = "Promotable now: run promote_tpu."
    return verified_waiting_alert(
        site.alerts,
        record.event_log_entry,
        tag=site.tpu.floating_tag,
        at_tag=newest.build if newest is not None else None,
        verdict=verdict,
    )


def _alerts(
    instance: dg.DagsterInstance, site: SiteConfig, record: dg.EventLogRecord
) -> list[Alert]:
    """What one record calls for. A finished run: its failed blocking checks (each names the run:
    one alert per incident, not a second one for the
    run they failed), else the run itself if it failed;
    and its failed WARN checks, one alert per evaluation. An asset record: its own alert, if any."""
    alerts, entry, key = site.alerts, record.event_log_entry, record.asset_key
    event = entry.dagster_event
    if event is not None and event.event_type in (
        dg.DagsterEventType.RUN_FAILURE,
        dg.DagsterEventType.RUN_SUCCESS,
    ):
        evaluations = instance.all_logs(
            entry.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
        checks = [a for e in evaluations if (a := alert_for(alerts, e)) is not None]
        warned = [a for e in evaluations if (a := check_warned_alert(alerts, e)) is not None]
        own = alert_for(alerts, entry)
        return (checks or ([own] if own is not None else [])) + warned
    if key == VERIFIED_IMAGE:
        waiting = _waiting(instance, site, record)
        return [waiting] if waiting is not None else []
    if key == BUILD_PROFILE:
        adopted = rev_adopted_alert(alerts, entry)
        return (
            [adopted]
            if adopted is not None and not _adopted_before(instance, record, alerts)
            else []
        )
    if key == BENCH_REPORT:
        return [bench_alert(alerts, entry)]
    own = alert_for(alerts, entry, tag=site.tpu.floating_tag)
    return [own] if own is not None else []


def _send(
    context: dg.SensorEvaluationContext, hooks: list[Webhook], alert: Alert, already: list[str]
) -> list[str]:
    """Deliver to every hook that wants the alert and has not taken it; the names that took it."""
    took = list(already)
    for hook in hooks:
        if hook.name in took or not hook.wants(*alert.kinds):
            continue
        url = os.environ.get(hook.url_env, "")
        if not url:
            context.log.warning(
                f"webhook {hook.name}: ${hook.url_env} is unset; {alert.kind} alert not sent"
            )
            continue
        try:
            deliver(url, alert)
        except AlertNotDelivered as exc:
            context.log.warning(
                redact(f"webhook {hook.name}: {alert.kind} alert not delivered: {exc}", [url])
            )
            continue
        took.append(hook.name)
    return took


def _wanting(hooks: list[Webhook], alert: Alert) -> set[str]:
    return {h.name for h in hooks if h.wants(*alert.kinds) and os.environ.get(h.url_env)}


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
            "Posts to the site's [[alerts.webhook]]s, once per event: a failed run, a failed "
            "blocking check, a "
            "hold set or released (floating tag, harbor), a floating-tag move made outside "
            "lockstep, a watched "
            "branch (harbor, lab) that no longer exists; and the good news: a promotion, a "
            "rollback, a verified "
            "build waiting for promotion, an adopted lab rev, a filed bench, and a failed WARN "
            "check. "
            "The cursor is an event-log storage id: it moves past "
            f"an event once every webhook took it, or after {MAX_FAILED_TICKS} ticks of refusals."
        ),
    )
    def alert_sensor(
        context: dg.SensorEvaluationContext, site: SiteResource, git: GitRemotes
    ) -> dg.SensorResult:
        return skipping(lambda: _tick(context, site, git))

    def _tick(
        context: dg.SensorEvaluationContext, site: SiteResource, git: GitRemotes
    ) -> dg.SensorResult:
        config = site_config(site)
        alerts = config.alerts
        if context.cursor:
            cursor = AlertCursor.model_validate_json(context.cursor)
        else:
            # A new sensor starts at the present: a site's whole history is not news.
            cursor = AlertCursor(
                after=context.instance.event_log_storage.get_maximum_record_id() or 0
            )
        hooks = alerts.webhook
        sent = 0
        for which, repo, branch, page in _branches(config):
            try:
                gone = git.ls_remote(url=repo, branch=branch) is None
            except LockstepError as exc:  # unreachable is not gone: say nothing until it answers
                context.log.warning(f"cannot read the {which} branch: {exc}")
                continue
            if gone and not cursor.gone.get(which):
                alert = branch_gone_alert(
                    alerts, which=which, branch=branch, where=redact(repo), sensor_page=page
                )
                if not _wanting(hooks, alert) <= set(_send(context, hooks, alert, [])):
                    continue  # not recorded as known: tried again next tick
                sent += 1
            cursor.gone[which] = gone
        for record in new_records(context.instance, cursor.after):
            refused = False
            for i, alert in enumerate(_alerts(context.instance, config, record)):
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
                context.log.warning(
                    f"alert for event {record.storage_id} given up after {MAX_FAILED_TICKS} "
                    f"ticks of refusals; delivered: {', '.join(cursor.sent) or 'none'}"
                )
            cursor = cursor.model_copy(
                update={"after": record.storage_id, "sent": [], "failed_ticks": 0}
            )
        return dg.SensorResult(
            cursor=cursor.model_dump_json(),
            skip_reason=f"{sent} deliveries; event cursor at {cursor.after}",
        )

    return alert_sensor
