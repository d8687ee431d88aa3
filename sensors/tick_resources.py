"""What every sensor tick shares: its default status, its time budget, the resource objects it uses
directly, not through Dagster's per-tick resource init, and its preamble: the site read and, for a
branch watch, the ls-remote, each ending the tick with one skip wording (`TickSkip`).

A sensor that declares a resource parameter has Dagster open the instance from its ref on every tick
(`SensorEvaluationContext.resources` passes `self.instance` to `build_resources`) and rebuild each
resource three times (`ConfigurableResourceFactory._initialize_and_run`), each time inferring its
config schema again: 90-210 ms against a 7 ms `git ls-remote`. So the ls-remote sensors take the
location's own configured objects, the ones `Definitions` wires (and shows in the UI, and sets up
for every run), and declare none.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import dagster as dg

from resources.deadline import Budget, budget
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.secrets import redact
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from resources.site.timeouts import TimeoutsSection

R = TypeVar("R", bound=dg.ConfigurableResource)


def default_sensor_status() -> dg.DefaultSensorStatus:
    """Sensors start RUNNING under `lockstep demo` (the
    sandbox), STOPPED elsewhere until a person turns them on."""
    running = os.environ.get("LOCKSTEP_SENSORS_RUNNING") == "1"
    return dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED


def for_ticks(resource: object, kind: type[R], *, key: str) -> R:
    """`resource` (the location's `key` resource), checked fit to be used as configured.

    An `EnvVar` field is only resolved by Dagster's init: used directly, the tick would read the
    variable's name as its value, so such a resource is refused when the location loads.
    """
    if not isinstance(resource, kind):
        raise TypeError(
            f"resource {key!r} is a {type(resource).__name__}, not the {kind.__name__} a sensor "
            "tick uses"
        )
    unresolved = sorted(name for name, value in resource if isinstance(value, dg.EnvVar))
    if unresolved:
        raise ValueError(
            f"resource {key!r} sets {', '.join(unresolved)} from the environment, which only "
            "Dagster's resource "
            "init resolves: a sensor tick cannot use it as configured"
        )
    return resource


TICK_BUDGET = "the sensor tick's budget ([timeouts] sensor_tick_s)"


def tick_budget(site: SiteResource) -> contextlib.AbstractContextManager[Budget]:
    """Every git and registry call inside ends within the site's [timeouts] sensor_tick_s of now,
    well inside Dagster's 60 s sensor limit: past it a call fails naming its remote, and the tick
    skips saying so instead of being killed with nothing said. A site
    that does not load gets the default budget (the
    tick then skips for that reason anyway)."""
    try:
        seconds = site.config().timeouts.sensor_tick_s
    except LockstepError:
        seconds = TimeoutsSection().sensor_tick_s
    return budget(seconds, TICK_BUDGET)


class TickSkip(Exception):
    """Ends a tick early: `skipping` returns the message as its skip reason, the cursor kept. Not a
    LockstepError, so a sensor's own `except LockstepError` lets it through."""


def skipping(tick: Callable[[], dg.SensorResult]) -> dg.SensorResult:
    """`tick()`, or its `TickSkip` as the skip reason of a result that keeps the cursor."""
    try:
        return tick()
    except TickSkip as skip:
        return dg.SensorResult(skip_reason=str(skip))


def run_tick(site: SiteResource, tick: Callable[[], dg.SensorResult]) -> dg.SensorResult:
    """`tick()` inside the site's tick budget (`tick_budget`), a `TickSkip` its skip reason."""
    with tick_budget(site):
        return skipping(tick)


def site_config(site: SiteResource) -> SiteConfig:
    """The site as the tick reads it now; a file that does not load (or changed since the location
    loaded it) skips the tick: "site file unusable: <file:line and why>"."""
    try:
        return site.config()
    except LockstepError as exc:
        raise TickSkip(f"site file unusable: {exc}") from exc


@dataclass(frozen=True)
class WatchedBranch:
    """A branch a sensor watches with one `git ls-remote` per tick."""

    repo: str
    branch: str

    @property
    def where(self) -> str:
        """How every skip reason names it: "<branch> on <repo>", the repo's credentials masked."""
        return f"{self.branch} on {redact(self.repo)}"

    def unreadable(self, exc: LockstepError, cursor: str | None) -> TickSkip:
        """The skip for a remote that did not answer: unreachable is not gone, so the cursor
        stays."""
        return TickSkip(f"cannot read {self.where}: {exc} (cursor kept at {cursor or 'none'})")


def moved_tip(git: GitRemotes, watched: WatchedBranch, cursor: str | None) -> str:
    """The branch's tip when it is not `cursor`. Otherwise the tick skips, in one wording for every
    branch watch: "cannot read <where>: ..." (the remote failed), "branch <where> does not exist",
    "<where> still at <sha>"."""
    try:
        tip = git.ls_remote(url=watched.repo, branch=watched.branch)
    except LockstepError as exc:
        raise watched.unreadable(exc, cursor) from exc
    if tip is None:
        raise TickSkip(f"branch {watched.where} does not exist")
    if tip == cursor:
        raise TickSkip(f"{watched.where} still at {tip}")
    return tip
