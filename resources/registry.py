"""OCI registries: resolve, fetch, retag by exact bytes, compare-and-swap tag moves, read one file from layers.

Written by hand on purpose: oras-py re-serialises a manifest on retag (the digest changes) and
python-dxf reports the config digest as the image digest; a retag must PUT the exact bytes.

Two backends behind one interface (the `project_fully_featured` pattern): `HttpRegistry` speaks the
distribution API (ghcr with a bearer token exchanged from an env var; anonymous plain HTTP for a
registry on 127.0.0.1/localhost), `LayoutRegistry` is an OCI image-layout directory per repository
for the embedded sandbox.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import fnmatch
import hashlib
import io
import ipaddress
import json
import os
import posixpath
import re
import tarfile
import tempfile
import time
import zlib
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import dagster as dg
import requests
import urllib3
from pydantic import BaseModel, Field, PrivateAttr

from resources.errors import LockstepError
from resources.secrets import redact

if TYPE_CHECKING:
    from resources.site import SiteConfig

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

REF_NAME = "org.opencontainers.image.ref.name"  # the tag annotation in an OCI layout's index.json
IMAGE_MANIFESTS = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
INDEXES = frozenset({OCI_INDEX, DOCKER_LIST})
_ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST])

# distribution's own grammar (reference/regexp.go), so a name is refused here, not by the server.
_REPOSITORY_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^(?:sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")

MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # distribution refuses larger manifests too
MAX_CONFIG_BYTES = 64 * 1024 * 1024
MAX_SYMLINK_HOPS = 8
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1024 * 1024


class RegistryError(LockstepError):
    """The registry refused or failed a request; the message names the ref and the HTTP status."""


class TagMoved(RegistryError):
    """Compare-and-swap refused: the tag was not where the caller expected. Nothing was written."""


class PinnedTagTaken(RegistryError):
    """An immutable pinned tag (e.g. tpu-<sha>) already points at another digest. Nothing was written."""


def digest_of(data: bytes) -> str:
    """The OCI content digest (``sha256:<hex>``) of some bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(reference: str) -> bool:
    return bool(_DIGEST_RE.match(reference))


class ImageRef(BaseModel):
    """``host[:port]/name[:tag]`` or ``host[:port]/name@sha256:...``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        text = ref.strip()
        if "://" in text:
            raise RegistryError(f"image ref {ref!r} has a URL scheme: write host/name:tag, e.g. ghcr.io/org/image:tag")
        name, _, digest = text.partition("@")
        host, _, rest = name.partition("/")
        # Like docker: the first component is a host only if it has a '.' or ':' or is localhost.
        if not rest or not ("." in host or ":" in host or host == "localhost"):
            raise RegistryError(f"image ref {ref!r} names no registry host: write e.g. ghcr.io/org/image:tag")
        repository, tag = rest, None
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            repository, _, tag = rest.rpartition(":")
        _check_repository(repository)
        if tag is not None:
            _check_tag(tag)
        if digest:
            _check_digest(digest)
        return cls(registry=host, repository=repository, tag=tag, digest=digest or None)

    @property
    def reference(self) -> str:
        """The digest when there is one, else the tag ("latest" when the ref names neither, as docker does)."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


class Descriptor(BaseModel):
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = Field(default_factory=dict)


class Manifest(BaseModel):
    """One image manifest (never an index), with the exact bytes the registry holds."""

    digest: str
    media_type: str
    raw: bytes = Field(repr=False)
    config: Descriptor
    layers: list[Descriptor]


class FileRead(BaseModel):
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


