"""Verification of a built image from its INSTALLED files (runbook §4): never from a build-log line.

Plain functions over file texts and manifests; the assets read the files out of the pushed image's
layers and hand them here.
"""

from __future__ import annotations

import json
import re

from pydantic import ValidationError

from resources.model import Model
from resources.registry import Manifest
from resources.site.tpu import Probe
from tpu_assets.models import Finding, HarborPin


class VcsInfo(Model):
    vcs: str
    commit_id: str
    requested_revision: str | None = None


class DirectUrl(Model):
    """PEP 610 ``direct_url.json``: how a distribution was installed."""

    url: str
    vcs_info: VcsInfo | None = None


class InstalledDist(Model):
    """What the image has installed: dist-info METADATA and direct_url.json."""

    dist_info: str
    name: str
    version: str
    direct_url: DirectUrl | None = None

    @property
    def commit(self) -> str | None:
        return (
            self.direct_url.vcs_info.commit_id
            if self.direct_url and self.direct_url.vcs_info
            else None
        )


def parse_installed(
    dist_info: str, metadata_text: str, direct_url_text: str | None
) -> InstalledDist:
    """Parse a dist-info directory's METADATA (RFC 822 headers) and optional direct_url.json."""
    from email.parser import HeaderParser

    headers = HeaderParser().parsestr(metadata_text)
    direct: DirectUrl | None = None
    if direct_url_text is not None:
        try:
            direct = DirectUrl.model_validate(json.loads(direct_url_text))
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"{dist_info}/direct_url.json is not PEP 610 JSON: {exc}") from None
    return InstalledDist(
        dist_info=dist_info,
        name=headers.get("Name", ""),
        version=headers.get("Version", ""),
        direct_url=direct,
    )


def installed_matches_lock(
    installed: InstalledDist | None, pin: HarborPin, package: str
) -> Finding:
    """The installed version and PEP 610 commit_id equal
    the lock's pin; a missing direct_url.json fails."""
    if installed is None:
        return Finding(
            passed=False, description=f"{package} is not installed in the image's site-packages"
        )
    facts = {
        "installed": f"{installed.version} @ {installed.commit or 'no direct_url.json'}",
        "lock": f"{pin.version} @ {pin.commit}",
        "dist_info": installed.dist_info,
    }
    if installed.commit is None:
        return Finding(
            passed=False,
            facts=facts,
            description=(
                f"{installed.dist_info} has no direct_url.json with a vcs commit_id: the installed "
                f"{package} cannot be tied to a commit. Install it from git (--force-reinstall @ "
                "${HARBOR_COMMIT})."
            ),
        )
    problems = []
    if installed.commit != pin.commit:
        problems.append(f"commit {installed.commit[:8]} != lock {pin.commit[:8]}")
    if pin.version and installed.version != pin.version:
        problems.append(f"version {installed.version} != lock {pin.version}")
    if problems:
        return Finding(
            passed=False,
            facts=facts,
            description=(
                f"the image bakes {package} {installed.version} @ {installed.commit[:8]} but "
                "uv.lock pins "
                f"{pin.version} @ {pin.commit[:8]} ({'; '.join(problems)}): a stale bake. "
                "Rebuild after the "
                "re-lock so HARBOR_COMMIT busts the cached layer."
            ),
        )
    return Finding(
        passed=True,
        facts=facts,
        description=f"installed {package} {installed.version} @ {installed.commit[:8]} = lock",
    )


def run_probe(probe: Probe, path: str, text: str | None) -> Finding:
    """Every anchor line must be followed (within N lines)
    by `must_follow` and never by `must_not_follow`."""
    if text is None:
        return Finding(passed=False, description=f"{probe.name}: {path} is not in the image")
    lines = text.splitlines()
    anchor = re.compile(probe.anchor)
    hits = [n for n, line in enumerate(lines) if anchor.search(line)]
    if not hits:
        return Finding(
            passed=False,
            description=(
                f"{probe.name}: no line of {path} matches the anchor {probe.anchor!r}: the "
                "file changed shape or the probe is stale"
            ),
        )
    failures: list[str] = []
    facts: dict[str, str] = {}
    for n in hits:
        window = lines[n + 1 : n + 1 + probe.within]
        facts[f"{path}:{n + 1}"] = "\n".join([lines[n], *window])
        if probe.must_follow and not any(re.search(probe.must_follow, w) for w in window):
            failures.append(f"{path}:{n + 1}: no {probe.must_follow!r} within {probe.within} lines")
        if probe.must_not_follow:
            bad = [n + 2 + i for i, w in enumerate(window) if re.search(probe.must_not_follow, w)]
            failures += [
                f"{path}:{b}: {probe.must_not_follow!r} follows the anchor at line {n + 1}"
                for b in bad
            ]
    if failures:
        return Finding(
            passed=False, description=f"{probe.name}: " + "; ".join(failures), facts=facts
        )
    return Finding(
        passed=True,
        description=f"{probe.name}: holds at {', '.join(f'line {n + 1}' for n in hits)} of {path}",
        facts=facts,
    )


def layers_pullable(manifest: Manifest, *, min_layers: int, max_layer_bytes: int) -> Finding:
    """Several layers, none too big: one giant single-snapshot
    blob EOFs over ghcr egress (runbook §1)."""
    sizes = [layer.size for layer in manifest.layers]
    largest = max(sizes, default=0)
    facts = {
        "layers": str(len(sizes)),
        "largest_layer_bytes": str(largest),
        "total_bytes": str(sum(sizes)),
    }
    problems = []
    if len(sizes) < min_layers:
        problems.append(
            f"{len(sizes)} layer(s), expected at least {min_layers} (SINGLE_SNAPSHOT=1?)"
        )
    if largest > max_layer_bytes:
        big = next(layer for layer in manifest.layers if layer.size == largest)
        problems.append(
            f"layer {big.digest[:19]} is {largest / 1024**3:.1f} GiB, over the "
            f"{max_layer_bytes / 1024**3:.1f} GiB limit"
        )
    if problems:
        return Finding(
            passed=False, description="not pullable: " + "; ".join(problems), facts=facts
        )
    return Finding(
        passed=True,
        description=f"{len(sizes)} layers, largest {largest / 1024**2:.1f} MiB",
        facts=facts,
    )
