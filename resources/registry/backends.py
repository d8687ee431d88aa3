"""Choosing a registry backend from the site file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from resources.registry.base import Registry
from resources.registry.refs import ImageRef

if TYPE_CHECKING:
    from resources.site.schema import SiteConfig


def registry_for(site: SiteConfig, *, env_vars: bool = False) -> Registry:
    """The registry a site file names: ``[registry] kind = "layout"`` is a directory (relative to
    the site file), ``kind = "http"`` is the host of
    ``[tpu].image`` with the site's user and token env var.

    `env_vars`: the token as ``dg.EnvVar`` (for Definitions, so the UI shows the variable's name and
    Dagster resolves it per run); otherwise it is read from the environment when first needed.
    """
    # Only the backend the site names is imported (a location without a site file imports neither).
    section = site.registry
    if section.kind == "layout":
        from resources.registry.layout import LayoutRegistry

        return LayoutRegistry(root=str(site.resolve_path(section.layout_dir)))
    from resources.registry.http import HttpRegistry

    token = dg.EnvVar(section.token_env) if env_vars and section.token_env else None
    return HttpRegistry(
        host=ImageRef.parse(site.tpu.image).registry,
        username=section.username,
        token_env=section.token_env,
        token=token,
        request_deadline_s=site.timeouts.registry_request_s,
        min_body_bps=site.timeouts.registry_min_bps,
    )
