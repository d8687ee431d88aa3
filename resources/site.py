"""SiteConfig: one TOML file describes a site — every URL, branch, path and policy lockstep uses.

The path comes from ``LOCKSTEP_SITE``; unset, the embedded sandbox's ``.sandbox/site.toml``.
Secrets are never stored in the file: it names environment variables (keys ending in ``_env``)
and the values are read when needed, never written back or logged.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import dagster as dg
from pydantic import (
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from resources.errors import FileFormatError, LockstepError, decode_utf8
from resources.reader import read_bytes
from resources.names import (
    DEFAULT_SCHEMES,
    IRIS_NAME,
    KNOWN_SCHEMES,
    check_url,
)
from resources.site_alerts import AlertsSection
from resources.site_attest import AttestSection, trusted_keys
from resources.site_cache import SiteCache, stamp_of
from resources.site_errors import first_problem
from resources.site_fields import (
    Branch,
    NodeName,
    Owners,
    PackageName,
    RepoPath,
    RepoUrl,
    Table,
    checked,
    placeholders,
    site_relative,
)
from resources.site_jovian import JovianSection
from resources.site_promotion import PromotionSection
from resources.site_reload import reload_advice
from resources.site_rules import (
    KeyRefused,
    across_tables,
    check_host,
    check_image_repository,
    check_oci_tag,
    check_size,
    check_user,
    refuse,
    repository_urls,
)
from resources.site_timeouts import TimeoutsSection
from resources.tomlfile import load_toml

DEFAULT_SITE = Path(".sandbox") / "site.toml"
SITE_ENV = "LOCKSTEP_SITE"


class SiteSection(Table):
    """``[site]``: who this site is and who owns what lockstep makes."""

    name: str = "site"
    commit_author: str = Field(
        default="lockstep <lockstep@localhost>",
        description="Author of the commits lockstep pushes (re-locks, profiles).",
    )
    owners: Owners = Field(
        default_factory=list, description="Owners of every asset: emails or 'team:<name>' (as Dagster requires)."
    )
    url_schemes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SCHEMES),
        description="Transports every repository URL may use (git@host:path is ssh); the sandbox adds 'file'.",
    )

    @field_validator("url_schemes")
    @classmethod
    def _schemes(cls, value: list[str]) -> list[str]:
        # ext:: and fd:: are not transports a site can opt into: they run commands or read descriptors.
        if unknown := [s for s in value if s not in KNOWN_SCHEMES]:
            raise ValueError(
                f"{', '.join(repr(s) for s in unknown)} is not a scheme lockstep lets git use "
                f"(known: {', '.join(sorted(KNOWN_SCHEMES))})"
            )
        if not value:
            raise ValueError("allows no scheme: no repository URL could load (the default is https, ssh)")
        return value

    @field_validator("commit_author")
    @classmethod
    def _name_email(cls, value: str) -> str:
        if not re.match(r"^[^<>]+ <[^<>@\s]+@[^<>\s]*>$", value):
            raise ValueError("must look like 'Name <email@host>'")
        return value


class Probe(Table):
    """A file probe: in the INSTALLED file, what must (and must not) follow an anchor line."""

    name: str
    path: str = Field(description="Path in the image; relative paths are under [tpu].site_packages. Globs allowed.")
    anchor: str = Field(description="Regex for the anchor line, e.g. the guard `if existing_config != self.config:`")
    within: int = Field(default=4, ge=1, description="How many lines after the anchor are looked at.")
    must_follow: str | None = Field(default=None, description="Regex that must match one of those lines.")
    must_not_follow: str | None = Field(default=None, description="Regex that must match none of those lines.")

    @field_validator("anchor", "must_follow", "must_not_follow")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regex: {exc}") from None
        return value


HARBOR_GUARD_PROBE = Probe(
    name="harbor_config_drift_guard",
    path="harbor/job.py",
    anchor=r"^\s*if existing_config != self\.config:\s*$",
    within=4,
    must_follow=r"logger\.warning\(",
    must_not_follow=r"^\s*raise\b",
)


class RegistrySection(Table):
    """``[registry]``: where images live. `layout` is an OCI image-layout directory (the sandbox)."""

    kind: Literal["http", "layout"] = "http"
    layout_dir: str = Field(default="registry", description="kind = layout: directory, relative to the site file.")
    username: str | None = Field(default=None, description="User for token exchange (ghcr: the GitHub user).")
    token_env: str | None = Field(default=None, description="NAME of the env var with the registry token.")


class IrisSection(Table):
    """``[iris]``: the cluster CLI that runs kaniko builds and smoke jobs."""

    binary: str = Field(default="iris", description="Path to the iris CLI (relative: to the site file).")
    cluster: str | None = Field(default=None, description="--cluster=<name>, e.g. cw-us-east-02a.")
    config: str | None = Field(default=None, description="--config=<cluster YAML> instead of a cluster name.")
    controller_url: str | None = Field(default=None, description="--controller-url=<url> (a local controller).")
    user: str = Field(description="--user: jobs are /<user>/<name>, so the id is known before the submit.")
    docker_user: str = Field(description="DOCKER_USER_ID for the kaniko push (ghcr: the GitHub user).")
    docker_token_env: str | None = Field(
        default=None, description="NAME of the env var with the push token (ghcr: a GitHub PAT, never Docker Hub's)."
    )
    cpu: int = Field(default=16, gt=0)
    memory: str = "64GB"
    disk: str = "120GB"
    build_timeout_s: int = Field(default=10800, gt=0)
    smoke_timeout_s: int = Field(default=3600, gt=0)
    poll_min_s: float = Field(default=10.0, gt=0)
    poll_max_s: float = Field(default=60.0, gt=0)
    call_timeout_s: float = Field(default=180.0, gt=0, description="One CLI call; opening the cluster tunnel is slow.")
    sandbox_contract: Literal["2026-08", "2026-07", "2026-06"] = Field(
        default="2026-08",
        description="Sandbox only: which iris CLI generation the sandbox's iris speaks (describe/cancel; "
        "summary text/kill; summary --json/kill). A real site's iris is whatever is installed.",
    )

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not IRIS_NAME.match(value):
            raise ValueError("must be an iris user name (letters, digits, '.', '_', '@', '-'), e.g. benjaminfeuer")
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
            problems.append(KeyRefused(
                where, f"set exactly one of cluster, config, controller_url (got {', '.join(given) or 'none'})"))
        if self.poll_min_s > self.poll_max_s:
            problems.append(KeyRefused(
                ("poll_min_s",), f"poll_min_s ({self.poll_min_s:g}) must not exceed poll_max_s ({self.poll_max_s:g})"
            ))
        refuse(problems)
        return self


class TpuSection(Table):
    """``[tpu]``: the harbor fork, the consumer repo that locks it, and the image it builds."""

    harbor_repo: RepoUrl
    harbor_branch: Branch
    harbor_package: PackageName = "harbor"
    consumer_repo: RepoUrl
    consumer_branch: Branch
    dockerfile: RepoPath = "docker/Dockerfile.tpu"
    build_script: RepoPath = "docker/build_tpu_kaniko.sh"
    image: Annotated[str, checked(check_image_repository, "image")] = Field(
        description="Image repository, e.g. ghcr.io/open-thoughts/openthoughts-agent")
    floating_tag: Annotated[str, checked(check_oci_tag, "floating tag")] = Field(
        default="tpu", description="The tag other users pull; moved only by promote/rollback.")
    site_packages: str = "/opt/openthoughts/.venv/lib/python3.12/site-packages"
    smoke_command: list[str] = Field(
        default_factory=lambda: [
            "bash", "-lc",
            "/opt/openthoughts/.venv/bin/python -c 'import harbor.job, importlib.metadata as m; "
            "print(\"harbor\", m.version(\"harbor\"))'",
        ],
        description="Run on the pinned tag as an iris job; exit 0 = smoke passed.",
    )
    probes: list[Probe] = Field(default_factory=lambda: [HARBOR_GUARD_PROBE])
    min_layers: int = Field(default=2, ge=1, description="One giant layer is not pullable over ghcr egress.")
    max_layer_bytes: int = Field(default=8 * 1024**3, gt=0)
    rebuild_on_lock_change: StrictBool = Field(
        default=False, description="Rebuild when only the lock moved (first-serve latency; not needed for correctness)."
    )
    auto_promote: StrictBool = Field(default=False, description="Promote each newly verified build (never while on hold).")
    promotion: PromotionSection = Field(
        default_factory=PromotionSection, description="Soak time and freeze windows every promotion must pass.")
    owners: Owners | None = Field(default=None, description="Owners of the tpu assets; unset: [site] owners.")


class SparkNode(Table):
    """One DGX Spark node. `ssh` nodes are reached with paramiko; `local` nodes run commands on this
    machine in their own directory (`root`, relative to the site file), with `root/bin` first on PATH."""

    name: NodeName
    transport: Literal["ssh", "local"] = "ssh"
    host: str = ""
    port: int = Field(default=22, gt=0, lt=65536)
    user: str = Field(default="", description="Login name; empty: the user lockstep runs as (as ssh does).")
    root: str = ""
    roles: list[Literal["build", "lane"]] = Field(default_factory=list)
    # A relay chain ([jovian] distribute = "relay"): this node forwards the stream to the next lane node
    # with its OWN OpenSSH client, trusting only these two files, which live ON THIS NODE.
    relay_key: str | None = Field(default=None, description="Private key on this node for its relay hop.")
    relay_known_hosts: str | None = Field(default=None, description="known_hosts on this node for its relay hop.")
    relay_host: str | None = Field(default=None, description="How the previous node reaches this one; unset: host.")

    @field_validator("host", "relay_host")
    @classmethod
    def _host(cls, value: str | None, info: Any) -> str | None:
        return check_host(info.field_name, value) if value else value

    @field_validator("relay_key", "relay_known_hosts")
    @classmethod
    def _node_path(cls, value: str | None, info: Any) -> str | None:
        from resources.site_rules import check_node_path

        return None if value is None else check_node_path(info.field_name, value)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return check_user("user", value) if value else value

    @model_validator(mode="after")
    def _reachable(self) -> SparkNode:
        if self.transport == "ssh" and not self.host:
            raise KeyRefused(("host",), f"node {self.name!r} is an ssh node without a host: add host = \"<name or IP>\"")
        if self.transport == "local" and not self.root:
            raise KeyRefused(("root",), f"node {self.name!r} is a local node without a root directory: add root = \"...\"")
        return self


class SparkSection(Table):
    """``[spark]``: the node inventory and how to reach it. Host keys are verified, never auto-added."""

    nodes: list[SparkNode]
    known_hosts: str = Field(default="~/.ssh/known_hosts", description="Host keys to verify against.")
    key_path: str | None = Field(default=None, description="Private key file (a path, not a secret).")
    passphrase_env: str | None = Field(default=None, description="NAME of the env var with the key's passphrase.")
    connect_timeout_s: float = Field(default=15.0, gt=0)
    command_timeout_s: float = Field(default=600.0, gt=0)
    keepalive_s: int = Field(default=30, ge=0)

    @model_validator(mode="after")
    def _unique(self) -> SparkSection:
        seen: set[str] = set()
        problems: list[KeyRefused] = []
        for i, node in enumerate(self.nodes):
            if node.name in seen:
                problems.append(KeyRefused(
                    ("nodes", i, "name"), f"node name {node.name!r} appears more than once: names must be unique"))
            seen.add(node.name)
        refuse(problems)
        return self

    def node(self, name: str) -> SparkNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LockstepError(f"no [[spark.nodes]] named {name!r} (have: {', '.join(n.name for n in self.nodes)})")


class CommitLink(Table):
    """``[[links.commit]]``: commits of remotes whose URL starts with `remote` link to `url`."""

    remote: str = Field(description="A URL prefix, e.g. 'https://github.com/' or 'git@github.com:'.")
    url: str = Field(description="{path}: the remote URL after the prefix, without '.git'; {sha}: the commit.")

    @field_validator("url")
    @classmethod
    def _template(cls, value: str) -> str:
        return placeholders(value, {"path", "sha"})


class LinksSection(Table):
    """``[links]``: web pages for what lockstep records, so the UI's digests and commits are links."""

    image: str | None = Field(
        default=None, description="{registry}, {repository}, {digest}: e.g. a Harbor or GHCR package page."
    )
    commit: list[CommitLink] = Field(default_factory=list)

    @field_validator("image")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else placeholders(value, {"registry", "repository", "digest"})


