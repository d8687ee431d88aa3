"""``[spark]``: the DGX Spark node inventory and how to reach it (ssh, or a local directory)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from resources.errors import LockstepError
from resources.site.fields import NodeName, Table
from resources.site.rules import KeyRefused, check_host, check_node_path, check_user, refuse


class SparkNode(Table):
    """One DGX Spark node. `ssh` nodes are reached with paramiko; `local` nodes run commands on this
    machine in their own directory (`root`, relative to
    the site file), with `root/bin` first on PATH."""

    name: NodeName
    transport: Literal["ssh", "local"] = "ssh"
    host: str = ""
    port: int = Field(default=22, gt=0, lt=65536)
    user: str = Field(
        default="", description="Login name; empty: the user lockstep runs as (as ssh does)."
    )
    root: str = ""
    roles: list[Literal["build", "lane"]] = Field(default_factory=list)
    # A relay chain ([jovian] distribute = "relay"): this node forwards the stream to the next lane
    # node with its OWN OpenSSH client, trusting only these two files, which live ON THIS NODE.
    relay_key: str | None = Field(
        default=None, description="Private key on this node for its relay hop."
    )
    relay_known_hosts: str | None = Field(
        default=None, description="known_hosts on this node for its relay hop."
    )
    relay_host: str | None = Field(
        default=None, description="How the previous node reaches this one; unset: host."
    )

    @field_validator("host", "relay_host")
    @classmethod
    def _host(cls, value: str | None, info: Any) -> str | None:
        return check_host(info.field_name, value) if value else value

    @field_validator("relay_key", "relay_known_hosts")
    @classmethod
    def _node_path(cls, value: str | None, info: Any) -> str | None:
        return None if value is None else check_node_path(info.field_name, value)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return check_user("user", value) if value else value

    @model_validator(mode="after")
    def _reachable(self) -> SparkNode:
        if self.transport == "ssh" and not self.host:
            raise KeyRefused(
                ("host",),
                f'node {self.name!r} is an ssh node without a host: add host = "<name or IP>"',
            )
        if self.transport == "local" and not self.root:
            raise KeyRefused(
                ("root",),
                f'node {self.name!r} is a local node without a root directory: add root = "..."',
            )
        return self


class SparkSection(Table):
    """``[spark]``: the node inventory and how to reach
    it. Host keys are verified, never auto-added."""

    nodes: list[SparkNode]
    known_hosts: str = Field(
        default="~/.ssh/known_hosts", description="Host keys to verify against."
    )
    key_path: str | None = Field(
        default=None, description="Private key file (a path, not a secret)."
    )
    passphrase_env: str | None = Field(
        default=None, description="NAME of the env var with the key's passphrase."
    )
    connect_timeout_s: float = Field(default=15.0, gt=0)
    command_timeout_s: float = Field(default=600.0, gt=0)
    keepalive_s: int = Field(default=30, ge=0)

    @model_validator(mode="after")
    def _unique(self) -> SparkSection:
        seen: set[str] = set()
        problems: list[KeyRefused] = []
        for i, node in enumerate(self.nodes):
            if node.name in seen:
                problems.append(
                    KeyRefused(
                        ("nodes", i, "name"),
                        f"node name {node.name!r} appears more than once: names must be unique",
                    )
                )
            seen.add(node.name)
        refuse(problems)
        return self

    def node(self, name: str) -> SparkNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LockstepError(
            f"no [[spark.nodes]] named {name!r} (have: {', '.join(n.name for n in self.nodes)})"
        )