class Registry(dg.ConfigurableResource):
    """The operations lockstep needs from a registry. Subclasses implement the five primitives."""

    immutable_tag_pattern: str = Field(
        default=r"^tpu-[0-9a-f]{7,40}$",
        description="Tags matching this are pinned: written once, never moved.",
    )

    # -- public operations ------------------------------------------------------------------------

    def resolve(self, *, repository: str, reference: str) -> str | None:
        """The digest a tag (or digest) points at — an index digest if it is an index — or None."""
        _check_repository(repository)
        _check_reference(reference)
        return self._head_manifest(repository, reference)

    def manifest(self, *, repository: str, reference: str, platform: str = "linux/amd64") -> Manifest | None:
        """The image manifest; an index is followed to the `platform` entry. None when absent."""
        _check_repository(repository)
        _check_reference(reference)
        found = self._get_manifest(repository, reference)
        # Nested indexes are legal but rare; a few hops cover an index of indexes.
        for _ in range(3):
            if found is None or found.media_type not in INDEXES:
                break
            child = _platform_entry(found, platform, self._where(repository, reference))
            found = self._get_manifest(repository, child)
            if found is None:
                raise RegistryError(
                    f"{self._where(repository, reference)} is an index whose {platform} entry {child} is "
                    "missing from the registry: push the platform manifest, or re-push the index"
                )
        if found is None:
            return None
        return _image_manifest(found, self._where(repository, reference))

    def config(self, *, repository: str, reference: str) -> dict:
        """The image config JSON (labels, env, history)."""
        image = self._require_manifest(repository, reference)
        data = self._read_blob(repository, image.config, limit=MAX_CONFIG_BYTES)
        try:
            config = json.loads(data)
        except ValueError as exc:
            raise RegistryError(f"{self._where(repository, image.config.digest)}: config is not JSON ({exc})") from None
        if not isinstance(config, dict):
            raise RegistryError(f"{self._where(repository, image.config.digest)}: config is not a JSON object")
        return config

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        """Point `tag` at `digest` by PUTting the exact manifest bytes (the digest never changes).

        A pinned tag (immutable_tag_pattern) that already points elsewhere raises PinnedTagTaken.
        """
        _check_repository(repository)
        _check_digest(digest)
        _check_tag(tag)
        stored = self._require_exact(repository, digest)
        self._put_manifest(repository, stored, tag, self._pinned_guard(repository, tag, digest))

    def move_tag(self, *, repository: str, tag: str, to_digest: str, expect_from: str | None) -> str | None:
        """Compare-and-swap: move `tag` to `to_digest` only if it is at `expect_from` now.

        `expect_from=None` means the tag must not exist yet. Reads, refuses with TagMoved, writes,
        re-reads and confirms. Returns the digest the tag was at before (the rollback target).
        """
        _check_repository(repository)
        _check_tag(tag)
        _check_digest(to_digest)
        if expect_from is not None:
            _check_digest(expect_from)
        before = self._head_manifest(repository, tag)
        self._refuse_unless_at(repository, tag, before, expect_from, to_digest)
        if before == to_digest:
            return before
        stored = self._require_exact(repository, to_digest)
        pinned = self._pinned_guard(repository, tag, to_digest)

        def guard(now: str | None) -> bool:
            self._refuse_unless_at(repository, tag, now, expect_from, to_digest)
            return pinned(now)

        self._put_manifest(repository, stored, tag, guard)
        after = self._head_manifest(repository, tag)
        if after != to_digest:
            raise TagMoved(
                f"{self._where(repository, tag)} was written to {to_digest} but now points at {after or 'nothing'}: "
                "another writer moved it right after this move; read the tag's history and decide again"
            )
        return before

    def read_file(self, *, repository: str, reference: str, path: str) -> FileRead | None:
        """Read `path` from the image, walking layers from the TOP down and stopping at the first layer
        that decides it (holds it, whites it out with ``.wh.NAME``, or hides its directory with
        ``.wh..wh..opq``). Streams blobs (gzip or plain tar). None when the path is absent.

        Symlinks (the path itself or a parent directory) are followed within the image, at most
        MAX_SYMLINK_HOPS times. A path that names a directory or a device is not a file: None.
        """
        image = self._require_manifest(repository, reference)
        walk = _LayerWalk(image.layers, _image_path(path))
        for _ in range(MAX_SYMLINK_HOPS + 1):
            verdict = self._walk_layers(repository, walk)
            if isinstance(verdict, _Found):
                layer = image.layers[verdict.layer_index]
                return FileRead(
                    path="/" + _image_path(path),
                    data=verdict.data,
                    layer_digest=layer.digest,
                    layer_index=verdict.layer_index,
                    bytes_read=walk.bytes_read,
                    image_bytes=sum(d.size for d in image.layers),
                )
            if isinstance(verdict, _Redirect):
                walk.restart(verdict.path)
                continue
            return None
        raise RegistryError(
            f"{self._where(repository, reference)}: /{_image_path(path)} goes through more than "
            f"{MAX_SYMLINK_HOPS} symlinks (a loop?); read the path the link finally names instead"
        )

    def glob(self, *, repository: str, reference: str, pattern: str) -> list[str]:
        """Image paths matching `pattern` (``*`` does not cross ``/``), from the TOP-most layer that
        holds any match, with upper-layer whiteouts honoured. Layers below that one are not read, so
        finding e.g. ``.../harbor-*.dist-info/METADATA`` costs the top layers, not the whole image.
        """
        image = self._require_manifest(repository, reference)
        want = _image_path(pattern)
        hides: list[str] = []  # whiteout names from the layers above
        for index in range(len(image.layers) - 1, -1, -1):
            layer = image.layers[index]
            found: list[str] = []
            names: list[str] = []
            with contextlib.closing(self._open_blob(repository, layer.digest)) as raw:
                with _open_tar(_Counted(raw), self._where(repository, layer.digest)) as tar:
                    for member in tar or []:
                        name = _member_path(member.name)
                        names.append(name)
                        if (member.isreg() or member.issym() or member.islnk()) and _glob_match(want, name) \
                                and not posixpath.basename(name).startswith(".wh.") \
                                and not any(_whiteout_hides(h, name) for h in hides):
                            found.append(name)
            if found:
                return sorted(set(found))
            hides += [n for n in names if posixpath.basename(n).startswith(".wh.")]
        return []

    def push_blob(self, *, repository: str, data: bytes, media_type: str) -> Descriptor:
        """Upload a blob (idempotent: an existing digest is not uploaded again)."""
        _check_repository(repository)
        digest = digest_of(data)
        self._put_blob(repository, digest, len(data), io.BytesIO(data))
        return Descriptor(media_type=media_type, digest=digest, size=len(data))

    def push_blob_file(self, *, repository: str, path: str | Path, media_type: str) -> Descriptor:
        """Upload a blob from a file, streamed (layers can be many GiB); idempotent like push_blob."""
        _check_repository(repository)
        digest, size = _hash_file(Path(path))
        with open(path, "rb") as body:
            self._put_blob(repository, digest, size, body)
        return Descriptor(media_type=media_type, digest=digest, size=size)

    def push_manifest(self, *, repository: str, raw: bytes, media_type: str, tag: str | None) -> str:
        """Upload a manifest by digest, and tag it when `tag` is given (subject to the pinned rule)."""
        _check_repository(repository)
        if tag is not None:
            _check_tag(tag)
        stored = RawManifest(raw=raw, media_type=media_type, digest=digest_of(raw))
        _check_manifest_bytes(stored, self._where(repository, stored.digest))
        self._put_manifest(repository, stored, None, None)
        if tag is not None:
            self._put_manifest(repository, stored, tag, self._pinned_guard(repository, tag, stored.digest))
        return stored.digest

    def open_blob(self, *, repository: str, digest: str) -> BinaryIO:
        """A stream of a blob's bytes (the caller closes it)."""
        _check_repository(repository)
        _check_digest(digest)
        return self._open_blob(repository, digest)

    # -- the five primitives a backend implements (everything above is built on them) ------------

    @abstractmethod
    def _head_manifest(self, repository: str, reference: str) -> str | None:
        """The digest stored under a tag or digest, or None."""

    @abstractmethod
    def _get_manifest(self, repository: str, reference: str) -> RawManifest | None:
        """The exact stored bytes of a manifest or index, or None."""

    @abstractmethod
    def _put_manifest(self, repository: str, stored: RawManifest, tag: str | None, guard: TagGuard | None) -> None:
        """Store `stored` by digest (tag None) or under `tag`, asking `guard` right before a tag write."""

    @abstractmethod
    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        """A stream of the blob's bytes; RegistryError when it is absent."""

    @abstractmethod
    def _put_blob(self, repository: str, digest: str, size: int, body: BinaryIO) -> None:
        """Store a blob whose digest the caller computed, unless it is already there."""

    # -- shared plumbing --------------------------------------------------------------------------

    @abstractmethod
    def _location(self) -> str:
        """The registry as a person names it in an error: host[:port] or the layout root."""

    def _where(self, repository: str, reference: str | None = None) -> str:
        base = f"{self._location()}/{repository}"
        if reference is None:
            return base
        return f"{base}@{reference}" if is_digest(reference) else f"{base}:{reference}"

    def _require_manifest(self, repository: str, reference: str) -> Manifest:
        image = self.manifest(repository=repository, reference=reference)
        if image is None:
            raise RegistryError(
                f"{self._where(repository, reference)}: no such image; check the tag or digest (was it pushed?)"
            )
        return image

    def _require_exact(self, repository: str, digest: str) -> RawManifest:
        stored = self._get_manifest(repository, digest)
        if stored is None:
            raise RegistryError(
                f"{self._where(repository, digest)}: no manifest with this digest in the repository; "
                "push it first (a tag can only point at a manifest the repository holds)"
            )
        return stored

    def _pinned_guard(self, repository: str, tag: str, digest: str) -> TagGuard:
        pinned = bool(re.search(self.immutable_tag_pattern, tag))

        def guard(now: str | None) -> bool:
            if pinned and now is not None and now != digest:
                raise PinnedTagTaken(
                    f"{self._where(repository, tag)} is a pinned tag and already points at {now}, not {digest}: "
                    "pinned tags are written once; build under a new tag (a new commit sha) instead"
                )
            return now != digest

        return guard

    def _refuse_unless_at(
        self, repository: str, tag: str, now: str | None, expect_from: str | None, to_digest: str
    ) -> None:
        if now == expect_from:
            return
        expected = expect_from or "nothing (a new tag)"
        raise TagMoved(
            f"{self._where(repository, tag)} points at {now or 'nothing'}, not at {expected}: someone else "
            f"moved it; nothing was written (wanted {to_digest}). Read the tag again and decide"
        )

    def _read_blob(self, repository: str, desc: Descriptor, *, limit: int) -> bytes:
        if desc.size > limit:
            raise RegistryError(f"{self._where(repository, desc.digest)}: blob is {desc.size} bytes, over {limit}")
        with contextlib.closing(self._open_blob(repository, desc.digest)) as stream:
            data = _read_up_to(stream, limit + 1)
        if len(data) > limit or digest_of(data) != desc.digest:
            raise RegistryError(
                f"{self._where(repository, desc.digest)}: the bytes served do not hash to the digest "
                f"(got {digest_of(data)}): the registry storage is corrupt or a proxy altered the blob"
            )
        return data

    def _walk_layers(self, repository: str, walk: _LayerWalk) -> _Verdict | None:
        """Top layer first; the first layer with a verdict on the path decides it."""
        for index in range(len(walk.layers) - 1, -1, -1):
            verdict = self._scan_blob(repository, walk, index, walk.target)
            if isinstance(verdict, _HardLink):
                # A tar hardlink names an earlier member of the same layer: read that member.
                verdict = self._scan_blob(repository, walk, index, verdict.path)
                if not isinstance(verdict, _Found):
                    raise RegistryError(
                        f"{self._where(repository, walk.layers[index].digest)}: /{walk.target} is a hardlink "
                        "to a member the layer does not hold as a regular file: the layer tar is malformed"
                    )
            if verdict is not None:
                return verdict
        return None

    def _scan_blob(self, repository: str, walk: _LayerWalk, index: int, target: str) -> _Verdict | None:
        layer = walk.layers[index]
        where = self._where(repository, layer.digest)
        with contextlib.closing(_Counted(self._open_blob(repository, layer.digest))) as counted:
            try:
                with _open_tar(counted, where) as tar:
                    return None if tar is None else _scan_tar(tar, target, walk.dirs_above, index)
            finally:
                walk.bytes_read += counted.count


