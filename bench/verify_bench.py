"""A verification (3 probes + the installed-dist
check) as one scan vs one read per query, side by side.

    uv run python bench/verify_bench.py [--gib 1.0]

Starts its own docker-registry on 127.0.0.1 (stopped by PID at the end) and pushes a TPU-like image:
a 64 MiB base layer, a 1 GiB pip-like layer (incompressible filler, then harbor's package files,
then its dist-info at the very end, as an installer writes them), and two small top layers. Then,
against the same registry one after the other:

- the old way: one `glob`/`read_file` per query (what inspection.py did), no blob cache;
- `verify_image`: one scan for everything, with the blob cache;

each twice, as tpu/image checks and tpu/verified_image re-verifies. Bytes are counted where the
blobs come off the wire (a counting registry), GETs
per layer likewise. Asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

# Run as a script: the repo root is not on sys.path, and the registry launcher lives with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import PrivateAttr

from bench.bench_io import RandomBytes
from resources.registry import (
    OCI_CONFIG,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_MANIFEST,
    HttpRegistry,
)
from resources.site.tpu import HARBOR_GUARD_PROBE, Probe, TpuSection
from tests.support.registry_server import start_registry, stop_registry
from tpu_assets.inspection import (
    CHECK_INSTALLED,
    CHECK_PROBES,
    verify_image,
)
from tpu_assets.models import BuiltImage, HarborPin
from tpu_assets.verify import parse_installed, run_probe

REPO = "bench/tpu"
TAG = "tpu-0123abc"
SP = "opt/openthoughts/.venv/lib/python3.12/site-packages"
COMMIT = "42bc23b59d697b5b" + "0" * 24
MiB = 1024 * 1024
JOB_PY = b"""\
class Job:
    def resume(self):
        if existing_config != self.config:
            logger.warning("config changed since the job started; keeping the new one")
        return self
