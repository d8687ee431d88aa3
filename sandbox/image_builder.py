"""What the sandbox's kaniko builds: a REAL multi-layer OCI image from a consumer checkout.

kaniko needs a cluster; this builds what `docker/Dockerfile.tpu` would, honestly enough that the
verification reads real installed files: a base layer, a layer with harbor installed by the real uv
from the Dockerfile's pinned commit (dist-info METADATA and PEP 610 direct_url.json included), and
the app layer (one layer with --single-snapshot). It pushes to the destination the build script
names, as kaniko does; sandbox/fake_kaniko.py is the executor that calls it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from resources.registry import OCI_CONFIG, OCI_LAYER_GZIP, OCI_MANIFEST, ImageRef, Registry
from resources.site import SiteConfig
from resources.uv import uv_binary
from tpu_assets.dockerfile import find_pin, pin_variable

VENV = "opt/openthoughts/.venv"


def _layer(files: dict[str, bytes], modes: dict[str, int] | None = None) -> tuple[bytes, str]:
    """A reproducible gzip'd tar (fixed mtimes, owners, order); returns (blob, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parents[i]) for p in files for i in range(len(Path(p).parents) - 1)})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(files[path]), (modes or {}).get(path, 0o644)
            tar.addfile(info, io.BytesIO(files[path]))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, mtime=0), "sha256:" + hashlib.sha256(tar_bytes).hexdigest()


def _base_files() -> tuple[dict[str, bytes], dict[str, int]]:
    python = b'#!/bin/sh\n# sandbox image: the venv python is the host python with the image site-packages\nexec python3 "$@"\n'
    return (
        {
            "etc/os-release": b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
            f"{VENV}/pyvenv.cfg": b"home = /usr/local/bin\nversion = 3.12.7\n",
            f"{VENV}/bin/python": python,
        },
        {f"{VENV}/bin/python": 0o755},
    )


def install_harbor(url: str, commit: str, target: Path) -> dict[str, bytes]:
    """`uv pip install --no-deps --force-reinstall harbor @ git+URL@COMMIT`, into a directory."""
    spec = f"harbor @ git+{url}@{commit}"
    proc = subprocess.run(
        [uv_binary(), "pip", "install", "--offline", "--no-deps", "--force-reinstall", "--python", sys.executable,
         "--target", str(target), spec],
        capture_output=True, text=True, timeout=600, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"installing {spec} failed:\n{proc.stderr}")
    return {
        str(p.relative_to(target)): p.read_bytes()
        for p in target.rglob("*")
        if p.is_file() and p.name != ".lock" and "__pycache__" not in p.parts
    }


def build_and_push(*, app_dir: Path, destination: str, site: SiteConfig, registry: Registry,
                   single_snapshot: bool = False) -> str:
    """Build the image for the checkout at `app_dir` and push it to `destination`; returns the digest."""
    tpu = site.tpu
    dockerfile = (app_dir / tpu.dockerfile).read_text(encoding="utf-8")
    commit = find_pin(dockerfile, tpu.dockerfile, pin_variable(tpu.harbor_package)).commit
    m = re.search(r"git\+(\S+?)@\$\{" + pin_variable(tpu.harbor_package) + r"\}", dockerfile)
    harbor_url = m.group(1) if m else tpu.harbor_repo
    site_packages = tpu.site_packages.strip("/")
    ref = ImageRef.parse(destination)

    with tempfile.TemporaryDirectory(prefix="lockstep-build-") as tmp:
        installed = install_harbor(harbor_url, commit, Path(tmp) / "site-packages")
    base, base_modes = _base_files()
    app = {
        f"app/{p.relative_to(app_dir)}": p.read_bytes()
        for p in sorted(app_dir.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(app_dir).parts
    }
    harbor = {f"{site_packages}/{k}": v for k, v in installed.items()}
    if single_snapshot:  # kaniko --single-snapshot: the whole filesystem as one layer
        layers = [("single snapshot", *_layer({**base, **harbor, **app}, base_modes))]
    else:
        layers = [
            ("base", *_layer(base, base_modes)),
            (f"uv pip install --force-reinstall harbor @ {commit[:8]}", *_layer(harbor)),
            ("COPY . /app", *_layer(app)),
        ]
    descriptors = [registry.push_blob(repository=ref.repository, data=blob, media_type=OCI_LAYER_GZIP) for _, blob, _ in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [f"PATH=/{VENV}/bin:/usr/local/bin:/usr/bin:/bin", f"{pin_variable(tpu.harbor_package)}={commit}"],
            "WorkingDir": "/app",
            "Labels": {
                "org.opencontainers.image.revision": ref.tag or "",
                "org.opencontainers.image.source": tpu.consumer_repo,
                "lockstep.harbor.commit": commit,
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id for _, _, diff_id in layers]},
        "history": [{"created_by": what} for what, _, _ in layers],
    }
    config_desc = registry.push_blob(repository=ref.repository, data=json.dumps(config, sort_keys=True).encode(), media_type=OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_desc.digest, "size": config_desc.size},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": d.digest, "size": d.size} for d in descriptors],
    }
    raw = json.dumps(manifest, indent=3).encode()
    return registry.push_manifest(repository=ref.repository, raw=raw, media_type=OCI_MANIFEST, tag=ref.tag)
