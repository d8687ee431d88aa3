"""The three facts a re-lock must leave true, as plain functions over file texts and models."""

from __future__ import annotations

from pathlib import Path

from resources.errors import FileFormatError
from resources.site.tpu import TpuSection
from resources.uv import UvLock
from tpu_assets.dockerfile import find_pin, pin_variable
from tpu_assets.models import Finding, HarborLock


def pins_agree(lock_text: str | None, dockerfile_text: str | None, tpu: TpuSection) -> Finding:
    """uv.lock's harbor commit (the runtime gate) equals
    the Dockerfile's ``HARBOR_COMMIT`` (the bake)."""
    if lock_text is None:
        return Finding(passed=False, description="the consumer commit has no uv.lock")
    if dockerfile_text is None:
        return Finding(passed=False, description=f"the consumer commit has no {tpu.dockerfile}")
    try:
        _, src = UvLock.read(Path("uv.lock"), lock_text).git_package(tpu.harbor_package)
        pin = find_pin(dockerfile_text, tpu.dockerfile, pin_variable(tpu.harbor_package))
    except FileFormatError as exc:
        return Finding(passed=False, description=str(exc))
    facts = {"uv.lock": src.commit, f"{tpu.dockerfile}:{pin.line}": pin.commit}
    if src.commit == pin.commit:
        return Finding(
            passed=True,
            description=f"uv.lock and {pin.variable} both pin {src.commit[:8]}",
            facts=facts,
        )
    return Finding(
        passed=False,
        description=(
            f"uv.lock pins {tpu.harbor_package} {src.commit[:8]} but {tpu.dockerfile}:{pin.line} "
            "sets "
            f"{pin.variable}={pin.commit[:8]}: the image would bake a different harbor than the "
            "workers "
            "run. Re-run relock_harbor."
        ),
        facts=facts,
    )


def version_moved(lock: HarborLock) -> Finding:
    """A new harbor commit should come with a new
    version, or cached same-version wheels go stale."""
    b, a = lock.before, lock.after
    facts = {"before": f"{b.version} @ {b.commit[:8]}", "after": f"{a.version} @ {a.commit[:8]}"}
    if not lock.commit_moved:
        return Finding(
            passed=True, description=f"harbor did not move ({a.commit[:8]})", facts=facts
        )
    if b.version != a.version:
        return Finding(passed=True, description=f"harbor {b.version} -> {a.version}", facts=facts)
    return Finding(
        passed=False,
        description=(
            f"harbor moved {b.commit[:8]} -> {a.commit[:8]} but kept version {a.version}: a "
            "same-version "
            "change can ride a stale cached wheel in the image's resolve layer. Bump harbor's "
            "version "
            "on its branch."
        ),
        facts=facts,
    )
