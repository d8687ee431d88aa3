"""What an event-log record of the tpu and jovian assets means as an alert (pure, from the record):
bad news (a failure, a hold, an outside move) and good news (a promotion, a rollback, a verified
build waiting for promotion, an adopted lab rev, a filed bench).

What needs the instance (is this the build's first verified record, where is the tag now, would the
policy let it be promoted) the alert sensor (sensors/alerts.py) asks and hands in: these stay pure.
The alert itself and its delivery are resources/alerts.py's.
"""

from __future__ import annotations

import dagster as dg

from jovian_assets.keys import BENCH as BENCH_REPORT
from jovian_assets.keys import BUILD_PROFILE
from resources.alerts import Alert, asset_link, one_line, short
from resources.site.alerts import AlertKind, AlertsSection
from tpu_assets.harbor_hold import HOLD, HOLD_REASON, LOCK_ACTION
from tpu_assets.history import BY
from tpu_assets.keys import FLOATING_TAG, HARBOR_LOCK, VERIFIED_IMAGE

# commits an alert lists; the rest are counted, the whole changelog is on the record
CHANGELOG_LINES = 5

__all__ = [
    "BENCH_REPORT",
    "BUILD_PROFILE",
    "HARBOR_LOCK",
    "alert_for",
    "bench_alert",
    "changelog_lines",
    "move_alert",
    "rev_adopted_alert",
    "verified_waiting_alert",
]


def _value(metadata: dict[str, dg.MetadataValue], key: str) -> object:
    return getattr(metadata.get(key), "value", None)


def _text(metadata: dict[str, dg.MetadataValue], key: str) -> str:
    value = _value(metadata, key)
    return "" if value is None else str(value)


def changelog_lines(
    metadata: dict[str, dg.MetadataValue], *, limit: int = CHANGELOG_LINES
) -> list[str]:
    """A move's changelog as an alert says it: the
    summary, the first `limit` commits, how many more."""
    summary = [
        one_line(line) for line in _text(metadata, "changelog_summary").splitlines() if line.strip()
    ]
    table = metadata.get("changelog")
    rows = [r.data for r in getattr(table, "records", None) or []]
    lines = [f"changelog: {line}" for line in summary]
    for row in rows[:limit]:
        sign = "+" if row.get("change") == "added" else "-"
        mark = " (must_contain)" if row.get("fix") else ""
        lines.append(
            f"  {sign} `{str(row.get('sha', ''))[:8]}` "
            f"{one_line(str(row.get('subject', '')), 100)} "
            f"({one_line(str(row.get('author', '')), 60)}){mark}"
        )
    total = int(_value(metadata, "commits_added") or 0) + int(
        _value(metadata, "commits_removed") or 0
    )
    if total > min(len(rows), limit):
        lines.append(f"  ... {total - min(len(rows), limit)} more on the record")
    return lines


def move_alert(alerts: AlertsSection, entry: dg.EventLogEntry, *, tag: str) -> Alert | None:
    """A promote or a rollback lockstep made (an outside
    move and a release are handled in alert_for)."""
    mat = entry.asset_materialization
    assert mat is not None
    meta, url = mat.metadata, asset_link(alerts, FLOATING_TAG)
    action = _text(meta, "action")
    frm, to = _text(meta, "from_digest"), _text(meta, "to_digest")
    build, by, note = (
        _text(meta, "build"),
        one_line(_text(meta, BY), 100),
        one_line(_text(meta, "note")),
    )
    what = f"build `{build[:8]}`" if build else f"`{short(to)}`"
    who = f" by {by}" if by else " (who: not recorded)"
    lines: list[str]
    if action == "promote":
        lines = [f":rocket: `:{tag}` promoted to {what}{who}: {short(frm)} -> {short(to)}"]
        kind: AlertKind = "promotion"
        also: list[AlertKind] = []
    elif action == "rollback":
        held = bool(_value(meta, "hold"))
        state = "HOLD set: nothing promotes until release_tpu_hold runs" if held else "no hold"
        lines = [
            f":rewind: floating tag rollback to {what}{who}: {short(frm)} -> {short(to)}; {state}"
        ]
        kind, also = "rollback", (["hold"] if held else [])
    else:
        return None
    if note:
        lines.append(f"note: {note}")
    lines += changelog_lines(meta)
    return Alert(kind=kind, also=also, url=url, text="\n".join([*lines, url]))


def verified_waiting_alert(
    alerts: AlertsSection, entry: dg.EventLogEntry, *, tag: str, at_tag: str | None, verdict: str
) -> Alert:
    """A verified build that is not at the tag. `at_tag`: the build the tag is at (None: no build of
    lockstep's, or nothing); `verdict`: what the promotion policy says of it now, in a sentence."""
    mat = entry.asset_materialization
    assert mat is not None
    build = entry.dagster_event.partition if entry.dagster_event else None  # type: ignore[union-attr]
    meta, url = mat.metadata, asset_link(alerts, VERIFIED_IMAGE, build)
    harbor, version = _text(meta, "harbor_commit"), _text(meta, "harbor_version")
    where = f"build `{at_tag[:8]}`" if at_tag else "no verified build"
    text = (
        f":white_check_mark: build `{(build or '?')[:8]}` verified "
        f"({short(_text(meta, 'digest'))}, harbor "
        f"`{harbor[:8]}`{f' {version}' if version else ''}), waiting: `:{tag}` is at {where}. "
        f"{verdict}\n{url}"
    )
    return Alert(kind="verified_build_waiting", url=url, text=text)