class SiteConfig(Table):
    """The whole site file. Unknown keys are errors: a key in the wrong table must not be ignored."""

    site: SiteSection = Field(default_factory=SiteSection)
    tpu: TpuSection
    registry: RegistrySection = Field(default_factory=RegistrySection)
    iris: IrisSection | None = None
    jovian: JovianSection | None = None
    spark: SparkSection | None = None
    links: LinksSection = Field(default_factory=LinksSection)
    attest: AttestSection | None = None
    alerts: AlertsSection = Field(default_factory=AlertsSection)
    timeouts: TimeoutsSection = Field(default_factory=TimeoutsSection)
    _path: Path = PrivateAttr(default=Path("site.toml"))
    _digest: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _across_tables(self) -> SiteConfig:
        refuse(across_tables({name: getattr(self, name) for name in ("site", "tpu", "jovian", "spark")}))
        return self

    def repository_urls(self) -> dict[tuple[str, ...], str]:
        """Every repository URL the site names, by (table, key): what git may be asked to reach."""
        return repository_urls({"tpu": self.tpu, "jovian": self.jovian})

    @property
    def path(self) -> Path:
        """The file this config was read from."""
        return self._path

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes as read: tells a run whether the file changed since a location loaded."""
        return self._digest

    def resolve_path(self, value: str) -> Path:
        """A path from the site file: relative ones are relative to the file itself."""
        return site_relative(self._path, value)

    def owners(self, location: Literal["tpu", "jovian"]) -> list[str]:
        """The owners of a code location's assets: its own table's, else [site] owners."""
        section = self.tpu if location == "tpu" else self.jovian
        own = section.owners if section is not None else None
        return list(own if own is not None else self.site.owners)

    def secret_env_keys(self) -> list[tuple[str, str]]:
        """(the site key, the NAME it holds) for every environment variable the site names as holding a
        secret, table by table: `lockstep deploy env` says which key asks for each variable."""
        keys: list[tuple[str, str]] = []
        for table in ("site", "tpu", "registry", "iris", "jovian", "spark", "attest"):
            section = getattr(self, table)
            if section is None:  # an optional table the site leaves out names nothing
                continue
            for field, value in section:
                if field.endswith("_env") and value:
                    keys.append((f"[{table}] {field}", value))
        keys += [(f"[[alerts.webhook]] url_env ({hook.name})", hook.url_env) for hook in self.alerts.webhook]
        return keys

    def secret_env_names(self) -> list[str]:
        """Every environment variable the site names as holding a secret."""
        return [name for _, name in self.secret_env_keys()]


def _explain(exc: ValidationError, path: Path, text: str) -> FileFormatError:
    """The one error a load raises (`lockstep site check` lists them all: resources/site_check.py)."""
    return first_problem(exc.errors(), path, text).error()


_SITE_CACHE = SiteCache()


def load_site(path: Path | str | None = None) -> SiteConfig:
    """Read and validate a site file. Errors name the file, the line, the key and what is wrong.

    A file unchanged since it was last read here is not parsed again (resources/site_cache.py): every sensor
    tick loads the site, and parsing and validating it cost more than the ls-remote the tick is for.
    """
    site_path = Path(path or os.environ.get(SITE_ENV) or DEFAULT_SITE)
    stamp = stamp_of(site_path)
    if stamp is None:
        hint = (
            "check the path" if path
            else f"check {SITE_ENV}" if os.environ.get(SITE_ENV)
            else "run `lockstep sandbox up` to create the embedded sandbox"
        )
        raise LockstepError(f"{site_path}: no site file here ({hint})")
    if (config := _SITE_CACHE.get(site_path, stamp)) is not None:
        return config
    started = time.time_ns()
    config = _read_site(site_path)
    _SITE_CACHE.put(site_path, stamp, config, started)
    return config


def site_names_only(path: Path) -> SiteConfig:
    """A site file checked as a load checks it, without reading the files it names (trusted keys).

    For what only needs the names in it (`lockstep deploy env`): the deployment's env is made before
    the key files exist where the site file will live, e.g. from deploy/site.example.toml in the repo.
    """
    return _read_site(path, read_keys=False)


def _read_site(site_path: Path, *, read_keys: bool = True) -> SiteConfig:
    raw = read_bytes(site_path)  # a directory or FIFO named by $LOCKSTEP_SITE is refused, never read
    text = decode_utf8(raw, site_path)
    data = load_toml(site_path, text)
    try:
        config = SiteConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, site_path, text) from None
    # Absolute, not resolved: the path stays the one the deployment named. A Kubernetes ConfigMap mounted
    # as a directory is symlinks into a timestamped directory that the next update deletes; a code server
    # holding the resolved path would find no file there instead of seeing that the site changed.
    config._path = Path(os.path.abspath(site_path))
    config._digest = hashlib.sha256(raw).hexdigest()
    if read_keys and config.attest is not None:  # a key file that is missing or wrong fails the load, not a promotion
        trusted_keys(config)
    return config


def site_at_load() -> SiteConfig | None:
    """The site file as a code location loads: owners and node pools are part of the definitions.

    No site file yet (a fresh checkout before `lockstep sandbox up`): None, and the runs say what is
    missing when they need the site. A site file that is there but wrong fails the load, naming file
    and line, so a typo cannot quietly drop owners or pools from the definitions.
    """
    explicit = os.environ.get(SITE_ENV)
    if not explicit and not DEFAULT_SITE.exists():
        return None
    return load_site(explicit or None)


def location_owners(site: SiteConfig | None, location: Literal["tpu", "jovian"]) -> list[str]:
    """Owners for a code location's assets from the site read at load time (none without one)."""
    return site.owners(location) if site else []