# -- reading one path out of layer tars ----------------------------------------------------------


@dataclass
class _Found:
    data: bytes
    layer_index: int


@dataclass
class _Absent:
    """The layer hides or replaces the path (whiteout, opaque dir, a file where a dir should be)."""


@dataclass
class _Redirect:
    path: str  # the path a symlink leads to, relative to the image root


@dataclass
class _HardLink:
    path: str  # the member of the same layer that holds the data


_Verdict = _Found | _Absent | _Redirect | _HardLink


@dataclass
class _LayerWalk:
    layers: list[Descriptor]
    target: str
    bytes_read: int = 0
    # Parents of the target that an upper layer holds as directories: a symlink or file at that
    # name in a lower layer is replaced by the directory, so it cannot redirect the path.
    dirs_above: set[str] = field(default_factory=set)

    def restart(self, target: str) -> None:
        self.target = target
        self.dirs_above = set()


def _image_path(path: str) -> str:
    """'/etc/x', 'etc/x' and './etc/x' all name 'etc/x'; '..' cannot climb out of the root."""
    norm = posixpath.normpath("/" + path.strip()).lstrip("/")
    if norm in ("", "."):
        raise RegistryError(f"read_file path {path!r} names the image root, not a file")
    return norm


def _member_path(name: str) -> str:
    """Tar members may be './x', '/x' or 'x'; directories may end in '/'."""
    norm = posixpath.normpath("/" + name).lstrip("/")
    return "" if norm == "." else norm


