"""``[site]``: who this site is, who owns what lockstep makes, and which URL schemes git may use."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from resources.names import DEFAULT_SCHEMES, KNOWN_SCHEMES
from resources.site.fields import Owners, Table


class SiteSection(Table):
    """``[site]``: who this site is and who owns what lockstep makes."""

    name: str = "site"
    commit_author: str = Field(
        default="lockstep <lockstep@localhost>",
        description="Author of the commits lockstep pushes (re-locks, profiles).",
    )
    owners: Owners = Field(
        default_factory=list,
        description="Owners of every asset: emails or 'team:<name>' (as Dagster requires).",
    )
    url_schemes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SCHEMES),
        description=(
            "Transports every repository URL may use (git@host:path is ssh); the sandbox adds "
            "'file'."
        ),
    )

    @field_validator("url_schemes")
    @classmethod
    def _schemes(cls, value: list[str]) -> list[str]:
        # ext:: and fd:: are not transports a site can
        # opt into: they run commands or read descriptors.
        if unknown := [s for s in value if s not in KNOWN_SCHEMES]:
            raise ValueError(
                f"{', '.join(repr(s) for s in unknown)} is not a scheme lockstep lets git use "
                f"(known: {', '.join(sorted(KNOWN_SCHEMES))})"
            )
        if not value:
            raise ValueError(
                "allows no scheme: no repository URL could load (the default is https, ssh)"
            )
        return value

    @field_validator("commit_author")
    @classmethod
    def _name_email(cls, value: str) -> str:
        if not re.match(r"^[^<>]+ <[^<>@\s]+@[^<>\s]*>$", value):
            raise ValueError("must look like 'Name <email@host>'")
        return value
