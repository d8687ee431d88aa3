"""``[links]``: web pages for what lockstep records, so the UI's digests and commits are links."""

from __future__ import annotations

from pydantic import Field, field_validator

from resources.site.fields import Table, placeholders


class CommitLink(Table):
    """``[[links.commit]]``: commits of remotes whose URL starts with `remote` link to `url`."""

    remote: str = Field(
        description="A URL prefix, e.g. 'https://github.com/' or 'git@github.com:'."
    )
    url: str = Field(
        description="{path}: the remote URL after the prefix, without '.git'; {sha}: the commit."
    )

    @field_validator("url")
    @classmethod
    def _template(cls, value: str) -> str:
        return placeholders(value, {"path", "sha"})


class LinksSection(Table):
    """``[links]``: web pages for what lockstep records,
    so the UI's digests and commits are links."""

    image: str | None = Field(
        default=None,
        description="{registry}, {repository}, {digest}: e.g. a Harbor or GHCR package page.",
    )
    commit: list[CommitLink] = Field(default_factory=list)

    @field_validator("image")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else placeholders(value, {"registry", "repository", "digest"})