def _link_target(link_dir: str, linkname: str) -> str:
    """Where a symlink in `link_dir` points, as an image path (absolute links start at the image root)."""
    joined = linkname if linkname.startswith("/") else f"{link_dir}/{linkname}"
    return posixpath.normpath("/" + joined).lstrip("/")


def _is_under(path: str, parent: str) -> bool:
    return parent == "" or path.startswith(parent + "/")


def _glob_match(pattern: str, path: str) -> bool:
    return path.count("/") == pattern.count("/") and fnmatch.fnmatchcase(path, pattern)


def _whiteout_hides(name: str, target: str) -> bool:
    parent, _, base = name.rpartition("/")
    if not base.startswith(".wh."):
        return False
    if base == ".wh..wh..opq":
        return _is_under(target, parent)
    hidden = f"{parent}/{base[4:]}" if parent else base[4:]
    return target == hidden or _is_under(target, hidden)


def _scan_tar(tar: tarfile.TarFile, target: str, dirs_above: set[str], index: int) -> _Verdict | None:
    """One pass over a layer; returns as soon as the layer decides the path (the rest is not read)."""
    hidden = False
    dirs_here: set[str] = set()
    for member in tar:
        name = _member_path(member.name)
        if name == target:
            return _verdict_at(tar, member, target, index)
        if name and _is_under(target, name):  # a parent directory of the target
            if member.isdir():
                dirs_here.add(name)
            elif member.issym() and name not in dirs_above:
                through = _link_target(posixpath.dirname(name), member.linkname)
                return _Redirect(_member_path(f"{through}/{target[len(name) + 1:]}"))
            else:
                return _Absent()
        elif _whiteout_hides(name, target):
            # A whiteout hides lower layers only; this layer may still hold the path itself.
            hidden = True
    dirs_above |= dirs_here
    return _Absent() if hidden else None


def _verdict_at(tar: tarfile.TarFile, member: tarfile.TarInfo, target: str, index: int) -> _Verdict:
    if member.isreg():
        extracted = tar.extractfile(member)
        assert extracted is not None
        return _Found(extracted.read(), index)
    if member.issym():
        return _Redirect(_link_target(posixpath.dirname(target), member.linkname))
    if member.islnk():
        return _HardLink(_member_path(member.linkname))
    return _Absent()  # a directory, device or fifo is not a file to read


