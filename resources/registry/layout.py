"""LayoutRegistry: an OCI image-layout directory per repository (the embedded sandbox's registry).

Tags live in each repository's index.json (the ref.name annotation); writes take an flock on
index.json.lock so a tag move is a real compare-and-swap; blobs are written to a temp file and
renamed into place once their digest checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pydantic import Field

from resources.atomic import atomic_output, write_atomic
from resources.registry.base import PushCheck, Registry
from resources.registry.refs import (
    CHUNK,
    MAX_MANIFEST_BYTES,
    OCI_INDEX,
    REF_NAME,
    RawManifest,
    RegistryError,
    TagGuard,
    check_digest,
    check_manifest_bytes,
    check_repository,
    digest_of,
    is_digest,
    sniff_media_type,
)


class LayoutRegistry(Registry):
    """An OCI image layout directory per repository under `root` (the sandbox registry)."""

    root: str
    lock_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest wait for another writer's index.json lock."
    )

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
            digest, entry = (
                reference,
                next((m for m in index["manifests"] if m.get("digest") == reference), None),
            )
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
            raise RegistryError(
                f"{blob}: the file does not hash to its name: the layout is corrupt"
            )
        media_type = (entry or {}).get("mediaType") or sniff_media_type(raw)
        if media_type is None:
            return None
        return RawManifest(raw=raw, media_type=media_type, digest=digest)

    def _put_manifest(
        self, repository: str, stored: RawManifest, tag: str | None, guard: TagGuard | None
    ) -> None:
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
            others = [
                m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) != tag
            ]
            entry = {
                "mediaType": stored.media_type,
                "digest": stored.digest,
                "size": len(stored.raw),
                "annotations": {REF_NAME: tag},
            }
            self._write_index(repo, {**index, "manifests": [*others, entry]})

    def _open_blob(self, repository: str, digest: str) -> BinaryIO:
        path = _blob_path(self._repo(repository), digest)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise RegistryError(
                f"{self._where(repository, digest)}: blob not in the layout ({path} is missing): "
                "push it first"
            ) from None

    def _put_blob(self, repository: str, digest: str, size: int, body: BinaryIO) -> None:
        self._write_blob(self._repo(repository), digest, body)

    def _probe_push(self, repository: str) -> PushCheck:
        """The repository's layout directory is writable,
        or the nearest directory that exists above it is
        (so it can be created there). Nothing is created:
        the answer comes from the directories as they are."""
        repo = self._repo(repository)
        proof = f"{repo}: the image layout a push writes into"
        existing = repo
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        blobs = repo / "blobs" / "sha256"
        # What a push writes into: the blobs directory and index.json's directory when they exist,
        # else where they would be made.
        targets = [p for p in (blobs, repo) if p.exists()] or [existing]
        for target in targets:
            if not target.is_dir():
                return PushCheck(
                    repository=repository,
                    allowed=False,
                    proof=proof,
                    refusal=(
                        f"{target} is not a directory, so {repo} cannot be "
                        f"{'written' if target == repo else 'created'}: "
                        "point [registry] layout_dir at a directory (relative paths are relative "
                        "to the site file)"
                    ),
                )
            if not os.access(target, os.W_OK | os.X_OK):
                return PushCheck(
                    repository=repository,
                    allowed=False,
                    proof=proof,
                    refusal=(
                        f"{target} is not writable by this user (or is on a read-only file "
                        f"system), so a push to {repo} "
                        "would fail: give this user write access there, or point [registry] "
                        "layout_dir elsewhere"
                    ),
                )
        how = (
            "exists and is writable"
            if repo.exists()
            else f"can be created ({existing} is a writable directory)"
        )
        return PushCheck(repository=repository, allowed=True, proof=f"{repo} {how}")

    def _location(self) -> str:
        return self.root

    # -- the layout on disk -----------------------------------------------------------------------

    def _repo(self, repository: str) -> Path:
        check_repository(repository)
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
        write_atomic(repo / "index.json", (json.dumps(index, indent=2) + "\n").encode())

    @contextlib.contextmanager
    def _index_lock(self, repo: Path) -> Iterator[None]:
        """An exclusive flock on index.json.lock:
        read-check-write under it is a real compare-and-swap."""
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
                            f"{repo}/index.json.lock: another writer held it for over "
                            f"{self.lock_timeout_s:g} s; "
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
            write_atomic(marker, b'{"imageLayoutVersion": "1.0.0"}\n')

    def _write_blob(self, repo: Path, digest: str, body: BinaryIO) -> None:
        """Stream into a temp file next to the blob, check the digest, rename into place."""
        path = _blob_path(repo, digest)
        if path.is_file():
            return
        self._ensure_layout(repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        algorithm = digest.split(":", 1)[0]
        h = hashlib.new(algorithm)
        with atomic_output(path) as out:
            while chunk := body.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
            if f"{algorithm}:{h.hexdigest()}" != digest:
                raise RegistryError(
                    f"{repo}: the uploaded bytes hash to {algorithm}:{h.hexdigest()}, "
                    f"not {digest}; nothing was stored"
                )

    def _check_references(self, repo: Path, stored: RawManifest) -> None:
        """Refuse a manifest whose blobs are missing, as a registry does: no dangling images."""
        doc = check_manifest_bytes(stored, f"{repo}@{stored.digest}")
        refs = [doc.get("config", {})] + doc.get("layers", []) + doc.get("manifests", [])
        for ref in refs:
            digest = ref.get("digest") if isinstance(ref, dict) else None
            if digest and (not is_digest(digest) or not _blob_path(repo, digest).is_file()):
                raise RegistryError(
                    f"{repo}: manifest {stored.digest} references {digest}, which the layout "
                    "does not hold: "
                    "push the blobs (and platform manifests) first"
                )


def _tag_entry(index: dict, tag: str) -> dict | None:
    found = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) == tag]
    return found[-1] if found else None


def _blob_path(repo: Path, digest: str) -> Path:
    check_digest(digest)  # also keeps the path inside blobs/
    algorithm, _, hexpart = digest.partition(":")
    return repo / "blobs" / algorithm / hexpart
