"""Names, digests, media types and manifests: what an OCI reference is, checked where it enters.

No I/O here; the backends (http.py, layout.py) and the operations (base.py) build on these.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import Field

from resources.errors import LockstepError
from resources.model import Model

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

REF_NAME = "org.opencontainers.image.ref.name"  # the tag annotation in an OCI layout's index.json
IMAGE_MANIFESTS = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
INDEXES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_ACCEPT = f"{OCI_MANIFEST}, {OCI_INDEX}, {DOCKER_MANIFEST}, {DOCKER_LIST}"

# distribution's own grammar (reference/regexp.go), so a name is refused here, not by the server.
# `\Z`, not `$`: Python's `$` also matches before a final newline, so `tpu\n` would pass as a tag.
_REPOSITORY_RE = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*\Z"
)
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DIGEST_RE = re.compile(r"^(?:sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})\Z")

MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # distribution refuses larger manifests too
MAX_CONFIG_BYTES = 64 * 1024 * 1024
CHUNK = 1024 * 1024


class RegistryError(LockstepError):
    """The registry refused or failed a request; the message names the ref and the HTTP status."""


class TagMoved(RegistryError):
    """Compare-and-swap refused: the tag was not where the caller expected. Nothing was written."""


class PinnedTagTaken(RegistryError):
    """An immutable pinned tag (e.g. tpu-<sha>) already
    points at another digest. Nothing was written."""


def digest_of(data: bytes) -> str:
    """The OCI content digest (``sha256:<hex>``) of some bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(reference: str) -> bool:
    return bool(_DIGEST_RE.match(reference))


class ImageRef(Model):
    """``host[:port]/name[:tag]`` or ``host[:port]/name@sha256:...``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        text = ref.strip()
        if "://" in text:
            raise RegistryError(
                f"image ref {ref!r} has a URL scheme: write host/name:tag, e.g. "
                "ghcr.io/org/image:tag"
            )
        name, _, digest = text.partition("@")
        host, _, rest = name.partition("/")
        # Like docker: the first component is a host only if it has a '.' or ':' or is localhost.
        if not rest or not ("." in host or ":" in host or host == "localhost"):
            raise RegistryError(
                f"image ref {ref!r} names no registry host: write e.g. ghcr.io/org/image:tag"
            )
        repository, tag = rest, None
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            repository, _, tag = rest.rpartition(":")
        check_repository(repository)
        if tag is not None:
            check_tag(tag)
        if digest:
            check_digest(digest)
        return cls(registry=host, repository=repository, tag=tag, digest=digest or None)

    @property
    def reference(self) -> str:
        """The digest when there is one, else the tag ("latest"
        when the ref names neither, as docker does)."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


class Descriptor(Model):
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = Field(default_factory=dict)
    # OCI 1.1: what an artifact manifest (a referrer) is, e.g. an in-toto statement
    artifact_type: str = ""


class Manifest(Model):
    """One image manifest (never an index), with the exact bytes the registry holds."""

    digest: str
    media_type: str
    raw: bytes = Field(repr=False)
    config: Descriptor
    layers: list[Descriptor]


class FileRead(Model):
    """A file read out of an image's layers, and what it cost."""

    path: str
    data: bytes = Field(repr=False)
    layer_digest: str
    layer_index: int  # 0 is the bottom (base) layer
    bytes_read: int  # compressed blob bytes pulled from the registry to decide the path
    image_bytes: int  # sum of all layer sizes, for the ratio


@dataclass(frozen=True)
class RawManifest:
    """A manifest or index exactly as stored: its bytes, media type and digest."""

    raw: bytes
    media_type: str
    digest: str


# A tag write is guarded by a callable that sees the tag's digest right before the write (for the
# layout: under its lock). It raises to refuse (TagMoved, PinnedTagTaken), or returns whether a
# write is still needed (False when the tag is already there).
TagGuard = Callable[[str | None], bool]


# -- manifests -------------------------------------------------------------------------------------