class _Counted(io.RawIOBase):
    """Counts the bytes pulled out of a blob stream, before any decompression."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._inner.close()
        super().close()


_TAR_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)


@contextlib.contextmanager
def _open_tar(raw: io.RawIOBase, where: str) -> Iterator[tarfile.TarFile | None]:
    """A streaming tar reader (None for an empty blob); gzip or plain is told by the first bytes,
    not by the media type, which builders get wrong."""
    buffered = io.BufferedReader(raw, buffer_size=64 * 1024)
    magic = buffered.peek(4)[:4]
    if not magic:
        yield None
        return
    if magic.startswith(_ZSTD_MAGIC):
        raise RegistryError(f"{where}: layer is zstd-compressed; lockstep reads gzip or plain tar layers")
    mode = "r|gz" if magic.startswith(_GZIP_MAGIC) else "r|"
    try:
        tar = tarfile.open(fileobj=buffered, mode=mode)
    except _TAR_ERRORS as exc:
        raise RegistryError(f"{where}: layer is neither a gzip nor a plain tar stream ({exc})") from None
    try:
        yield tar
    except _TAR_ERRORS as exc:
        raise RegistryError(f"{where}: layer tar is truncated or corrupt ({exc})") from None
    finally:
        tar.close()


# -- manifests -------------------------------------------------------------------------------------


def _sniff_media_type(raw: bytes) -> str | None:
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


def _check_manifest_bytes(stored: RawManifest, where: str) -> dict:
    try:
        doc = json.loads(stored.raw)
    except ValueError as exc:
        raise RegistryError(f"{where}: manifest is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"{where}: manifest is not a JSON object")
    declared = doc.get("mediaType")
    if declared and declared != stored.media_type:
        raise RegistryError(
            f"{where}: manifest says mediaType {declared} but is pushed as {stored.media_type}: push it as {declared}"
        )
    if len(stored.raw) > MAX_MANIFEST_BYTES:
        raise RegistryError(f"{where}: manifest is {len(stored.raw)} bytes, over {MAX_MANIFEST_BYTES}")
    return doc


def _descriptor(entry: dict) -> Descriptor:
    return Descriptor(
        media_type=entry.get("mediaType", ""),
        digest=entry["digest"],
        size=int(entry.get("size", 0)),
        annotations=entry.get("annotations") or {},
    )


def _image_manifest(stored: RawManifest, where: str) -> Manifest:
    if stored.media_type not in IMAGE_MANIFESTS:
        raise RegistryError(
            f"{where}: manifest has media type {stored.media_type}; lockstep reads OCI or Docker v2 image manifests"
        )
    doc = json.loads(stored.raw)
    try:
        return Manifest(
            digest=stored.digest,
            media_type=stored.media_type,
            raw=stored.raw,
            config=_descriptor(doc["config"]),
            layers=[_descriptor(layer) for layer in doc.get("layers", [])],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistryError(f"{where}: image manifest is malformed ({exc!r})") from None


def _platform_entry(index: RawManifest, platform: str, where: str) -> str:
    """The digest of the index entry for `platform` ("os/arch" or "os/arch/variant")."""
    want = platform.split("/")
    if len(want) not in (2, 3):
        raise RegistryError(f"platform {platform!r} is not os/arch or os/arch/variant (e.g. linux/amd64)")
    seen = []
    for entry in json.loads(index.raw).get("manifests", []):
        p = entry.get("platform") or {}
        have = [p.get("os", ""), p.get("architecture", ""), p.get("variant", "")]
        seen.append("/".join(x for x in have if x))
        if have[:2] == want[:2] and (len(want) == 2 or have[2] == want[2]):
            return entry["digest"]
    raise RegistryError(
        f"{where} is an index without a {platform} image (it has: {', '.join(seen) or 'no entries'}): "
        "build for that platform or ask for one of those"
    )


# -- validation ------------------------------------------------------------------------------------


def _check_repository(repository: str) -> None:
    if not _REPOSITORY_RE.match(repository):
        raise RegistryError(
            f"repository {repository!r} is not a valid name: lowercase letters, digits and . _ - "
            "separated by '/', e.g. open-thoughts/openthoughts-agent"
        )


def _check_tag(tag: str) -> None:
    if not _TAG_RE.match(tag):
        raise RegistryError(
            f"tag {tag!r} is not a valid tag: up to 128 letters, digits, '_', '.', '-', not starting with '.' or '-'"
        )


def _check_digest(digest: str) -> None:
    if not is_digest(digest):
        raise RegistryError(f"{digest!r} is not a digest: expected sha256:<64 hex>")


def _check_reference(reference: str) -> None:
    if not is_digest(reference):
        _check_tag(reference)


def _read_up_to(stream: BinaryIO, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = stream.read(min(_CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _hash_file(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def _media_type_of(content_type: str | None, raw: bytes) -> str | None:
    media_type = (content_type or "").split(";")[0].strip()
    if media_type in IMAGE_MANIFESTS or media_type in INDEXES:
        return media_type
    return _sniff_media_type(raw)


# -- HTTP ------------------------------------------------------------------------------------------


class _ResponseStream(io.RawIOBase):
    """A streamed HTTP body; closing it drops the connection instead of draining the rest."""

    def __init__(self, resp: requests.Response, where: str) -> None:
        self._resp = resp
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._resp.raw.readinto(buffer)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # The request timeout also bounds every read of the body.
            raise RegistryError(
                f"GET {self._where}: the download broke off ({exc.__class__.__name__}): run again; if it "
                "keeps happening, check the network to the registry or raise timeout_s"
            ) from None

    def close(self) -> None:
        self._resp.close()
        super().close()


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="..",service="..",scope=".."`` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'([A-Za-z]+)="([^"]*)"', rest)}
    return scheme.lower(), params


def _is_loopback(host: str) -> bool:
    name = urlsplit("//" + host).hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


_STATUS_HINTS = {
    400: "the registry refused the request as invalid; if it names a blob, push the blobs first",
    401: "the registry wants credentials: set token_env to the NAME of an env var holding a token, and export it",
    403: "the credentials lack permission: the token needs read:packages (write:packages to push)",
    404: "not found: check the repository and the tag or digest",
    405: "the registry does not allow this operation (deletes or pushes disabled?)",
    429: "rate limited: wait and run again",
}


class HttpRegistry(Registry):
    """The OCI distribution API over HTTP(S)."""

    host: str = Field(description="host[:port], e.g. ghcr.io or 127.0.0.1:5000")
    username: str | None = None
    token_env: str | None = Field(default=None, description="NAME of the env var holding the token/password")
    token: str | None = Field(
        default=None,
        description="The token itself, as a dg.EnvVar of token_env when wired in Definitions; unset: read "
        "$token_env when the registry asks for a login.",
    )
    timeout_s: float = 60.0

    _session: requests.Session | None = PrivateAttr(default=None)
    # Authorization header per repository, from the last answered challenge (never logged or shown).
    _auth: dict[str, str] = PrivateAttr(default_factory=dict)
    _bearers: set[str] = PrivateAttr(default_factory=set)

    @property
    def base_url(self) -> str:
        """Plain HTTP for a registry on this machine (127.0.0.1, localhost, [::1]), HTTPS otherwise."""
        if "://" in self.host or "/" in self.host:
            raise RegistryError(f"registry host {self.host!r} must be host[:port] only, e.g. ghcr.io or 127.0.0.1:5000")
        scheme = "http" if _is_loopback(self.host) else "https"
        return f"{scheme}://{self.host}"

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # -- primitives -------------------------------------------------------------------------------

    def _head_manifest(self, repository: str, reference: str) -> str | None:
        resp = self._send("HEAD", repository, f"/manifests/{reference}", reference, headers={"Accept": _ACCEPT})
        if resp.status_code == 404:
            return None
        self._expect(resp, (200,), "HEAD", repository, reference)
        if digest := resp.headers.get("Docker-Content-Digest"):
            return digest
        # Some registries omit the header: the digest is then the hash of the body itself.
        stored = self._get_manifest(repository, reference)
        return stored.digest if stored else None

    def _get_manifest(self, repository: str, reference: str) -> RawManifest | None:
        where = self._where(repository, reference)
        resp = self._send("GET", repository, f"/manifests/{reference}", reference,
                          headers={"Accept": _ACCEPT}, stream=True)
        with contextlib.closing(resp):
            if resp.status_code == 404:
                return None
            self._expect(resp, (200,), "GET", repository, reference)
            raw = _read_up_to(_ResponseStream(resp, where), MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise RegistryError(f"GET {where}: manifest is over {MAX_MANIFEST_BYTES} bytes; not reading it")
        digest = digest_of(raw)
        claimed = resp.headers.get("Docker-Content-Digest", "")
        if (is_digest(reference) and reference != digest) or (claimed.startswith("sha256:") and claimed != digest):
            raise RegistryError(
                f"GET {where}: the manifest bytes hash to {digest}, not {claimed or reference}: "
                "a proxy altered them or the registry is corrupt"
            )
        media_type = _media_type_of(resp.headers.get("Content-Type"), raw)
        if media_type is None:
            raise RegistryError(f"GET {where}: the registry served something that is not an image manifest or index")
        return RawManifest(raw=raw, media_type=media_type, digest=digest)

    def _put_manifest(self, repository: str, stored: RawManifest, tag: str | None, guard: TagGuard | None) -> None:
        if tag is not None and guard is not None and not guard(self._head_manifest(repository, tag)):
            return
        reference = tag or stored.digest
        resp = self._send("PUT", repository, f"/manifests/{reference}", reference,
                          headers={"Content-Type": stored.media_type}, data=stored.raw)
        self._expect(resp, (201, 200), "PUT", repository, reference)
        answered = resp.headers.get("Docker-Content-Digest")
        if answered and answered != stored.digest:
            raise RegistryError(
                f"PUT {self._where(repository, reference)}: the registry stored digest {answered}, not "
                f"{stored.digest}: it re-serialised the manifest; this registry cannot keep digests stable"
            )

    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        # identity: count and hash the bytes the registry stores, never a transport re-encoding.
        resp = self._send("GET", repository, f"/blobs/{digest}", digest,
                          headers={"Accept-Encoding": "identity"}, stream=True)
        if resp.status_code != 200:
            with contextlib.closing(resp):
                self._expect(resp, (200,), "GET", repository, digest,
                             hint="the blob is not in this repository: push it here (blobs are per repository)")
        # A small buffer: read_file counts what it pulls, and the count should be close to the wire's.
        stream = _ResponseStream(resp, self._where(repository, digest))
        return io.BufferedReader(stream, buffer_size=64 * 1024)  # type: ignore[return-value]

    def _put_blob(self, repository: str, digest: str, size: int, body: BinaryIO) -> None:
        head = self._send("HEAD", repository, f"/blobs/{digest}", digest)
        if head.status_code == 200:
            return
        if head.status_code != 404:
            self._expect(head, (200,), "HEAD", repository, digest)
        # Monolithic upload: POST opens an upload session, one PUT carries the bytes and the digest.
        start = self._send("POST", repository, "/blobs/uploads/", None)
        self._expect(start, (202,), "POST", repository, None, hint="could not start a blob upload")
        location = start.headers.get("Location")
        if not location:
            raise RegistryError(f"POST {self._where(repository)}/blobs/uploads/: HTTP 202 without a Location header")
        url = _with_query(urljoin(self.base_url + "/", location), digest=digest)
        put = self._send("PUT", repository, url, digest, data=body,
                         headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        self._expect(put, (201, 204), "PUT", repository, digest, hint="the blob upload was refused")

    def _location(self) -> str:
        return self.host

    def _redact(self, text: str) -> str:
        """Every message built from a registry's answer passes here: no token, ever."""
        return redact(text, self._secrets())

    # -- requests, auth and errors ----------------------------------------------------------------

    def _http(self) -> requests.Session:
        if self._session is None:
            session = requests.Session()
            # A registry on this machine must not go through a proxy (or pick up ~/.netrc).
            session.trust_env = not _is_loopback(self.host)
            self._session = session
        return self._session

    def _token(self) -> str:
        return self.token or (os.environ.get(self.token_env, "") if self.token_env else "")

    def _secrets(self) -> list[str]:
        values = [t] if (t := self._token()) else []
        if values:
            values.append(base64.b64encode(f"{self._user()}:{values[0]}".encode()).decode())
        return [*values, *self._bearers]

    def _user(self) -> str:
        return self.username or "lockstep"

    def _send(
        self,
        method: str,
        repository: str,
        path_or_url: str,
        reference: str | None,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | BinaryIO | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One request with a timeout; a 401 challenge is answered once and the request retried."""
        url = path_or_url if "://" in path_or_url else f"{self.base_url}/v2/{repository}{path_or_url}"
        where = self._where(repository, reference)
        sent = dict(headers or {})
        same_host = urlsplit(url).netloc.lower() == self.host.lower()
        for attempt in (1, 2):
            # An upload Location on another host (object storage) never gets the registry's token.
            if same_host and (auth := self._auth.get(repository)):
                sent["Authorization"] = auth
            if hasattr(data, "seek"):
                data.seek(0)  # type: ignore[union-attr]
            resp = self._request(method, url, where, headers=sent, data=data, stream=stream)
            if resp.status_code != 401 or attempt == 2:
                return resp
            if not self._answer_challenge(resp, repository, where):
                return resp
            resp.close()
        raise AssertionError("unreachable")

    def _request(self, method: str, url: str, where: str, **kwargs: Any) -> requests.Response:
        try:
            return self._http().request(method, url, timeout=self.timeout_s, **kwargs)
        except requests.Timeout:
            raise RegistryError(
                f"{method} {where}: no answer from {self.host} within {self.timeout_s:g} s: "
                "check the registry is up, or raise timeout_s"
            ) from None
        except requests.RequestException as exc:
            reason = self._redact(str(exc.__class__.__name__))
            raise RegistryError(
                f"{method} {where}: cannot reach {self.host} ({reason}): check the host in the site "
                "file and that the registry is running and reachable from here"
            ) from None

    def _answer_challenge(self, resp: requests.Response, repository: str, where: str) -> bool:
        """Turn a 401's WWW-Authenticate into an Authorization header for `repository`."""
        scheme, params = _parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        creds = self._credentials(where)
        if scheme == "basic" and creds:
            self._auth[repository] = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            return True
        if scheme != "bearer" or not params.get("realm"):
            return False
        token = self._fetch_bearer(params, creds, where)
        self._bearers.add(token)
        self._auth[repository] = f"Bearer {token}"
        return True

    def _credentials(self, where: str) -> tuple[str, str] | None:
        if not self.token_env and not self.token:
            return None
        value = self._token()
        if not value:
            raise RegistryError(
                f"{where}: the registry wants a login and token_env names ${self.token_env}, which is unset "
                f"or empty here: export {self.token_env} with a registry token"
            )
        return self._user(), value

    def _fetch_bearer(self, params: dict[str, str], creds: tuple[str, str] | None, where: str) -> str:
        """The docker token flow: GET the realm (with basic auth when we have a token) for a bearer."""
        realm = params["realm"]
        parts = urlsplit(realm)
        if creds and not (parts.scheme == "https" or (parts.scheme == "http" and _is_loopback(parts.netloc))):
            raise RegistryError(
                f"{where}: the registry sent its token endpoint as {realm}; lockstep sends a token only over "
                "HTTPS (or to this machine): check the registry host"
            )
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        resp = self._request("GET", realm, where, params=query, auth=creds)
        with contextlib.closing(resp):
            if resp.status_code != 200:
                who = f"the token in ${self.token_env}" if creds else "an anonymous request"
                raise RegistryError(self._redact(
                    f"GET {where}: HTTP 401 from the registry, and its token endpoint {parts.netloc} refused "
                    f"{who} (HTTP {resp.status_code}): check ${self.token_env or 'token_env'} holds a valid, "
                    "unexpired token with read:packages (write:packages to push)"
                ))
            try:
                body = resp.json()
                token = body.get("token") or body.get("access_token")
            except (ValueError, AttributeError):
                token = None
        if not token or not isinstance(token, str):
            raise RegistryError(f"GET {where}: the token endpoint {parts.netloc} answered without a token")
        return token

    def _expect(
        self,
        resp: requests.Response,
        ok: tuple[int, ...],
        method: str,
        repository: str,
        reference: str | None,
        *,
        hint: str | None = None,
    ) -> None:
        if resp.status_code in ok:
            return
        detail = _error_detail(resp) if method != "HEAD" else ""
        if resp.status_code == 401 and self.token_env:
            hint = (f"the registry refused the token in ${self.token_env}: check it is valid, unexpired and "
                    "has read:packages (write:packages to push)")
        if hint is None:
            status = resp.status_code
            hint = _STATUS_HINTS.get(status, "the registry failed: run again later" if status >= 500 else
                                     "unexpected answer from the registry")
        raise RegistryError(self._redact(
            f"{method} {self._where(repository, reference)}: HTTP {resp.status_code} {resp.reason}{detail}: {hint}"
        ))


def _error_detail(resp: requests.Response) -> str:
    """The registry's own error codes and messages (the distribution API's JSON errors), short."""
    try:
        body = resp.json()
        errors = body.get("errors") or []
        text = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError, requests.RequestException):
        return ""
    return f" ({text[:300]})" if text else ""


