"""When does the TPU image need a rebuild? Runbook §7:
rarely — the lock and the /app bundle ship most things."""

from __future__ import annotations

import re

from tpu_assets.dockerfile import pin_variable


def _without_pin(dockerfile: str, variable: str) -> str:
    return re.sub(
        rf"(?m)^\s*ENV\s+{re.escape(variable)}(?:\s*=\s*|\s+)\S*.*$",
        f"ENV {variable}=<pin>",
        dockerfile,
    )


def rebuild_reason(
    *,
    old: dict[str, str | None],
    new: dict[str, str | None],
    dockerfile: str,
    build_script: str,
    package: str,
    rebuild_on_lock_change: bool,
) -> str | None:
    """Why the image must be rebuilt between two consumer commits, or None when it need not be.

    `old`/`new` map path -> text (None: absent). A base-layer change (the Dockerfile outside the
    HARBOR_COMMIT line, or the build script) needs a rebuild. A lock move needs one only when the
    site asks for it (first-serve latency); it is never needed for correctness.
    """
    variable = pin_variable(package)
    if _without_pin(old.get(dockerfile) or "", variable) != _without_pin(
        new.get(dockerfile) or "", variable
    ):
        return f"base layers changed: {dockerfile} outside the {variable} line"
    if old.get(build_script) != new.get(build_script):
        return f"base layers changed: {build_script}"
    if rebuild_on_lock_change and (
        old.get("uv.lock") != new.get("uv.lock") or old.get(dockerfile) != new.get(dockerfile)
    ):
        return "the lock moved and the site sets rebuild_on_lock_change = true"
    return None
