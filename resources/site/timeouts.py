"""``[timeouts]``: the total deadlines of lockstep's calls to git remotes and the registry, and of a
sensor tick; and how often a long step says it is
still running (`heartbeat_s`, resources/heartbeat.py).

A per-read timeout alone lets a peer that answers one byte a second (or accepts the connection and
never answers) hold a run for as long as it likes: each read succeeds in time. So every outside call
also has a total deadline. Calls that move a lot of data (a layer download, a fetch) earn more time
only while data moves at a useful rate; a stall or a drip still ends at the deadline.

The iris CLI and the Spark nodes keep their deadlines in their own tables ([iris] call_timeout_s,
[spark] connect_timeout_s and command_timeout_s): they were per call there already.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from resources.heartbeat import DEFAULT_EVERY_S, MAX_EVERY_S
from resources.site.fields import Table
from resources.site.rules import KeyRefused

# Dagster kills a sensor evaluation that runs for 60
# s; a tick should end well before, with a skip reason.
DAGSTER_SENSOR_LIMIT_S = 60.0


class TimeoutsSection(Table):
    """``[timeouts]``: total deadlines of outside calls (seconds unless the key says bytes)."""

    git_connect_s: float = Field(
        default=15.0,
        gt=0,
        description="ssh to a git remote: TCP connect plus the ssh handshake (ConnectTimeout).",
    )
    git_refs_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "One `git ls-remote`: a ref listing is small; the whole process is killed after this."
        ),
    )
    git_transfer_s: float = Field(
        default=600.0,
        gt=0,
        description=(
            "One `git fetch` or `git push`: the whole process (and ssh) is killed after this."
        ),
    )
    git_low_speed_bps: int = Field(
        default=1000,
        gt=0,
        description=(
            "http(s) remotes: slower than this for git_low_speed_s aborts (http.lowSpeedLimit)."
        ),
    )
    git_low_speed_s: int = Field(
        default=30, gt=0, description="http.lowSpeedTime: how long a transfer may stay that slow."
    )
    registry_request_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "One registry request, body included; a body earns one more second per "
            "registry_min_bps bytes."
        ),
    )
    registry_min_bps: int = Field(
        default=64 * 1024,
        gt=0,
        description="A body slower than this on average is a drip: it ends at the deadline.",
    )
    sensor_tick_s: float = Field(
        default=20.0,
        gt=0,
        lt=DAGSTER_SENSOR_LIMIT_S,
        description=(
            "Everything one sensor tick asks of remotes; past it the tick skips naming the remote."
        ),
    )
    # At least 1 s (a line a second already floods a run's log);
    # at most 300 s (the "at least one every five").
    heartbeat_s: float = Field(
        default=DEFAULT_EVERY_S,
        ge=1.0,
        le=MAX_EVERY_S,
        description="A long step (an iris build or smoke job, a node build, a distribution, a "
        "lane boot) logs a "
        "heartbeat line at most this often, and at least this often while it runs.",
    )

    @model_validator(mode="after")
    def _tick_fits(self) -> TimeoutsSection:
        # A tick's budget is what its calls get; one slower than the tick cannot end inside it.
        if self.git_connect_s >= self.sensor_tick_s:
            raise KeyRefused(
                ("git_connect_s",),
                (
                    f"git_connect_s ({self.git_connect_s:g}) must be shorter than sensor_tick_s "
                    f"({self.sensor_tick_s:g}): "
                    "a tick could not even connect within its budget"
                ),
            )
        return self
