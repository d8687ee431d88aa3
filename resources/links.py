"""Web links for the commits and image digests lockstep records, from the site's ``[links]`` table.

A commit or digest is always recorded as text (what a person copies into a terminal); when the site
names a web page for it, a ``<key>_url`` entry next to it makes the UI show a link.
"""

from __future__ import annotations

import dagster as dg

from resources.secrets import without_credentials
from resources.site.links import LinksSection


def commit_url(links: LinksSection, remote: str, sha: str) -> str | None:
    """The page of `sha` in `remote`, from the first ``[[links.commit]]`` whose prefix matches."""
    # credentials in a remote must not decide, or leak into, a link
    url = without_credentials(remote)
    for rule in links.commit:
        if url.startswith(rule.remote):
            path = url[len(rule.remote) :].strip("/").removesuffix(".git")
            return rule.url.format(path=path, sha=sha)
    return None


def image_url(links: LinksSection, image: str, digest: str) -> str | None:
    """The page of `image@digest` (`image` like
    ``ghcr.io/org/name``), when ``[links] image`` is set."""
    if links.image is None:
        return None
    registry, _, repository = image.partition("/")
    return links.image.format(registry=registry, repository=repository, digest=digest)


def commit_entries(
    links: LinksSection, key: str, remote: str, sha: str, *, text: str | None = None
) -> dict[str, dg.MetadataValue]:
    """``{key: sha}`` (or `text`, e.g. ``old -> new``) plus ``{key}_url`` to `sha`'s page when the
    site links commits of `remote`."""
    entries: dict[str, dg.MetadataValue] = {
        key: dg.MetadataValue.text(sha if text is None else text)
    }
    if sha and (url := commit_url(links, remote, sha)):
        entries[f"{key}_url"] = dg.MetadataValue.url(url)
    return entries


def digest_entries(
    links: LinksSection, key: str, image: str, digest: str
) -> dict[str, dg.MetadataValue]:
    """``{key: digest}`` plus ``{key}_url`` when the site links image digests."""
    entries: dict[str, dg.MetadataValue] = {key: dg.MetadataValue.text(digest)}
    if digest and (url := image_url(links, image, digest)):
        entries[f"{key}_url"] = dg.MetadataValue.url(url)
    return entries
