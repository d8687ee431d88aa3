"""The site as Dagster sees it: the SiteResource a run reads the site through (pinned to the file
the code location loaded), the stand-in for a resource the site was missing for, and owners on
assets."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from pydantic import Field, PrivateAttr

from resources.errors import LockstepError
from resources.site.load import DEFAULT_SITE, SITE_ENV, load_site
from resources.site.reload import reload_advice
from resources.site.schema import SiteConfig


def location_owners(site: SiteConfig | None, location: str) -> list[str]:
    """Owners for a code location's assets from the site read at load time (none without one)."""
    return site.owners(location) if site else []


def with_owners(
    assets: Sequence[dg.AssetsDefinition], owners: Sequence[str]
) -> list[dg.AssetsDefinition]:
    """`assets` with `owners` on every spec (unchanged when there are none)."""
    if not owners:
        return list(assets)
    return list(
        dg.map_asset_specs(lambda spec: spec.replace_attributes(owners=list(owners)), assets)
    )


class SiteChanged(LockstepError):
    """The site file differs from the one the code location loaded its resources from."""


class SiteResource(dg.ConfigurableResource):
    """The site file, loaded when a run or sensor tick first needs it (never at import time).

    Read once per run (or tick) and kept: every step of a run sees the same site. When the code
    location built its resources (registry, iris, Spark nodes) from the site at load,
    `loaded_digest` is that file's sha256, and a run refuses a file that changed since: the run's
    site and its resources would disagree.
    """

    path: str = Field(
        default="", description="Site TOML; empty means $LOCKSTEP_SITE or .sandbox/site.toml."
    )
    loaded_digest: str = Field(
        default="",
        description="sha256 of the site file when the code location loaded; empty: not checked.",
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
                f"{config.path} changed since this code location loaded it: the registry, iris "
                "and node "
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
    """Stands in for a resource built from the site
    file when there was none as the location loaded."""

    def missing(_: dg.InitResourceContext) -> None:
        raise LockstepError(
            f"resource {resource!r} is built from the site file when the code location loads, "
            "and there was "
            f"none (${SITE_ENV} unset and no {DEFAULT_SITE}): run `lockstep sandbox up` or set "
            f"{SITE_ENV}, "
            "then reload the code location"
        )

    return dg.ResourceDefinition(
        resource_fn=missing, description=f"{resource}: needs a site file at load"
    )
