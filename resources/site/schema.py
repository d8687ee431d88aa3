"""SiteConfig: one TOML file describes a site — every URL, branch, path and policy lockstep uses.

Each table is a model in its own module of this package; this module puts them together and says
which tables configure a code location (`LOCATIONS`). Reading the file is resources/site/load.py.
Secrets are never stored in the file: it names environment variables (keys ending in ``_env``)
and the values are read when needed, never written back or logged.
"""

from __future__ import annotations

import functools
import types
import typing
from pathlib import Path

from pydantic import Field, PrivateAttr, model_validator

from resources.errors import LockstepError
from resources.site.alerts import AlertsSection
from resources.site.attest import AttestSection
from resources.site.fields import LocationSection, Table, site_relative
from resources.site.general import SiteSection
from resources.site.iris import IrisSection
from resources.site.jovian import JovianSection
from resources.site.links import LinksSection
from resources.site.registry import RegistrySection
from resources.site.rules import across_tables, refuse, repository_urls
from resources.site.spark import SparkSection
from resources.site.timeouts import TimeoutsSection
from resources.site.tpu import TpuSection


class SiteConfig(Table):
    """The whole site file. Unknown keys are errors:
    a key in the wrong table must not be ignored."""

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
        refuse(across_tables({name: getattr(self, name) for name in type(self).model_fields}))
        return self

    def repository_urls(self) -> dict[tuple[str, ...], str]:
        """Every repository URL the site names, by (table, key): what git may be asked to reach."""
        return repository_urls({name: getattr(self, name) for name in location_tables(type(self))})

    @property
    def path(self) -> Path:
        """The file this config was read from."""
        return self._path

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes as read: tells a run
        whether the file changed since a location loaded."""
        return self._digest

    def resolve_path(self, value: str) -> Path:
        """A path from the site file: relative ones are relative to the file itself."""
        return site_relative(self._path, value)

    def owners(self, location: str) -> list[str]:
        """The owners of a code location's assets: its own table's, else [site] owners."""
        if location not in (locations := location_tables(type(self))):
            shown = f"its locations: {', '.join(locations)}"
            raise LockstepError(f"no code location {location!r} in the site ({shown})")
        section: LocationSection | None = getattr(self, location)
        own = section.owners if section is not None else None
        return list(own if own is not None else self.site.owners)

    def secret_env_keys(self) -> list[tuple[str, str]]:
        """(the site key, the NAME it holds) for every
        environment variable the site names as holding a
        secret, table by table: `lockstep deploy env` says which key asks for each variable."""
        keys: list[tuple[str, str]] = []
        for table in type(self).model_fields:
            section = getattr(self, table)
            if section is None:  # an optional table the site leaves out names nothing
                continue
            for field, value in section:
                if field.endswith("_env") and value:
                    keys.append((f"[{table}] {field}", value))
        keys += [
            (f"[[alerts.webhook]] url_env ({hook.name})", hook.url_env)
            for hook in self.alerts.webhook
        ]
        return keys

    def secret_env_names(self) -> list[str]:
        """Every environment variable the site names as holding a secret."""
        return [name for _, name in self.secret_env_keys()]


@functools.cache
def location_tables(config: type[Table]) -> tuple[str, ...]:
    """The tables of `config` (SiteConfig) whose model is a LocationSection, in the file's order."""
    found = []
    for name, field in config.model_fields.items():
        kind = field.annotation
        if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if isinstance(kind, type) and issubclass(kind, LocationSection):
            found.append(name)
    return tuple(found)


# The code locations a site configures, one per location table: a new pipeline is a LocationSection
# model and a SiteConfig field for it, and the per-location rules (owners, repository URLs) follow.
LOCATIONS: tuple[str, ...] = location_tables(SiteConfig)
