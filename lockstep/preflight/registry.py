"""The registry ``[tpu].image`` lives in: lockstep can push there, proven without pushing.

``kind = "http"``: the token (``[registry] token_env``) opens a blob upload to the image's
repository and cancels it (`Registry.can_push`, through the same client, token exchange and timeouts
as every push); an unset variable is named before anything is asked. ``kind = "layout"``: the layout
directory exists or can be created, and is writable.
"""

from __future__ import annotations

import os

from lockstep.preflight.findings import Section, fail, ok, site_where
from resources.registry import HttpRegistry, ImageRef, registry_for
from resources.site.schema import SiteConfig

AREA = "registry"


def check_registry(site: SiteConfig, *, timeout_s: float) -> list[Section]:
    section = site.registry
    ref = ImageRef.parse(site.tpu.image)
    text = site.path.read_text(encoding="utf-8")
    image_where = site_where(site.path, text, ("tpu",), "image")
    if section.kind == "layout":
        root = site.resolve_path(section.layout_dir)
        title = f"registry: image layout {root} (the repository {ref.repository})"
        where = site_where(
            site.path,
            text,
            ("registry",),
            "layout_dir",
            default="[registry] layout_dir, the default",
        )
        fix = (
            "Point [registry] layout_dir at a directory this user can write (a relative path "
            "is relative to the site file)"
        )
    else:
        title = f"registry {ref.registry} (push to {ref.repository})"
        where = f"{ref.registry}/{ref.repository} ({image_where})"
        token = section.token_env
        fix = (
            f"Give the token in ${token} push rights to {ref.repository} (ghcr: a GitHub PAT "
            "with write:packages that "
            "may write this package), or fix [registry] token_env / username or [tpu].image"
            if token
            else "Set [registry] token_env (and username) to the NAME of a variable holding a "
            "token that can push to "
            f"{ref.repository}, or fix [tpu].image"
        )
        if token and not os.environ.get(token):
            token_where = site_where(site.path, text, ("registry",), "token_env")
            return [
                Section(
                    area=AREA,
                    title=title,
                    findings=[
                        fail(
                            AREA,
                            "registry.token",
                            f"[registry] token_env names ${token}, which is not set (or empty) "
                            "here: no push "
                            "(and no read of a private image) can log in",
                            token_where,
                            f"Export {token} with a registry token that can push to "
                            f"{ref.repository} (ghcr: a GitHub PAT with "
                            "write:packages) in the environment lockstep runs in",
                        )
                    ],
                )
            ]
    registry = registry_for(site)
    if isinstance(registry, HttpRegistry):
        # One try per read and a budget within the deadline:
        # preflight wants an answer, not a patient retry.
        registry = registry.model_copy(
            update={"timeout_s": timeout_s, "retry_budget_s": timeout_s, "retry_attempts": 2}
        )
    check = registry.can_push(repository=ref.repository)
    if check.allowed:
        return [
            Section(
                area=AREA,
                title=title,
                findings=[ok(AREA, "registry.push", f"push rights proven: {check.proof}", where)],
            )
        ]
    return [
        Section(
            area=AREA,
            title=title,
            findings=[fail(AREA, "registry.push", check.refusal, where, fix)],
        )
    ]