def sniff_media_type(raw: bytes) -> str | None:
    """The media type a manifest's JSON declares or implies; None when it is not a manifest."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        return None
    if mt := doc.get("mediaType"):
        return mt
    if "manifests" in doc:
        return OCI_INDEX
    if "config" in doc and "layers" in doc:
        return OCI_MANIFEST
    return None


def check_manifest_bytes(stored: RawManifest, where: str) -> dict:
    try:
        doc = json.loads(stored.raw)
    except ValueError as exc:
        raise RegistryError(f"{where}: manifest is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"{where}: manifest is not a JSON object")
    declared = doc.get("mediaType")
    if declared and declared != stored.media_type:
        raise RegistryError(
            f"{where}: manifest says mediaType {declared} but is pushed as {stored.media_type}: "
            f"push it as {declared}"
        )
    if len(stored.raw) > MAX_MANIFEST_BYTES:
        raise RegistryError(
            f"{where}: manifest is {len(stored.raw)} bytes, over {MAX_MANIFEST_BYTES}"
        )
    return doc


def descriptor_of(entry: dict) -> Descriptor:
    return Descriptor(
        media_type=entry.get("mediaType", ""),
        digest=entry["digest"],
        size=int(entry.get("size", 0)),
        annotations=entry.get("annotations") or {},
        artifact_type=entry.get("artifactType") or "",
    )


def image_manifest(stored: RawManifest, where: str) -> Manifest:
    if stored.media_type not in IMAGE_MANIFESTS:
        raise RegistryError(
            f"{where}: manifest has media type {stored.media_type}; lockstep reads OCI or Docker "
            "v2 image manifests"
        )
    doc = json.loads(stored.raw)
    try:
        return Manifest(
            digest=stored.digest,
            media_type=stored.media_type,
            raw=stored.raw,
            config=descriptor_of(doc["config"]),
            layers=[descriptor_of(layer) for layer in doc.get("layers", [])],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistryError(f"{where}: image manifest is malformed ({exc!r})") from None


def platform_entry(index: RawManifest, platform: str, where: str) -> str:
    """The digest of the index entry for `platform` ("os/arch" or "os/arch/variant")."""
    want = platform.split("/")
    if len(want) not in (2, 3):
        raise RegistryError(
            f"platform {platform!r} is not os/arch or os/arch/variant (e.g. linux/amd64)"
        )
    seen = []
    for entry in json.loads(index.raw).get("manifests", []):
        p = entry.get("platform") or {}
        have = [p.get("os", ""), p.get("architecture", ""), p.get("variant", "")]
        seen.append("/".join(x for x in have if x))
        if have[:2] == want[:2] and (len(want) == 2 or have[2] == want[2]):
            return entry["digest"]
    raise RegistryError(
        f"{where} is an index without a {platform} image (it has: "
        f"{', '.join(seen) or 'no entries'}): "
        "build for that platform or ask for one of those"
    )


# -- validation ------------------------------------------------------------------------------------


def check_repository(repository: str) -> None:
    if not _REPOSITORY_RE.match(repository):
        raise RegistryError(
            f"repository {repository!r} is not a valid name: lowercase letters, digits and . _ - "
            "separated by '/', e.g. open-thoughts/openthoughts-agent"
        )


def check_tag(tag: str) -> None:
    if not _TAG_RE.match(tag):
        raise RegistryError(
            f"tag {tag!r} is not a valid tag: up to 128 letters, digits, '_', '.', '-', not "
            "starting with '.' or '-'"
        )


def check_digest(digest: str) -> None:
    if not is_digest(digest):
        raise RegistryError(f"{digest!r} is not a digest: expected sha256:<64 hex>")


def check_reference(reference: str) -> None:
    if not is_digest(reference):
        check_tag(reference)


def read_up_to(stream: BinaryIO, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = stream.read(min(CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def hash_file(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def media_type_of(content_type: str | None, raw: bytes) -> str | None:
    media_type = (content_type or "").split(";")[0].strip()
    if media_type in IMAGE_MANIFESTS or media_type in INDEXES:
        return media_type
    return sniff_media_type(raw)
