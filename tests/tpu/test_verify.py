"""Verification from installed files: the right guard, the right harbor, pullable layers."""

from __future__ import annotations

import json

from resources.registry import Descriptor, Manifest
from resources.site.tpu import HARBOR_GUARD_PROBE, Probe
from sandbox.harbor_source import apply_fix, job_py
from tpu_assets.models import HarborPin
from tpu_assets.verify import installed_matches_lock, layers_pullable, parse_installed, run_probe

SHA, OLD = "2dde0bbf11d48a4e44df6ad0a56cee31e7ab609e", "d9504d19aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
METADATA = "Metadata-Version: 2.4\nName: harbor\nVersion: 0.8.1\nSummary: x\n\nlong description\n"


def direct_url(commit: str) -> str:
    return json.dumps(
        {
            "url": "https://github.com/marin-community/harbor.git",
            "vcs_info": {"vcs": "git", "commit_id": commit},
        }
    )


def test_guard_probe_fails_on_the_unfixed_raise_and_names_the_line() -> None:
    finding = run_probe(HARBOR_GUARD_PROBE, "harbor/job.py", job_py(fixed=False))
    assert not finding.passed
    assert "harbor/job.py:275" in finding.description and "logger" in finding.description


def test_guard_probe_passes_on_the_fix_despite_the_far_legitimate_raise() -> None:
    text = apply_fix(job_py(fixed=False))
    assert "raise FileExistsError" in text  # the per-trial raise, ~560 lines below, stays
    finding = run_probe(HARBOR_GUARD_PROBE, "harbor/job.py", text)
    assert finding.passed, finding.description


def test_probe_with_missing_anchor_or_file_fails() -> None:
    assert not run_probe(HARBOR_GUARD_PROBE, "harbor/job.py", "x = 1\n").passed
    assert "not in the image" in run_probe(HARBOR_GUARD_PROBE, "harbor/job.py", None).description
    probe = Probe(name="p", path="f", anchor="^a$", within=1, must_follow="^b$")
    assert run_probe(probe, "f", "a\nb\n").passed and not run_probe(probe, "f", "a\nc\nb\n").passed


def test_installed_harbor_must_equal_the_lock_pin() -> None:
    pin = HarborPin(commit=SHA, version="0.8.1")
    good = parse_installed("harbor-0.8.1.dist-info", METADATA, direct_url(SHA))
    assert installed_matches_lock(good, pin, "harbor").passed
    lagging = parse_installed(
        "harbor-0.8.0.dist-info", METADATA.replace("0.8.1", "0.8.0"), direct_url(OLD)
    )
    finding = installed_matches_lock(lagging, pin, "harbor")
    assert (
        not finding.passed
        and "stale bake" in finding.description
        and OLD[:8] in finding.description
    )


def test_missing_direct_url_fails() -> None:
    finding = installed_matches_lock(
        parse_installed("harbor-0.8.1.dist-info", METADATA, None),
        HarborPin(commit=SHA, version="0.8.1"),
        "harbor",
    )
    assert not finding.passed and "no direct_url.json" in finding.description
    assert not installed_matches_lock(None, HarborPin(commit=SHA, version="0.8.1"), "harbor").passed


def _manifest(*sizes: int) -> Manifest:
    layers = [
        Descriptor(
            media_type="application/vnd.oci.image.layer.v1.tar+gzip",
            digest=f"sha256:{i:064x}",
            size=s,
        )
        for i, s in enumerate(sizes)
    ]
    return Manifest(
        digest="sha256:" + "f" * 64,
        media_type="application/vnd.oci.image.manifest.v1+json",
        raw=b"{}",
        config=Descriptor(
            media_type="application/vnd.oci.image.config.v1+json",
            digest="sha256:" + "e" * 64,
            size=2,
        ),
        layers=layers,
    )


def test_layers_pullable() -> None:
    assert layers_pullable(_manifest(10, 20, 30), min_layers=2, max_layer_bytes=100).passed
    single = layers_pullable(_manifest(16 * 1024**3), min_layers=2, max_layer_bytes=8 * 1024**3)
    assert (
        not single.passed
        and "SINGLE_SNAPSHOT" in single.description
        and "16.0 GiB" in single.description
    )
