"""What one installed iris binary offers, read from its own help screens, and what lockstep needs.

The CLI moved in 2026 (resources/iris/cli.py's docstring has the history): `job describe` replaced
`job summary`, `job cancel` replaced `kill`/`stop`, options arrived. Each process learns the
installed binary's generation once (`learn`) and the adapter speaks what it finds; a `job run`
needing an option the binary lacks is refused before anything is submitted (`check_run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from resources.iris.output import IrisError, help_commands, help_options
from resources.model import Model


class ClientTooOld(IrisError):
    """The cluster's controller refuses this iris CLI:
    it is more than 14 days older than the controller."""


class MissingCapability(IrisError):
    """The installed iris lacks a command or option lockstep needs; nothing was submitted."""


# When the options lockstep uses first appeared (cli/job.py history), for the "upgrade" message.
SINCE = {
    "--task-image": "2026-06-15 (4e1fa6a5d)",
    "--no-sync": "2026-06-24 (cdcc96653)",
    "describe": "2026-08-20 (43ea65e00)",
    "cancel": "2026-08-20 (43ea65e00)",
    "wait": "2026-07-27 (a91eaf519)",
}


class IrisCapabilities(Model):
    """What one installed iris binary offers, read from its own help screens."""

    job_commands: frozenset[str]
    run_options: frozenset[str]
    summary_json: bool = False
    kill_exact: bool = Field(
        default=False, description="`job kill` matches ids exactly (2026-07-21+), not by prefix."
    )

    @property
    def state_command(self) -> Literal["describe", "summary"] | None:
        if "describe" in self.job_commands:
            return "describe"
        return "summary" if "summary" in self.job_commands else None

    @property
    def cancel_command(self) -> Literal["cancel", "kill", "stop"] | None:
        for name in ("cancel", "kill", "stop"):
            if name in self.job_commands:
                return name  # type: ignore[return-value]
        return None

    @property
    def contract(self) -> str:
        """The iris generation, named by the month its
        CLI shape appeared in Marin's `cli/job.py`."""
        if self.state_command == "describe":
            return "2026-08+ (describe, cancel, wait)"
        if self.summary_json:
            return "2026-04..07 (summary --json, kill)"
        return "2026-07 (summary text, kill)"


def learn(help_text: Callable[..., str]) -> IrisCapabilities:
    """The capabilities a binary's help screens show (`help_text(*args)`: `iris <args> --help`)."""
    commands = help_commands(help_text("job"))
    run = help_options(help_text("job", "run")) if "run" in commands else frozenset()
    json_summary = (
        "summary" in commands
        and "describe" not in commands
        and "--json" in help_options(help_text("job", "summary"))
    )
    kill_exact = "kill" in commands and "--exact" in help_options(help_text("job", "kill"))
    return IrisCapabilities(job_commands=commands, run_options=run, summary_json=json_summary,
                            kill_exact=kill_exact)  # fmt: skip


def check_run(caps: IrisCapabilities, *, binary: str, used: list[str]) -> None:
    """MissingCapability naming what a `job run` with the options `used` needs that `caps` lacks."""
    if "run" not in caps.job_commands:
        has = ", ".join(sorted(caps.job_commands))
        raise MissingCapability(f"`{binary} job` has no `run` command (it has: {has})")
    if caps.state_command is None:
        raise MissingCapability(
            f"`{binary} job` has neither `describe` nor `summary`: lockstep "
            "cannot read a job's state with it; upgrade marin-iris"
        )
    missing = [
        o
        for o in used
        if o not in caps.run_options
        and not o.startswith(("--cluster=", "--config=", "--controller-url="))
    ]
    if missing:
        since = "; ".join(f"{o} arrived in iris on {SINCE[o]}" for o in missing if o in SINCE)
        why = (
            " Without --no-sync the worker would `uv sync` the bundled workspace inside the task "
            "image "
            "instead of running it as it is."
            if "--no-sync" in missing
            else ""
        )
        raise MissingCapability(
            f"the iris CLI at {binary} ({caps.contract}) has no {', '.join(missing)} for `job run`"
            f"{f' ({since})' if since else ''}.{why} Upgrade marin-iris; nothing was submitted"
        )