def rev_adopted_alert(alerts: AlertsSection, entry: dg.EventLogEntry) -> Alert | None:
    """A lab rev whose profile was written (its `jovian/build_profile` record); None when it was not
    (an unknown key: the check says why)."""
    mat = entry.asset_materialization
    assert mat is not None
    meta = mat.metadata
    outcome = _text(meta, "outcome")
    if outcome.startswith("NOT written"):
        return None
    rev = (entry.dagster_event.partition if entry.dagster_event else None) or "?"
    url = asset_link(alerts, BUILD_PROFILE, rev)
    commit = _text(meta, "build_commit")
    text = (
        f":inbox_tray: lab rev `{rev}` adopted: its profile in "
        f"`{_text(meta, 'build_dir') or '?'}` is "
        f"{one_line(outcome, 100) or 'written'} (build repo `{commit[:8]}`); build_jovian_rev "
        "builds, serves "
        f"and benches it\n{url}"
    )
    return Alert(kind="rev_adopted", url=url, text=text)


def bench_alert(alerts: AlertsSection, entry: dg.EventLogEntry) -> Alert:
    mat = entry.asset_materialization
    assert mat is not None
    meta = mat.metadata
    rev = (entry.dagster_event.partition if entry.dagster_event else None) or "?"
    url = asset_link(alerts, BENCH_REPORT, rev)
    lane = _text(meta, "lane") or "?"
    graded = _text(meta, "graded")
    lines = [
        (
            f":bar_chart: bench filed: `{rev}` on lane `{lane}` scores "
            f"{_text(meta, 'score') or '?'}"
            f"{f' (graded {graded})' if graded else ''}; baseline "
            f"{one_line(_text(meta, 'baseline'), 120) or 'none recorded'}"
        ),
        f"report: `{one_line(_text(meta, 'report'), 200)}`",
    ]
    if restored := _text(meta, "restored"):
        lines.append(f"below the baseline: the lane serves {one_line(restored, 120)} again")
    return Alert(kind="bench_filed", url=url, text="\n".join([*lines, url]))


def alert_for(alerts: AlertsSection, entry: dg.EventLogEntry, *, tag: str = "tpu") -> Alert | None:
    """The alert one event-log entry calls for, or None (a passed check, an ordinary re-lock...).
    The good news that needs the instance to judge
    (verified_image, build_profile, bench_report records)
    is the sensor's (`verified_waiting_alert`, `rev_adopted_alert`,
    `bench_alert`); `tag`: the floating tag's name."""
    event = entry.dagster_event
    if event is None:
        return None
    run_url = alerts.link(f"runs/{entry.run_id}")
    if event.event_type == dg.DagsterEventType.RUN_FAILURE:
        why = event.message or entry.user_message or "no reason recorded"
        return Alert(
            kind="run_failure",
            url=run_url,
            text=f":red_circle: run of `{event.job_name}` failed: {why}\n{run_url}",
        )
    if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
        check = event.asset_check_evaluation_data
        if check.passed or (not check.blocking and check.severity != dg.AssetCheckSeverity.ERROR):
            return None  # a failed WARN check is `check_warned_alert`'s
        url = asset_link(alerts, check.asset_key) + "?view=checks"
        # its run goes on and succeeds: without this alert nobody would hear of it
        if not check.blocking:
            why = one_line(check.description or "") or "no description"
            return Alert(
                kind="check_failure",
                url=url,
                text=f":x: check `{check.check_name}` on `{check.asset_key.to_user_string()}` "
                "failed "
                f"(ERROR, not blocking: downstream ran; run {run_url}): {why}\n{url}",
            )
        return Alert(
            kind="check_failure",
            url=url,
            text=f":no_entry: blocking check `{check.check_name}` on "
            f"`{check.asset_key.to_user_string()}` "
            f"failed (run {run_url}): downstream assets did not run\n{url}",
        )
    mat = entry.asset_materialization
    if mat is None:
        return None
    url = asset_link(alerts, mat.asset_key)
    meta = mat.metadata
    if mat.asset_key == FLOATING_TAG:
        action = str(_value(meta, "action") or "")
        to = _value(meta, "to_digest") or "nothing"
        if action == "observed":
            return Alert(
                kind="tag_moved",
                url=url,
                text=f":warning: the floating tag moved outside lockstep, to {to}\n{url}",
            )
        if action in ("promote", "rollback"):
            return move_alert(alerts, entry, tag=tag)
        if action == "release_hold":
            by = one_line(_text(meta, BY), 100)
            return Alert(
                kind="hold",
                url=url,
                text=f":pause_button: floating tag release_hold to {to}: hold released"
                f"{f' by {by}' if by else ''}\n{url}",
            )
        return None
    if mat.asset_key == HARBOR_LOCK:
        action = str(_value(meta, LOCK_ACTION) or "")
        if action not in ("runtime_pin", "release_hold"):
            return None
        by = one_line(_text(meta, BY), 100)
        state = (
            f"harbor HOLD set ({_value(meta, HOLD_REASON) or 'no reason'})"
            if _value(meta, HOLD)
            else f"harbor hold released{f' by {by}' if by else ''}: re-locked to the branch tip"
        )
        return Alert(kind="hold", url=url, text=f":pause_button: {state}\n{url}")
    return None
