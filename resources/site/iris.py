"""``[iris]``: the cluster CLI that runs kaniko builds and smoke jobs, and how lockstep calls it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from resources.names import IRIS_NAME, check_url
from resources.site.fields import Table
from resources.site.rules import KeyRefused, check_size, refuse


class IrisSection(Table):
    """``[iris]``: the cluster CLI that runs kaniko builds and smoke jobs."""

    binary: str = Field(
        default="iris", description="Path to the iris CLI (relative: to the site file)."
    )
    cluster: str | None = Field(default=None, description="--cluster=<name>, e.g. cw-us-east-02a.")
    config: str | None = Field(
        default=None, description="--config=<cluster YAML> instead of a cluster name."
    )
    controller_url: str | None = Field(
        default=None, description="--controller-url=<url> (a local controller)."
    )
    user: str = Field(
        description="--user: jobs are /<user>/<name>, so the id is known before the submit."
    )
    docker_user: str = Field(
        description="DOCKER_USER_ID for the kaniko push (ghcr: the GitHub user)."
    )
    docker_token_env: str | None = Field(
        default=None,
        description=(
            "NAME of the env var with the push token (ghcr: a GitHub PAT, never Docker Hub's)."
        ),
    )
    cpu: int = Field(default=16, gt=0)
    memory: str = "64GB"
    disk: str = "120GB"
    build_timeout_s: int = Field(default=10800, gt=0)
    smoke_timeout_s: int = Field(default=3600, gt=0)
    poll_min_s: float = Field(default=10.0, gt=0)
    poll_max_s: float = Field(default=60.0, gt=0)
    call_timeout_s: float = Field(
        default=180.0, gt=0, description="One CLI call; opening the cluster tunnel is slow."
    )
    sandbox_contract: Literal["2026-08", "2026-07", "2026-06"] = Field(
        default="2026-08",
        description="Sandbox only: which iris CLI generation the sandbox's iris speaks "
        "(describe/cancel; "
        "summary text/kill; summary --json/kill). A real site's iris is whatever is installed.",
    )

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not IRIS_NAME.match(value):
            raise ValueError(
                "must be an iris user name (letters, digits, '.', '_', '@', '-'), e.g. "
                "benjaminfeuer"
            )
        return value

    @field_validator("memory", "disk")
    @classmethod
    def _size(cls, value: str, info: Any) -> str:
        return check_size(info.field_name, value)

    @field_validator("controller_url")
    @classmethod
    def _controller(cls, value: str | None) -> str | None:
        return None if value is None else check_url("controller URL", value, {"http", "https"})

    @model_validator(mode="after")
    def _one_target(self) -> IrisSection:
        problems: list[KeyRefused] = []
        given = [k for k in ("cluster", "config", "controller_url") if getattr(self, k) is not None]
        if len(given) != 1:
            where: tuple[str, ...] = (given[1],) if given else ()
            problems.append(
                KeyRefused(
                    where,
                    (
                        "set exactly one of cluster, config, controller_url (got "
                        f"{', '.join(given) or 'none'})"
                    ),
                )
            )
        if self.poll_min_s > self.poll_max_s:
            problems.append(
                KeyRefused(
                    ("poll_min_s",),
                    (
                        f"poll_min_s ({self.poll_min_s:g}) must not exceed poll_max_s "
                        f"({self.poll_max_s:g})"
                    ),
                )
            )
        refuse(problems)
        return self
