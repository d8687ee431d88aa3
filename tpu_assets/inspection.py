"""Reading the INSTALLED files out of a pushed image and judging them (runbook §4).

One scan over the layers answers every read of a verification: the installed dist-info's METADATA
and direct_url.json, and every probe's files (globs included), each layer blob opened once.
"""

from __future__ import annotations

from resources.registry import FileRead, GlobQuery, ImageScan, Registry
from resources.site.tpu import Probe, TpuSection
from tpu_assets.keys import CHECK_INSTALLED, CHECK_LAYERS, CHECK_PROBES
from tpu_assets.models import BuiltImage, Finding
from tpu_assets.verify import (
    InstalledDist,
    installed_matches_lock,
    layers_pullable,
    parse_installed,
    run_probe,
)


def _under(site_packages: str, path: str) -> str:
    return path.lstrip("/") if path.startswith("/") else f"{site_packages.strip('/')}/{path}"


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _text(read: FileRead | None) -> str | None:
    return read.data.decode("utf-8", errors="replace") if read else None


# -- what to ask the scan, and reading its answers -------------------------------------------------


def _dist_info_query(site_packages: str, package: str) -> GlobQuery:
    pattern = f"{site_packages.strip('/')}/{package.replace('-', '_')}-*.dist-info/METADATA"
    return GlobQuery(pattern=pattern, read=True, siblings=("direct_url.json",))


def _probe_queries(tpu: TpuSection) -> tuple[list[str], list[GlobQuery]]:
    paths, globs = [], []
    for probe in tpu.probes:
        pattern = _under(tpu.site_packages, probe.path)
        if _is_glob(pattern):
            globs.append(GlobQuery(pattern=pattern, read=True))
        else:
            paths.append(pattern)
    return paths, globs


def _installed_from(scan: ImageScan, query: GlobQuery) -> InstalledDist | None:
    hits = scan.glob(query.pattern)
    if not hits:
        return None
    metadata_path = max(hits)
    dist_info = metadata_path.rsplit("/", 1)[0]
    metadata = _text(scan.file(metadata_path))
    direct = _text(scan.file(f"{dist_info}/direct_url.json"))
    return parse_installed(dist_info.rsplit("/", 1)[-1], metadata or "", direct)


def _probes_from(scan: ImageScan, probes: list[Probe], site_packages: str) -> Finding:
    results: list[Finding] = []
    for probe in probes:
        pattern = _under(site_packages, probe.path)
        paths = scan.glob(pattern) if _is_glob(pattern) else [pattern]
        if not paths:
            results.append(
                Finding(
                    passed=False,
                    description=f"{probe.name}: nothing in the image matches {pattern}",
                )
            )
        for path in paths:
            results.append(run_probe(probe, path, _text(scan.file(path))))
    facts = {k: v for r in results for k, v in r.facts.items()}
    return Finding(
        passed=all(r.passed for r in results),
        description="\n".join(r.description for r in results),
        facts=facts,
    )


# -- the public reads ------------------------------------------------------------------------------


def read_installed(
    registry: Registry, *, repository: str, reference: str, site_packages: str, package: str
) -> InstalledDist | None:
    """The installed distribution's METADATA and
    direct_url.json, found by globbing its dist-info."""
    query = _dist_info_query(site_packages, package)
    scan = registry.scan(repository=repository, reference=reference, globs=[query])
    return _installed_from(scan, query)


def run_probes(registry: Registry, *, repository: str, reference: str, tpu: TpuSection) -> Finding:
    """Every configured probe, each against every installed file its path (glob) names."""
    paths, globs = _probe_queries(tpu)
    scan = registry.scan(repository=repository, reference=reference, paths=paths, globs=globs)
    return _probes_from(scan, tpu.probes, tpu.site_packages)


def verify_image(
    registry: Registry, *, built: BuiltImage, tpu: TpuSection, repository: str
) -> dict[str, Finding]:
    """The three image checks, from the pushed image's
    layers (by digest, so a moved tag cannot interfere).

    One scan reads everything. It reads each layer it opens to its end (checked against its digest),
    so the layers land in the registry's blob cache: tpu/verified_image verifies the same image
    again and then reads them from disk.
    """
    manifest = registry.manifest(repository=repository, reference=built.digest)
    if manifest is None:
        why = registry.absence(repository=repository, reference=built.digest)
        missing = Finding(
            passed=False, description=f"{built.pinned_ref} is not in the registry ({why})"
        )
        return {CHECK_INSTALLED: missing, CHECK_PROBES: missing, CHECK_LAYERS: missing}
    installed_query = _dist_info_query(tpu.site_packages, tpu.harbor_package)
    paths, globs = _probe_queries(tpu)
    scan = registry.scan(
        repository=repository,
        reference=built.digest,
        paths=paths,
        globs=[installed_query, *globs],
        read_whole_layers=True,
    )
    return {
        CHECK_INSTALLED: installed_matches_lock(
            _installed_from(scan, installed_query), built.lock_pin, tpu.harbor_package
        ),
        CHECK_PROBES: _probes_from(scan, tpu.probes, tpu.site_packages),
        CHECK_LAYERS: layers_pullable(
            manifest, min_layers=tpu.min_layers, max_layer_bytes=tpu.max_layer_bytes
        ),
    }
