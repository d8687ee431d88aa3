"""Building OCI/Docker images in Python (tar layers,
whiteouts, links) and pushing them to a registry."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from dataclasses import dataclass

from resources.registry import (
    DOCKER_LAYER_GZIP,
    DOCKER_MANIFEST,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_MANIFEST,
    Registry,
    digest_of,
)


@dataclass
class Entry:
    name: str
    kind: str = "file"  # file | dir | symlink | hardlink
    data: bytes = b""
    target: str = ""


def f(name: str, data: bytes | str) -> Entry:
    return Entry(name, data=data.encode() if isinstance(data, str) else data)


def d(name: str) -> Entry:
    return Entry(name, kind="dir")


def symlink(name: str, target: str) -> Entry:
    return Entry(name, kind="symlink", target=target)


def hardlink(name: str, target: str) -> Entry:
    return Entry(name, kind="hardlink", target=target)


def whiteout(path: str) -> Entry:
    """`.wh.NAME` next to NAME: NAME is deleted in this layer."""
    parent, _, base = path.rpartition("/")
    return f(f"{parent}/.wh.{base}" if parent else f".wh.{base}", b"")


def opaque(directory: str) -> Entry:
    """`.wh..wh..opq` in a directory: nothing below it from lower layers shows."""
    return f(f"{directory}/.wh..wh..opq", b"")


def tar_bytes(*entries: Entry) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mtime = 0
            if e.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif e.kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if e.kind == "symlink" else tarfile.LNKTYPE
                info.linkname = e.target
                tar.addfile(info)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
    return buf.getvalue()


@dataclass
class Layer:
    blob: bytes
    media_type: str
    diff_id: str


def layer(*entries: Entry, compress: bool = True, media_type: str | None = None) -> Layer:
    plain = tar_bytes(*entries)
    blob = gzip.compress(plain, mtime=0) if compress else plain
    default = OCI_LAYER_GZIP if compress else OCI_LAYER_TAR
    return Layer(blob=blob, media_type=media_type or default, diff_id=digest_of(plain))


@dataclass
class Pushed:
    digest: str
    raw: bytes
    layer_digests: list[str]


def oci_manifest(
    config: dict, layers: list[dict], media_type: str = OCI_MANIFEST, config_type: str = OCI_CONFIG
) -> dict:
    return {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {"mediaType": config_type, **config},
        "layers": layers,
    }


def push_image(
    reg: Registry,
    repo: str,
    layers: list[Layer],
    *,
    tag: str | None = None,
    arch: str = "amd64",
    labels: dict[str, str] | None = None,
    docker: bool = False,
) -> Pushed:
    """Push layers, a config and a manifest; docker=True
    writes a Docker v2 manifest instead of OCI."""
    descs = [
        reg.push_blob(repository=repo, data=lay.blob, media_type=lay.media_type) for lay in layers
    ]
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Labels": labels or {}},
        "rootfs": {"type": "layers", "diff_ids": [lay.diff_id for lay in layers]},
    }
    config_type = "application/vnd.docker.container.image.v1+json" if docker else OCI_CONFIG
    cfg = reg.push_blob(repository=repo, data=json.dumps(config).encode(), media_type=config_type)
    layer_json = [
        {
            "mediaType": DOCKER_LAYER_GZIP if docker else x.media_type,
            "digest": x.digest,
            "size": x.size,
        }
        for x in descs
    ]
    doc = oci_manifest(
        {"digest": cfg.digest, "size": cfg.size},
        layer_json,
        DOCKER_MANIFEST if docker else OCI_MANIFEST,
        config_type,
    )
    raw = json.dumps(doc).encode()
    digest = reg.push_manifest(repository=repo, raw=raw, media_type=doc["mediaType"], tag=tag)
    return Pushed(digest=digest, raw=raw, layer_digests=[x.digest for x in descs])


def small_image(
    reg: Registry, repo: str, text: str, *, tag: str | None = None, arch: str = "amd64"
) -> Pushed:
    return push_image(reg, repo, [layer(f("etc/which", text))], tag=tag, arch=arch)


def push_index(
    reg: Registry, repo: str, entries: list[tuple[Pushed, str]], tag: str
) -> tuple[str, bytes]:
    manifests = [
        {
            "mediaType": OCI_MANIFEST,
            "digest": p.digest,
            "size": len(p.raw),
            "platform": {"os": "linux", "architecture": arch},
        }
        for p, arch in entries
    ]
    raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}).encode()
    return reg.push_manifest(repository=repo, raw=raw, media_type=OCI_INDEX, tag=tag), raw
