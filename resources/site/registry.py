"""``[registry]``: where images live (an HTTP registry, or the sandbox's image-layout directory)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resources.site.fields import Table


class RegistrySection(Table):
    """``[registry]``: where images live. `layout` is
    an OCI image-layout directory (the sandbox)."""

    kind: Literal["http", "layout"] = "http"
    layout_dir: str = Field(
        default="registry", description="kind = layout: directory, relative to the site file."
    )
    username: str | None = Field(
        default=None, description="User for token exchange (ghcr: the GitHub user)."
    )
    token_env: str | None = Field(
        default=None, description="NAME of the env var with the registry token."
    )