def with_owners(assets: Sequence[dg.AssetsDefinition], owners: Sequence[str]) -> list[dg.AssetsDefinition]:
    """`assets` with `owners` on every spec (unchanged when there are none)."""
    if not owners:
        return list(assets)
    return list(dg.map_asset_specs(lambda spec: spec.replace_attributes(owners=list(owners)), assets))


class SiteChanged(LockstepError):
    """The site file differs from the one the code location loaded its resources from."""


class SiteResource(dg.ConfigurableResource):
    """The site file, loaded when a run or sensor tick first needs it (never at import time).

    Read once per run (or tick) and kept: every step of a run sees the same site. When the code
    location built its resources (registry, iris, Spark nodes) from the site at load,
    `loaded_digest` is that file's sha256, and a run refuses a file that changed since: the run's
    site and its resources would disagree.
    """

    path: str = Field(default="", description="Site TOML; empty means $LOCKSTEP_SITE or .sandbox/site.toml.")
    loaded_digest: str = Field(
        default="", description="sha256 of the site file when the code location loaded; empty: not checked."
    )

    _cached: SiteConfig | None = PrivateAttr(default=None)
    _cache: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Only an instance initialized for one run or tick keeps what it read.
        self._cache = True

    def config(self) -> SiteConfig:
        """The validated site file (a small local read; no network), read once per run."""
        if self._cached is not None:
            return self._cached
        config = load_site(self.path or None)
        if self.loaded_digest and config.digest != self.loaded_digest:
            raise SiteChanged(
                f"{config.path} changed since this code location loaded it: the registry, iris and node "
                f"resources were built from the old file. {reload_advice()}"
            )
        if self._cache:
            self._cached = config
        return config


def site_resource(site: SiteConfig | None) -> SiteResource:
    """The site resource of a code location: pinned to the file it loaded, when there was one."""
    if site is None:
        return SiteResource()
    return SiteResource(path=str(site.path), loaded_digest=site.digest)


def needs_site(resource: str) -> dg.ResourceDefinition:
    """Stands in for a resource built from the site file when there was none as the location loaded."""

    def missing(_: dg.InitResourceContext) -> None:
        raise LockstepError(
            f"resource {resource!r} is built from the site file when the code location loads, and there was "
            f"none (${SITE_ENV} unset and no {DEFAULT_SITE}): run `lockstep sandbox up` or set {SITE_ENV}, "
            "then reload the code location"
        )

    return dg.ResourceDefinition(resource_fn=missing, description=f"{resource}: needs a site file at load")
