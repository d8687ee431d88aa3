"""`lockstep status`: what is deployed where, read
from the webserver (no database, no dagster import).

The status is computed in the tpu code location (status_sensor, or the refresh_status job) and
recorded as an observation of `lockstep/status`; this command reads the newest one over GraphQL,
checks its shape (lockstep/status_model.py), and prints it. `plan_text` answers `promote --plan` and
`rollback --plan` from the same record. Exit codes: 0 all facts agree, 1 a warning (or an unknown
fact), 2 usage, 3 operational (the webserver does not answer, no status recorded yet, a bad record).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Literal

import click
from pydantic import ValidationError

from lockstep.act_cmd import check_url
from lockstep.exits import NEGATIVE, OK, OPERATIONAL
from lockstep.graphql import DEFAULT_URL, REPOSITORY, Webserver, WebserverError
from lockstep.status_model import (
    STATUS_JSON,
    STATUS_PATH,
    Status,
    age,
    promote_plan,
    render,
    rollback_plan,
)
from resources.errors import LockstepError

SENSOR = "status_sensor"
LOCATION = "tpu"


class NoStatus(LockstepError):
    """The webserver answered, but holds no usable status record."""


_SENSOR_STATE = """
query SensorState($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status ticks(limit: 1) { timestamp status } } }
  }
}
"""


def read_status(web: Webserver) -> tuple[Status, float]:
    """The newest recorded status, validated, and when it was recorded (epoch s)."""
    observations, _ = web.asset_events(STATUS_PATH, limit=1)
    key = "/".join(STATUS_PATH)
    if not observations:
        raise NoStatus(
            f"{web.url} has no {key} observation yet: turn on {SENSOR} (tpu location, Automation "
            "page; it records "
            f"one within a minute) or launch the refresh_status job"
        )
    newest = observations[0]
    raw = newest["metadata"].get(STATUS_JSON)
    try:
        status = Status.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "(top)"
        raise NoStatus(
            f"{web.url}: the newest {key} observation is not a status this lockstep reads "
            f"(metadata {STATUS_JSON!r} at {where}: {first.get('msg', 'invalid')}); a newer or "
            "older "
            "lockstep wrote it? launch refresh_status with this version"
        ) from None
    try:
        # GraphQL gives milliseconds, as a string
        recorded = float(newest.get("timestamp") or 0) / 1000.0
    except (TypeError, ValueError):
        recorded = status.as_of
    return status, recorded or status.as_of


def sensor_line(web: Webserver, *, now: float) -> str:
    """How fresh the record is: the sensor's state and
    its last tick (best effort: '' when unknown)."""
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "sensorName": SENSOR,
    }
    try:
        found: Any = web.query(_SENSOR_STATE, {"selector": selector}).get("sensorOrError") or {}
    except WebserverError:
        return ""
    state = found.get("sensorState") if isinstance(found, dict) else None
    if not isinstance(state, dict):
        return ""
    ticks = state.get("ticks") if isinstance(state.get("ticks"), list) else []
    if state.get("status") != "RUNNING":
        return f"{SENSOR} is {state.get('status')}: this status is not being refreshed"
    if ticks and isinstance(ticks[0], dict):
        try:
            return (
                f"{SENSOR} last checked {age(now - float(ticks[0]['timestamp']))} ago "
                f"({ticks[0].get('status')})"
            )
        except (KeyError, TypeError, ValueError):
            return ""
    return ""


def plan_text(web: Webserver, *, action: Literal["promote", "rollback"]) -> tuple[str, bool]:
    """What a promote (the newest verified build) or a default rollback would do now, from the
    newest status record, and whether the answer is
    positive (a promotable build / a rollback target).
    Raises WebserverError or NoStatus (both LockstepError)
    when there is no record to answer from."""
    status, _ = read_status(web)
    text, positive = promote_plan(status) if action == "promote" else rollback_plan(status)
    return f"{text}\n(as of {age(time.time() - status.as_of)} ago, {status.source})", positive


@click.command("status")
@click.option(
    "--url",
    default=DEFAULT_URL,
    show_default=True,
    callback=lambda c, p, v: check_url(v),
    help="The Dagster webserver to read from.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status record as JSON.")
def status(url: str, as_json: bool) -> None:
    """What is deployed where: :tpu's digest and the harbor it bakes, the harbor the consumer's lock
    makes workers install, the holds, the newest verified build
    and its verdict, the default rollback, the lane.
    Exit 0 when every fact agrees, 1 with a warning or an
    unknown fact, 3 when there is no status to read."""
    web = Webserver(url)
    now = time.time()
    try:
        found, recorded = read_status(web)
    except LockstepError as exc:
        click.echo(f"lockstep status: {exc}", err=True)
        sys.exit(OPERATIONAL)
    if as_json:
        click.echo(found.model_dump_json(indent=2))
        # stdout stays JSON
        click.echo(f"as of {age(now - found.as_of)} ago, {found.source}", err=True)
    else:
        click.echo(render(found, now=now))
        fresh = sensor_line(web, now=now)
        click.echo(
            f"recorded {age(now - recorded)} ago by {found.source}"
            + (f"; {fresh}" if fresh else "")
        )
    sys.exit(NEGATIVE if found.warnings or found.errors else OK)
