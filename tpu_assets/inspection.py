"""Reading the INSTALLED files out of a pushed image and judging them (runbook §4)."""

from __future__ import annotations

from resources.registry import FileRead, Registry
from resources.site import TpuSection
from tpu_assets.models import BuiltImage, Finding
from tpu_assets.verify import (
    InstalledDist,
    installed_matches_lock,
    layers_pullable,
    parse_installed,
    run_probe,
)

CHECK_INSTALLED = "installed_harbor_matches_lock"
CHECK_PROBES = "file_probes"
CHECK_LAYERS = "layers_pullable"


def _under(site_packages: str, path: str) -> str:
    return path.lstrip("/") if path.startswith("/") else f"{site_packages.strip('/')}/{path}"


def _text(read: FileRead | None) -> str | None:
    return read.data.decode("utf-8", errors="replace") if read else None


def read_installed(registry: Registry, *, repository: str, reference: str, site_packages: str, package: str) -> InstalledDist | None:
    """The installed distribution's METADATA and direct_url.json, found by globbing its dist-info."""
    pattern = f"{site_packages.strip('/')}/{package.replace('-', '_')}-*.dist-info/METADATA"
    hits = registry.glob(repository=repository, reference=reference, pattern=pattern)
    if not hits:
        return None
    metadata_path = sorted(hits)[-1]
    dist_info = metadata_path.rsplit("/", 1)[0]
    metadata = _text(registry.read_file(repository=repository, reference=reference, path=metadata_path))
    direct = _text(registry.read_file(repository=repository, reference=reference, path=f"{dist_info}/direct_url.json"))
    return parse_installed(dist_info.rsplit("/", 1)[-1], metadata or "", direct)


def run_probes(registry: Registry, *, repository: str, reference: str, tpu: TpuSection) -> Finding:
    """Every configured probe, each against every installed file its path (glob) names."""
    results: list[Finding] = []
    for probe in tpu.probes:
        pattern = _under(tpu.site_packages, probe.path)
        paths = (registry.glob(repository=repository, reference=reference, pattern=pattern)
                 if any(c in pattern for c in "*?[") else [pattern])
        if not paths:
            results.append(Finding(passed=False, description=f"{probe.name}: nothing in the image matches {pattern}"))
        for path in paths:
            read = registry.read_file(repository=repository, reference=reference, path=path)
            results.append(run_probe(probe, path, _text(read)))
    facts = {k: v for r in results for k, v in r.facts.items()}
    return Finding(passed=all(r.passed for r in results), description="\n".join(r.description for r in results), facts=facts)


def verify_image(registry: Registry, *, built: BuiltImage, tpu: TpuSection, repository: str) -> dict[str, Finding]:
    """The three image checks, from the pushed image's layers (by digest, so a moved tag cannot interfere)."""
    manifest = registry.manifest(repository=repository, reference=built.digest)
    if manifest is None:
        missing = Finding(passed=False, description=f"{built.pinned_ref} is not in the registry")
        return {CHECK_INSTALLED: missing, CHECK_PROBES: missing, CHECK_LAYERS: missing}
    installed = read_installed(registry, repository=repository, reference=built.digest,
                               site_packages=tpu.site_packages, package=tpu.harbor_package)
    return {
        CHECK_INSTALLED: installed_matches_lock(installed, built.lock_pin, tpu.harbor_package),
        CHECK_PROBES: run_probes(registry, repository=repository, reference=built.digest, tpu=tpu),
        CHECK_LAYERS: layers_pullable(manifest, min_layers=tpu.min_layers, max_layer_bytes=tpu.max_layer_bytes),
    }

