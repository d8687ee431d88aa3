"""read_file vs a full pull, side by side in one run, on a >= 1 GiB image in a real docker-registry.

    uv run python bench/read_file_bench.py [--gib 1.0]

Starts its own docker-registry on 127.0.0.1 (stopped by PID at the end), pushes an image whose base
layer is an uncompressed tar of incompressible bytes and whose small top layer holds the file the
TPU checks read (harbor's direct_url.json), then reads that file with `read_file` and pulls every
layer in full. Prints bytes and seconds for both and their ratios; asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

# Run as a script: the repo root is not on sys.path, and the registry launcher lives with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_io import RandomBytes
from resources.registry import (
    OCI_CONFIG,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_MANIFEST,
    HttpRegistry,
)
from tests.support.registry_server import start_registry, stop_registry

REPO = "bench/tpu"
TARGET = "/usr/lib/python3.11/site-packages/harbor-0.4.2.dist-info/direct_url.json"
BASE_FIRST = "/etc/os-release"  # the first member of the big base layer
MiB = 1024 * 1024


def add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes | None = None,
    *,
    size: int = 0,
    stream: io.RawIOBase | None = None,
) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.mtime, info.mode = 0, 0o644
    info.size = len(data) if data is not None else size
    tar.addfile(
        info,
        io.BytesIO(data)
        if data is not None
        else io.BufferedReader(stream or RandomBytes(size), MiB),
    )


def write_base_layer(path: Path, size: int) -> None:
    with tarfile.open(path, "w") as tar:
        add(tar, BASE_FIRST, b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
        add(tar, "/opt/base/blob.bin", size=size)


def top_layer() -> bytes:
    direct_url = {
        "url": "https://github.com/marin-community/harbor.git",
        "vcs_info": {"vcs": "git", "commit_id": "42bc23b59d697b5b" + "0" * 24},
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add(tar, TARGET.rsplit("/", 1)[0] + "/METADATA", b"Name: harbor\nVersion: 0.4.2\n")
        add(tar, TARGET, json.dumps(direct_url).encode())
        add(tar, "/app/README", b"lockstep bench\n" * 100)
    return gzip.compress(buf.getvalue(), mtime=0)


def push_image(reg: HttpRegistry, work: Path, base_bytes: int) -> None:
    base_tar = work / "base.tar"
    write_base_layer(base_tar, base_bytes)
    base = reg.push_blob_file(repository=REPO, path=base_tar, media_type=OCI_LAYER_TAR)
    base_tar.unlink()  # the registry holds its own copy; keep the disk footprint to one
    top = reg.push_blob(repository=REPO, data=top_layer(), media_type=OCI_LAYER_GZIP)
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    )
    cfg = reg.push_blob(repository=REPO, data=config.encode(), media_type=OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": cfg.digest, "size": cfg.size},
        "layers": [
            {"mediaType": d.media_type, "digest": d.digest, "size": d.size} for d in (base, top)
        ],
    }
    reg.push_manifest(
        repository=REPO, raw=json.dumps(manifest).encode(), media_type=OCI_MANIFEST, tag="bench"
    )


class Measured(NamedTuple):
    label: str
    bytes_read: int
    seconds: float
    layer: str


def full_pull(reg: HttpRegistry) -> Measured:
    """What a naive check does: download every layer in full (nothing written to disk)."""
    start = time.perf_counter()
    image = reg.manifest(repository=REPO, reference="bench")
    assert image is not None
    total = 0
    for desc in image.layers:
        with reg.open_blob(repository=REPO, digest=desc.digest) as stream:
            while chunk := stream.read(MiB):
                total += len(chunk)
    return Measured("full pull of every layer", total, time.perf_counter() - start, "all")


def timed_read(reg: HttpRegistry, label: str, path: str) -> Measured:
    start = time.perf_counter()
    got = reg.read_file(repository=REPO, reference="bench", path=path)
    seconds = time.perf_counter() - start
    assert got is not None, f"{path} not found in the bench image"
    return Measured(label, got.bytes_read, seconds, str(got.layer_index))


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.6f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gib", type=float, default=1.0, help="size of the incompressible base layer (GiB)"
    )
    args = parser.parse_args()
    base_bytes = int(args.gib * 1024 * MiB)

    work = Path(tempfile.mkdtemp(prefix="lockstep-bench-"))
    server = None
    try:
        server = start_registry(work / "registry")
        reg = HttpRegistry(host=server.host, timeout_s=120, blob_cache_dir=str(work / "blobs"))
        t0 = time.perf_counter()
        push_image(reg, work, base_bytes)
        print(
            f"docker-registry pid {server.proc.pid} on {server.host}; "
            f"built and pushed the image in {time.perf_counter() - t0:.1f} s"
        )

        image = reg.manifest(repository=REPO, reference="bench")
        assert image is not None
        image_bytes = sum(d.size for d in image.layers)
        # Same registry, same warm page cache, one after the other.
        pull = full_pull(reg)
        top = timed_read(reg, "read_file, file in top layer", TARGET)
        base = timed_read(reg, "read_file, 1st member of base", BASE_FIRST)

        print(
            f"image: {len(image.layers)} layers, {image_bytes:,} bytes "
            f"({image_bytes / 1024**3:.2f} GiB)\n"
        )
        print(f"{'':32} {'bytes read':>15} {'of image':>12} {'seconds':>9} {'layer':>6}")
        for row in (pull, top, base):
            print(
                f"{row.label:32} {row.bytes_read:>15,} {percent(row.bytes_read, image_bytes):>12} "
                f"{row.seconds:>9.3f} {row.layer:>6}"
            )
        print()
        for row in (top, base):
            print(
                f"{row.label}: bytes read / image bytes {percent(row.bytes_read, image_bytes)} "
                "(goal < 2%); "
                f"seconds / full pull {percent(row.seconds, pull.seconds)} "
                f"({pull.seconds / row.seconds:,.0f}x faster)"
            )
        print(
            "RATIO read_file bytes read / image bytes: "
            f"{percent(max(top.bytes_read, base.bytes_read), image_bytes)} "
            "(goal < 2%)"
        )
    finally:
        if server is not None:
            stop_registry(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
