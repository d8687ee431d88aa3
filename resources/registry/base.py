"""The abstract Registry: lockstep's operations on an image registry, built on five primitives.

A backend (http.py: the distribution API; layout.py: an OCI image-layout directory) implements the
primitives; everything a caller uses is here, so both backends behave the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from abc import abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import dagster as dg
from pydantic import Field

from resources.model import Model
from resources.registry.cache import BlobCache
from resources.registry.refs import (
    INDEXES,
    MAX_CONFIG_BYTES,
    Descriptor,
    FileRead,
    Manifest,
    PinnedTagTaken,
    RawManifest,
    RegistryError,
    TagGuard,
    TagMoved,
    check_digest,
    check_manifest_bytes,
    check_reference,
    check_repository,
    check_tag,
    digest_of,
    hash_file,
    image_manifest,
    is_digest,
    platform_entry,
    read_up_to,
)

# The layer walker loads when an image is first scanned, not with every process that loads a
# location (docs/PERFORMANCE.md, code-location load).
if TYPE_CHECKING:
    from resources.registry.layers import GlobQuery, LayerSource


class ImageScan(Model):
    """What one walk over an image's layers found: the files asked for, the glob matches (and their
    files when asked), and what the walk cost."""

    files: dict[str, FileRead | None]  # by image path without the leading '/'
    matches: dict[str, list[str]]  # by glob pattern (an image path)
    bytes_read: int  # compressed bytes pulled from the registry (not the blob cache)
    image_bytes: int
    # layer index -> opens, cache or registry
    layers_opened: dict[int, int] = Field(default_factory=dict)
    registry_opens: dict[int, int] = Field(default_factory=dict)  # layer index -> blob GETs started

    def file(self, path: str) -> FileRead | None:
        """The file at `path` (None when the image has
        none); it must have been asked for or matched."""
        from resources.registry.layers import image_path

        key = image_path(path)
        if key not in self.files:
            raise KeyError(
                f"/{key} was not part of this scan: ask for it in paths= (or a glob with read=True)"
            )
        return self.files[key]

    def glob(self, pattern: str) -> list[str]:
        """The matches of a glob that was part of this scan."""
        from resources.registry.layers import image_path

        key = image_path(pattern)
        if key not in self.matches:
            raise KeyError(f"{pattern!r} was not part of this scan: ask for it in globs=")
        return self.matches[key]


class PushCheck(Model):
    """Whether lockstep may push to a repository, proven without writing an image: a blob upload
    opened and cancelled (HTTP), or the layout directory
    found writable (layout). A value, not an exception:
    a refusal is an answer a caller reports (lockstep preflight), not a failure of the call."""

    repository: str
    allowed: bool
    proof: str = Field(
        description="What was tried, in words (e.g. the upload opened and cancelled)."
    )
    refusal: str = Field(
        default="", description="Why not and what to do; never a secret value. Empty when allowed."
    )
    cancelled: bool = Field(
        default=True,
        description=(
            "HTTP: the upload session opened was cancelled (else it expires on the registry)."
        ),
    )


class Registry(dg.ConfigurableResource):
    """The operations lockstep needs from a registry. Subclasses implement the five primitives."""

    immutable_tag_pattern: str = Field(
        default=r"^tpu-[0-9a-f]{7,40}$",
        description="Tags matching this are pinned: written once, never moved.",
    )

    # -- public operations ------------------------------------------------------------------------

    def resolve(self, *, repository: str, reference: str) -> str | None:
        """The digest a tag (or digest) points at — an index digest if it is an index — or None."""
        check_repository(repository)
        check_reference(reference)
        return self._head_manifest(repository, reference)

    def manifest(
        self, *, repository: str, reference: str, platform: str = "linux/amd64"
    ) -> Manifest | None:
        """The image manifest; an index is followed to the `platform` entry. None when absent."""
        check_repository(repository)
        check_reference(reference)
        found = self._get_manifest(repository, reference)
        # Nested indexes are legal but rare; a few hops cover an index of indexes.
        for _ in range(3):
            if found is None or found.media_type not in INDEXES:
                break
            child = platform_entry(found, platform, self._where(repository, reference))
            found = self._get_manifest(repository, child)
            if found is None:
                raise RegistryError(
                    f"{self._where(repository, reference)} is an index whose {platform} entry "
                    f"{child} is "
                    "missing from the registry: push the platform manifest, or re-push the index"
                )
        if found is None:
            return None
        return image_manifest(found, self._where(repository, reference))

    def config(self, *, repository: str, reference: str) -> dict:
        """The image config JSON (labels, env, history)."""
        image = self._require_manifest(repository, reference)
        data = self._read_blob(repository, image.config, limit=MAX_CONFIG_BYTES)
        try:
            config = json.loads(data)
        except ValueError as exc:
            raise RegistryError(
                f"{self._where(repository, image.config.digest)}: config is not JSON ({exc})"
            ) from None
        if not isinstance(config, dict):
            raise RegistryError(
                f"{self._where(repository, image.config.digest)}: config is not a JSON object"
            )
        return config

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        """Point `tag` at `digest` by PUTting the exact manifest bytes (the digest never changes).

        A pinned tag (immutable_tag_pattern) that already points elsewhere raises PinnedTagTaken.
        """
        check_repository(repository)
        check_digest(digest)
        check_tag(tag)
        stored = self._require_exact(repository, digest)
        self._put_manifest(repository, stored, tag, self._pinned_guard(repository, tag, digest))

    def move_tag(
        self, *, repository: str, tag: str, to_digest: str, expect_from: str | None
    ) -> str | None:
        """Compare-and-swap: move `tag` to `to_digest` only if it is at `expect_from` now.

        `expect_from=None` means the tag must not exist yet. Reads, refuses with TagMoved, writes,
        re-reads and confirms. Returns the digest the tag was at before (the rollback target).
        """
        check_repository(repository)
        check_tag(tag)
        check_digest(to_digest)
        if expect_from is not None:
            check_digest(expect_from)
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
                f"{self._where(repository, tag)} was written to {to_digest} but now points at "
                f"{after or 'nothing'}: "
                "another writer moved it right after this move; read the tag's history and "
                "decide again"
            )
        return before

    def scan(
        self,
        *,
        repository: str,
        reference: str,
        paths: Iterable[str] = (),
        globs: Iterable[GlobQuery] = (),
        read_whole_layers: bool = False,
    ) -> ImageScan:
        """Answer many reads and globs in ONE walk over the layers from the top down, each layer
        blob opened once (a symlink or hardlink to a member already passed may read a layer again,
        from the blob cache when it has it), stopping as soon as every query is decided.

        Paths have read_file's semantics, globs glob's (with `read=True` their matches are read
        too). `read_whole_layers`: read each opened layer to its end (checked against its digest,
        and so stored in the blob cache) even where the scan could stop early; for an image that
        will be read again soon, such as a verification that is repeated.
        """
        from resources.registry.layers import GlobQuery, image_path, scan_layers

        image = self._require_manifest(repository, reference)
        wanted = [image_path(p) for p in paths]
        queries = [
            GlobQuery(pattern=image_path(g.pattern), read=g.read, siblings=g.siblings)
            for g in globs
        ]
        found = scan_layers(
            image.layers,
            lambda index: self._layer_source(repository, image.layers[index]),
            paths=wanted,
            globs=queries,
            where_image=self._where(repository, reference),
            where_blob=lambda digest: self._where(repository, digest),
            read_whole_layers=read_whole_layers,
        )
        image_bytes = sum(d.size for d in image.layers)
        files = {
            key: None
            if hit is None
            else FileRead(
                path="/" + key,
                data=hit.data,
                layer_digest=image.layers[hit.layer_index].digest,
                layer_index=hit.layer_index,
                bytes_read=found.bytes_read,
                image_bytes=image_bytes,
            )
            for key, hit in found.files.items()
        }
        return ImageScan(
            files=files,
            matches=found.matches,
            bytes_read=found.bytes_read,
            image_bytes=image_bytes,
            layers_opened=found.opened,
            registry_opens=found.remote_opens,
        )

    def read_file(self, *, repository: str, reference: str, path: str) -> FileRead | None:
        """Read `path` from the image, walking layers from the TOP down and stopping at the first
        layer that decides it (holds it, whites it out with ``.wh.NAME``, or hides its directory
        with ``.wh..wh..opq``). Streams blobs (gzip,
        zstd or plain tar). None when the path is absent.

        Symlinks (the path itself or a parent directory) are followed within the image, at most
        MAX_SYMLINK_HOPS times. A path that names a directory or a device is not a file: None.
        Every layer passed on the way down is read to its end and checked against its digest.
        """
        return self.scan(repository=repository, reference=reference, paths=[path]).file(path)

    def glob(self, *, repository: str, reference: str, pattern: str) -> list[str]:
        """Image paths matching `pattern` (``*`` does not cross ``/``), from the TOP-most layer that
        holds any match, with upper-layer whiteouts honoured. Layers below that one are not read, so
        finding e.g. ``.../harbor-*.dist-info/METADATA`` costs the top layers, not the whole image.
        """
        from resources.registry.layers import GlobQuery

        return self.scan(
            repository=repository, reference=reference, globs=[GlobQuery(pattern=pattern)]
        ).glob(pattern)

    def absence(self, *, repository: str, reference: str) -> str:
        """Why `reference` is not there, in words for an error message ("absent" when nothing more
        can be said). For a registry with logins a 404 may also mean the token cannot read it."""
        check_repository(repository)
        check_reference(reference)
        return self._absence(repository, reference)

    def push_blob(self, *, repository: str, data: bytes, media_type: str) -> Descriptor:
        """Upload a blob (idempotent: an existing digest is not uploaded again)."""
        check_repository(repository)
        digest = digest_of(data)
        self._put_blob(repository, digest, len(data), io.BytesIO(data))
        return Descriptor(media_type=media_type, digest=digest, size=len(data))

    def push_blob_file(self, *, repository: str, path: str | Path, media_type: str) -> Descriptor:
        """Upload a blob from a file, streamed (layers
        can be many GiB); idempotent like push_blob."""
        check_repository(repository)
        digest, size = hash_file(Path(path))
        with open(path, "rb") as body:
            self._put_blob(repository, digest, size, body)
        return Descriptor(media_type=media_type, digest=digest, size=size)

    def push_manifest(
        self, *, repository: str, raw: bytes, media_type: str, tag: str | None
    ) -> str:
        """Upload a manifest by digest, and tag it when
        `tag` is given (subject to the pinned rule)."""
        check_repository(repository)
        if tag is not None:
            check_tag(tag)
        stored = RawManifest(raw=raw, media_type=media_type, digest=digest_of(raw))
        check_manifest_bytes(stored, self._where(repository, stored.digest))
        self._put_manifest(repository, stored, None, None)
        if tag is not None:
            self._put_manifest(
                repository, stored, tag, self._pinned_guard(repository, tag, stored.digest)
            )
        return stored.digest

    def stored(self, *, repository: str, reference: str) -> RawManifest | None:
        """The exact stored bytes of a manifest or index (an index is not followed), or None."""
        check_repository(repository)
        check_reference(reference)
        return self._get_manifest(repository, reference)

    def read_blob(self, *, repository: str, descriptor: Descriptor, limit: int) -> bytes:
        """A small blob's bytes, checked against its digest; RegistryError over `limit` bytes."""
        check_repository(repository)
        check_digest(descriptor.digest)
        return self._read_blob(repository, descriptor, limit=limit)

    def referrers(
        self, *, repository: str, digest: str, artifact_type: str
    ) -> list[Descriptor] | None:
        """The manifests whose `subject` is `digest` and
        whose artifactType is `artifact_type` (OCI 1.1
        referrers API); None when the registry has no
        referrers API (then cosign's tag scheme holds)."""
        check_repository(repository)
        check_digest(digest)
        found = self._referrers(repository, digest, artifact_type)
        # The filter is optional for a registry (OCI-Filters-Applied): applied here whatever it did.
        return None if found is None else [d for d in found if d.artifact_type == artifact_type]

    def can_push(self, *, repository: str) -> PushCheck:
        """Whether this registry lets lockstep push to `repository`, proven without writing anything
        that stays: an HTTP registry opens a blob upload (``POST /v2/<repository>/blobs/uploads/``,
        with the token exchanged for ``pull,push``) and cancels it
        (``DELETE`` on its Location); a layout directory
        must exist or be creatable, and be writable. A
        bad repository name still raises RegistryError."""
        check_repository(repository)
        return self._probe_push(repository)

    def open_blob(self, *, repository: str, digest: str) -> BinaryIO:
        """A stream of a blob's bytes (the caller closes it)."""
        check_repository(repository)
        check_digest(digest)
        return self._open_blob(repository, digest)

    # -- the five primitives a backend implements (everything above is built on them) ------------

    @abstractmethod
    def _head_manifest(self, repository: str, reference: str) -> str | None:
        """The digest stored under a tag or digest, or None."""

    @abstractmethod
    def _get_manifest(self, repository: str, reference: str) -> RawManifest | None:
        """The exact stored bytes of a manifest or index, or None."""

    @abstractmethod
    def _put_manifest(
        self, repository: str, stored: RawManifest, tag: str | None, guard: TagGuard | None
    ) -> None:
        """Store `stored` by digest (tag None) or under
        `tag`, asking `guard` right before a tag write."""

    @abstractmethod
    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        """A stream of the blob's bytes; RegistryError when it is absent."""

    @abstractmethod
    def _put_blob(self, repository: str, digest: str, size: int, body: BinaryIO) -> None:
        """Store a blob whose digest the caller computed, unless it is already there."""

    @abstractmethod
    def _probe_push(self, repository: str) -> PushCheck:
        """`can_push` for this backend: every refusal
        (and every error on the way) as a PushCheck."""

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
                f"{self._where(repository, reference)}: no such image "
                f"({self._absence(repository, reference)}); "
                "check the tag or digest (was it pushed?)"
            )
        return image

    def _require_exact(self, repository: str, digest: str) -> RawManifest:
        stored = self._get_manifest(repository, digest)
        if stored is None:
            raise RegistryError(
                f"{self._where(repository, digest)}: no manifest with this digest in the "
                "repository "
                f"({self._absence(repository, digest)}); push it first (a tag can only point at "
                "a manifest the repository holds)"
            )
        return stored

    def _pinned_guard(self, repository: str, tag: str, digest: str) -> TagGuard:
        pinned = bool(re.search(self.immutable_tag_pattern, tag))

        def guard(now: str | None) -> bool:
            if pinned and now is not None and now != digest:
                raise PinnedTagTaken(
                    f"{self._where(repository, tag)} is a pinned tag and already points at "
                    f"{now}, not {digest}: "
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
            f"{self._where(repository, tag)} points at {now or 'nothing'}, not at {expected}: "
            "someone else "
            f"moved it; nothing was written (wanted {to_digest}). Read the tag again and decide"
        )

    def _read_blob(self, repository: str, desc: Descriptor, *, limit: int) -> bytes:
        if desc.size > limit:
            raise RegistryError(
                f"{self._where(repository, desc.digest)}: blob is {desc.size} bytes, over {limit}"
            )
        with contextlib.closing(self._open_blob(repository, desc.digest)) as stream:
            data = read_up_to(stream, limit + 1)
        if len(data) > limit or digest_of(data) != desc.digest:
            raise RegistryError(
                f"{self._where(repository, desc.digest)}: the bytes served do not hash to the "
                "digest "
                f"(got {digest_of(data)}): the registry storage is corrupt or a proxy altered "
                "the blob"
            )
        return data

    def _referrers(
        self, repository: str, digest: str, artifact_type: str
    ) -> list[Descriptor] | None:
        """The referrers API's answer; None: this backend has none (an image layout directory)."""
        return None

    def _absence(self, repository: str, reference: str) -> str:
        return "absent"

    def _blob_cache(self) -> BlobCache | None:
        """Where layers read to their end are kept for
        the next scan; None: no cache (a local layout)."""
        return None

    def _layer_source(self, repository: str, layer: Descriptor) -> LayerSource:
        from resources.registry.layers import LayerSource

        cache = self._blob_cache()
        if cache is not None and (hit := cache.open(layer.digest)) is not None:
            return LayerSource(
                stream=hit,
                remote=False,
                on_corrupt=lambda: cache.evict(layer.digest),
                note=f" (the copy in the blob cache {cache.root}, now removed: run again)",
            )
        stream = self._open_blob(repository, layer.digest)
        if cache is None or not cache.fits(layer.size):
            return LayerSource(stream=stream, remote=True)
        fill = cache.filling(layer.digest, stream)
        return LayerSource(stream=fill, remote=True, on_verified=getattr(fill, "commit", None))