def _with_query(url: str, **params: str) -> str:
    """Add query parameters to an upload Location, which may already carry its own (_state=...)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


# -- OCI image layout ------------------------------------------------------------------------------


class LayoutRegistry(Registry):
    """An OCI image layout directory per repository under `root` (the sandbox registry)."""

    root: str
    lock_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait for another writer's index.json lock.")

    # -- primitives -------------------------------------------------------------------------------

    def _head_manifest(self, repository: str, reference: str) -> str | None:
        if is_digest(reference):
            stored = self._get_manifest(repository, reference)
            return stored.digest if stored else None
        entry = _tag_entry(self._read_index(self._repo(repository)), reference)
        return entry["digest"] if entry else None

    def _get_manifest(self, repository: str, reference: str) -> RawManifest | None:
        repo = self._repo(repository)
        index = self._read_index(repo)
        if is_digest(reference):
            digest, entry = reference, next((m for m in index["manifests"] if m.get("digest") == reference), None)
        else:
            entry = _tag_entry(index, reference)
            if entry is None:
                return None
            digest = entry["digest"]
        blob = _blob_path(repo, digest)
        # Like a registry, only a manifest is found by digest here, never a layer or config blob.
        if not blob.is_file() or blob.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        raw = blob.read_bytes()
        if digest_of(raw) != digest:
            raise RegistryError(f"{blob}: the file does not hash to its name: the layout is corrupt")
        media_type = (entry or {}).get("mediaType") or _sniff_media_type(raw)
        if media_type is None:
            return None
        return RawManifest(raw=raw, media_type=media_type, digest=digest)

    def _put_manifest(self, repository: str, stored: RawManifest, tag: str | None, guard: TagGuard | None) -> None:
        repo = self._repo(repository)
        if tag is None:
            self._check_references(repo, stored)
            self._write_blob(repo, stored.digest, io.BytesIO(stored.raw))
            return
        with self._index_lock(repo):
            index = self._read_index(repo)
            current = _tag_entry(index, tag)
            if guard is not None and not guard(current["digest"] if current else None):
                return
            others = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) != tag]
            entry = {"mediaType": stored.media_type, "digest": stored.digest, "size": len(stored.raw),
                     "annotations": {REF_NAME: tag}}
            self._write_index(repo, {**index, "manifests": [*others, entry]})

    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        path = _blob_path(self._repo(repository), digest)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise RegistryError(
                f"{self._where(repository, digest)}: blob not in the layout ({path} is missing): push it first"
            ) from None

    def _put_blob(self, repository: str, digest: str, size: int, body: BinaryIO) -> None:
        self._write_blob(self._repo(repository), digest, body)

    def _location(self) -> str:
        return self.root

    # -- the layout on disk -----------------------------------------------------------------------

    def _repo(self, repository: str) -> Path:
        _check_repository(repository)
        return Path(self.root).expanduser() / repository

    def _read_index(self, repo: Path) -> dict:
        path = repo / "index.json"
        try:
            index = json.loads(path.read_text())
        except FileNotFoundError:
            return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        except ValueError as exc:
            raise RegistryError(
                f"{path}: not JSON ({exc}); restore it from the blobs or remove the repository"
            ) from None
        if not isinstance(index, dict) or not isinstance(index.get("manifests", []), list):
            raise RegistryError(f"{path}: not an OCI image index (no manifests list)")
        index.setdefault("manifests", [])
        return index

    def _write_index(self, repo: Path, index: dict) -> None:
        """Atomic: readers see the old index.json or the new one, never half of one."""
        _atomic_write(repo / "index.json", (json.dumps(index, indent=2) + "\n").encode())

    @contextlib.contextmanager
    def _index_lock(self, repo: Path) -> Iterator[None]:
        """An exclusive flock on index.json.lock: read-check-write under it is a real compare-and-swap."""
        self._ensure_layout(repo)
        with open(repo / "index.json.lock", "a") as lock:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RegistryError(
                            f"{repo}/index.json.lock: another writer held it for over {self.lock_timeout_s:g} s; "
                            "check for a stuck lockstep process"
                        ) from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _ensure_layout(self, repo: Path) -> None:
        (repo / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        marker = repo / "oci-layout"
        if not marker.exists():
            _atomic_write(marker, b'{"imageLayoutVersion": "1.0.0"}\n')

    def _write_blob(self, repo: Path, digest: str, body: BinaryIO) -> None:
        """Stream into a temp file next to the blob, check the digest, rename into place."""
        path = _blob_path(repo, digest)
        if path.is_file():
            return
        self._ensure_layout(repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        algorithm = digest.split(":", 1)[0]
        h = hashlib.new(algorithm)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := body.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            if f"{algorithm}:{h.hexdigest()}" != digest:
                raise RegistryError(f"{repo}: the uploaded bytes hash to {algorithm}:{h.hexdigest()}, "
                                    f"not {digest}; nothing was stored")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _check_references(self, repo: Path, stored: RawManifest) -> None:
        """Refuse a manifest whose blobs are missing, as a registry does: no dangling images."""
        doc = _check_manifest_bytes(stored, f"{repo}@{stored.digest}")
        refs = [doc.get("config", {})] + doc.get("layers", []) + doc.get("manifests", [])
        for ref in refs:
            digest = ref.get("digest") if isinstance(ref, dict) else None
            if digest and (not is_digest(digest) or not _blob_path(repo, digest).is_file()):
                raise RegistryError(
                    f"{repo}: manifest {stored.digest} references {digest}, which the layout does not hold: "
                    "push the blobs (and platform manifests) first"
                )


def _tag_entry(index: dict, tag: str) -> dict | None:
    found = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) == tag]
    return found[-1] if found else None


def _blob_path(repo: Path, digest: str) -> Path:
    _check_digest(digest)  # also keeps the path inside blobs/
    algorithm, _, hexpart = digest.partition(":")
    return repo / "blobs" / algorithm / hexpart


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# -- choosing a backend from the site file ---------------------------------------------------------


def registry_for(site: SiteConfig, *, env_vars: bool = False) -> Registry:
    """The registry a site file names: ``[registry] kind = "layout"`` is a directory (relative to the
    site file), ``kind = "http"`` is the host of ``[tpu].image`` with the site's user and token env var.

    `env_vars`: the token as ``dg.EnvVar`` (for Definitions, so the UI shows the variable's name and
    Dagster resolves it per run); otherwise it is read from the environment when first needed.
    """
    section = site.registry
    if section.kind == "layout":
        return LayoutRegistry(root=str(site.resolve_path(section.layout_dir)))
    token = dg.EnvVar(section.token_env) if env_vars and section.token_env else None
    return HttpRegistry(
        host=ImageRef.parse(site.tpu.image).registry, username=section.username, token_env=section.token_env,
        token=token,
    )