"""
PROBES = [
    HARBOR_GUARD_PROBE,
    Probe(name="every harbor module", path="harbor/*.py", anchor=r".", within=1),
    Probe(name="helper", path="harbor/util.py", anchor=r"^def helper", must_follow=r"return"),
]


def add(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, size: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.mode = 0, 0o644
    info.size = len(data) if data is not None else size
    tar.addfile(
        info, io.BytesIO(data) if data is not None else io.BufferedReader(RandomBytes(size), MiB)
    )


def pip_layer(path: Path, size: int) -> None:
    """Filler packages, harbor's modules in the middle, its dist-info last."""
    half = size // 2
    with tarfile.open(path, "w") as tar:
        for i in range(8):
            add(tar, f"{SP}/aaa_filler/part{i}.so", size=half // 8)
        add(tar, f"{SP}/harbor/__init__.py", b"from harbor.job import Job\n")
        add(tar, f"{SP}/harbor/job.py", JOB_PY)
        add(tar, f"{SP}/harbor/util.py", b"def helper():\n    return 1\n")
        for i in range(8):
            add(tar, f"{SP}/zzz_filler/part{i}.so", size=(size - half) // 8)
        add(tar, f"{SP}/harbor-0.4.2.dist-info/METADATA", b"Name: harbor\nVersion: 0.4.2\n")
        add(
            tar,
            f"{SP}/harbor-0.4.2.dist-info/direct_url.json",
            json.dumps(
                {
                    "url": "https://github.com/marin-community/harbor.git",
                    "vcs_info": {"vcs": "git", "commit_id": COMMIT},
                }
            ).encode(),
        )


def small_layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            add(tar, name, data)
    return gzip.compress(buf.getvalue(), mtime=0, compresslevel=1)


def push_image(reg: HttpRegistry, work: Path, pip_bytes: int) -> str:
    descs = []
    for name, build in (
        ("base.tar", lambda p: _base_layer(p)),
        ("pip.tar", lambda p: pip_layer(p, pip_bytes)),
    ):
        path = work / name
        build(path)
        descs.append(reg.push_blob_file(repository=REPO, path=path, media_type=OCI_LAYER_TAR))
        path.unlink()  # the registry holds its own copy; keep the disk footprint to one
    app = small_layer(
        {"app/README": b"lockstep bench\n" * 1000, "app/blob.bin": os.urandom(4 * MiB)}
    )
    top = small_layer({"etc/lockstep-build": b"tpu-0123abc\n"})
    descs += [
        reg.push_blob(repository=REPO, data=blob, media_type=OCI_LAYER_GZIP) for blob in (app, top)
    ]
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    )
    cfg = reg.push_blob(repository=REPO, data=config.encode(), media_type=OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": cfg.digest, "size": cfg.size},
        "layers": [{"mediaType": d.media_type, "digest": d.digest, "size": d.size} for d in descs],
    }
    return reg.push_manifest(
        repository=REPO, raw=json.dumps(manifest).encode(), media_type=OCI_MANIFEST, tag=TAG
    )


def _base_layer(path: Path) -> None:
    with tarfile.open(path, "w") as tar:
        add(tar, "etc/os-release", b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
        add(tar, "usr/lib/base.bin", size=64 * MiB)


class CountingRegistry(HttpRegistry):
    """HttpRegistry that counts blob GETs and the bytes they deliver, per digest (for the bench)."""

    _gets: Counter[str] = PrivateAttr(default_factory=Counter)
    _bytes: Counter[str] = PrivateAttr(default_factory=Counter)

    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        self._gets[digest] += 1
        return _Counting(super()._open_blob(repository, digest), self._bytes, digest)  # type: ignore[return-value]


class _Counting:
    def __init__(self, inner: BinaryIO, counter: Counter[str], digest: str) -> None:
        self.inner, self.counter, self.digest = inner, counter, digest

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.counter[self.digest] += len(data)
        return data

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _under(site_packages: str, path: str) -> str:
    return path.lstrip("/") if path.startswith("/") else f"{site_packages.strip('/')}/{path}"


def old_way(reg: HttpRegistry, tpu: TpuSection) -> bool:
    """inspection.py before the scan: one glob/read_file per query, each walking from the top."""
    pattern = f"{SP}/harbor-*.dist-info/METADATA"
    hits = reg.glob(repository=REPO, reference=TAG, pattern=pattern)
    dist_info = max(hits).rsplit("/", 1)[0]
    metadata = reg.read_file(repository=REPO, reference=TAG, path=f"{dist_info}/METADATA")
    direct = reg.read_file(repository=REPO, reference=TAG, path=f"{dist_info}/direct_url.json")
    installed = parse_installed(
        dist_info.rsplit("/", 1)[-1],
        metadata.data.decode() if metadata else "",
        direct.data.decode() if direct else None,
    )
    ok = installed.commit == COMMIT
    for probe in tpu.probes:
        path = _under(tpu.site_packages, probe.path)
        paths = reg.glob(repository=REPO, reference=TAG, pattern=path) if "*" in path else [path]
        for one in paths:
            read = reg.read_file(repository=REPO, reference=TAG, path=one)
            ok = ok and run_probe(probe, one, read.data.decode() if read else None).passed
    return ok


class Row(NamedTuple):
    label: str
    bytes_read: int
    gets: list[int]  # per layer, top first
    seconds: float
    passed: bool


def measure(label: str, reg: CountingRegistry, layers: list[str], run: Any) -> Row:
    reg._gets.clear()
    reg._bytes.clear()
    start = time.perf_counter()
    passed = run(reg)
    return Row(
        label,
        sum(reg._bytes.values()),
        [reg._gets[d] for d in reversed(layers)],
        time.perf_counter() - start,
        passed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the pip-like layer (GiB)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lockstep-verify-bench-"))
    server = None
    try:
        server = start_registry(work / "registry")
        t0 = time.perf_counter()
        plain = HttpRegistry(host=server.host, timeout_s=120, blob_cache_bytes=0)
        digest = push_image(plain, work, int(args.gib * 1024 * MiB))
        print(
            f"docker-registry pid {server.proc.pid} on {server.host}; "
            f"built and pushed the image in {time.perf_counter() - t0:.1f} s"
        )
        image = plain.manifest(repository=REPO, reference=TAG)
        assert image is not None
        layers = [d.digest for d in image.layers]
        image_bytes = sum(d.size for d in image.layers)
        deciding = sum(d.size for d in image.layers[1:])  # the pip layer and everything above it
        tpu = TpuSection(
            harbor_repo="https://example.invalid/harbor.git",
            harbor_branch="main",
            consumer_repo="https://example.invalid/consumer.git",
            consumer_branch="main",
            image=f"{server.host}/{REPO}",
            site_packages="/" + SP,
            probes=PROBES,
        )
        built = BuiltImage(
            consumer_commit="c" * 40,
            gitsha="0123abc",
            ref=f"{server.host}/{REPO}:{TAG}",
            digest=digest,
            lock_pin=HarborPin(commit=COMMIT, version="0.4.2"),
            dockerfile_commit=COMMIT,
            job_id="bench",
            job_state="SUCCEEDED",
        )

        def scan_way(reg: HttpRegistry) -> bool:
            found = verify_image(reg, built=built, tpu=tpu, repository=REPO)
            return found[CHECK_INSTALLED].passed and found[CHECK_PROBES].passed

        old = CountingRegistry(host=server.host, timeout_s=120, blob_cache_bytes=0)
        new = CountingRegistry(
            host=server.host,
            timeout_s=120,
            blob_cache_dir=str(work / "blobs"),
            blob_cache_bytes=int((args.gib + 1) * 1024 * MiB),
        )
        rows = [
            measure("old: read per query, 1st", old, layers, lambda r: old_way(r, tpu)),
            measure("old: read per query, 2nd", old, layers, lambda r: old_way(r, tpu)),
            measure("scan + cache, 1st", new, layers, scan_way),
            measure("scan + cache, 2nd", new, layers, scan_way),
        ]

        sizes = ", ".join(f"{d.size / MiB:,.1f}" for d in reversed(image.layers))
        print(
            f"image: {len(layers)} layers (top first: {sizes} MiB), {image_bytes:,} bytes; "
            f"the layers that decide the probed files (pip layer and above): {deciding:,} bytes\n"
        )
        print(
            f"{'':26} {'bytes read':>15} {'/ image':>8} {'/ deciding':>11} "
            f"{'GETs per layer (top first)':>27} "
            f"{'seconds':>8} {'checks':>7}"
        )
        for row in rows:
            print(
                f"{row.label:26} {row.bytes_read:>15,} {row.bytes_read / image_bytes:>7.2f}x "
                f"{row.bytes_read / deciding:>10.2f}x {row.gets!s:>27} {row.seconds:>8.2f} "
                f"{'pass' if row.passed else 'FAIL':>7}"
            )
        old_total = rows[0].bytes_read + rows[1].bytes_read
        new_total = rows[2].bytes_read + rows[3].bytes_read
        print(
            "\nper verification, bytes read / deciding-layer bytes: old "
            f"{rows[0].bytes_read / deciding:.2f}x, "
            f"scan {rows[2].bytes_read / deciding:.2f}x (goal <= 1.00x), scan from the cache "
            f"{rows[3].bytes_read / deciding:.2f}x"
        )
        print(
            f"both verifications, registry bytes scan / old: {new_total / old_total:.3f} "
            f"({old_total / max(new_total, 1):.1f}x fewer bytes, "
            f"{(rows[0].seconds + rows[1].seconds) / (rows[2].seconds + rows[3].seconds):.1f}x "
            "faster)"
        )
        # The figure the table keeps, last: the scan's bytes
        # over the deciding layers, and its worst GETs per layer.
        print(
            "RATIO verification bytes read / deciding-layer bytes: "
            f"{rows[2].bytes_read / deciding:.2f} "
            f"(goal <= 1.00), at most {max(rows[2].gets)} GET per layer (goal <= 1)"
        )
    finally:
        if server is not None:
            stop_registry(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
