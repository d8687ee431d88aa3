"""A bounded on-disk cache of layer blobs, keyed by digest, so a second look at an image is local.

The image checks (tpu/image) and the re-verification (tpu/verified_image) read the same layers;
with this cache the second reads them from disk. Only a blob read to its end and checked against
its digest and size is stored (the scan calls `commit`), by an atomic rename, so a reader never
sees half a blob and two processes filling the same digest both end with one good file. The size
bound is kept by evicting the least recently used blobs (a hit touches the file's mtime).

Hand-written rather than diskcache: that stores values in SQLite pages and has no streaming
writes, and a GiB layer must be streamed through while it is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from resources.registry.refs import check_digest

# A temp file older than this belongs to a process that died mid-download.
_STALE_TEMP_S = 3600.0


def default_cache_dir() -> Path:
    """$LOCKSTEP_CACHE/blobs, else ~/.cache/lockstep/blobs (beside the git mirror cache)."""
    if env := os.environ.get("LOCKSTEP_CACHE"):
        return Path(env) / "blobs"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lockstep" / "blobs"


class BlobCache:
    """Blobs under `root/<algorithm>/<hex>`, at most `max_bytes` in all."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def fits(self, size: int) -> bool:
        return 0 < size <= self.max_bytes

    def open(self, digest: str) -> BinaryIO | None:
        """The cached blob, or None. A hit counts as a use for the LRU order."""
        path = self._path(digest)
        try:
            stream = open(path, "rb")  # noqa: SIM115  # the caller reads and closes it
        except OSError:  # not cached, or a cache we cannot read: the registry still can
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return stream

    def evict(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(digest).unlink()

    def filling(self, digest: str, stream: BinaryIO) -> BinaryIO:
        """`stream`, teed into a temp file that becomes
        the cached blob on `commit()`; `stream` itself
        when the cache cannot be written (a read-only home):
        a disk problem costs the cache, not the read."""
        try:
            self._tmp_dir().mkdir(parents=True, exist_ok=True)
            return CacheFill(self, digest, stream)  # type: ignore[return-value]
        except OSError:
            return stream

    def _path(self, digest: str) -> Path:
        check_digest(digest)  # also keeps the path inside the cache
        algorithm, _, hexpart = digest.partition(":")
        return self.root / algorithm / hexpart

    def _tmp_dir(self) -> Path:
        return self.root / "tmp"

    def _store(self, tmp: Path, digest: str) -> None:
        path = self._path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)  # another process may have stored the same digest: same bytes
        self._evict_over_bound(keep=path)

    def _evict_over_bound(self, *, keep: Path) -> None:
        """Oldest first until the cache fits its bound; one process at a time (a lock file)."""
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                blobs: list[tuple[float, int, Path]] = []
                for algorithm in ("sha256", "sha512"):
                    for path in (self.root / algorithm).glob("*"):
                        with contextlib.suppress(FileNotFoundError):
                            st = path.stat()
                            blobs.append((st.st_mtime, st.st_size, path))
                total = sum(size for _, size, _ in blobs)
                for _, size, path in sorted(blobs):
                    if total <= self.max_bytes:
                        break
                    if path != keep:
                        # An open reader keeps its file: unlinking never breaks a scan in progress.
                        with contextlib.suppress(FileNotFoundError):
                            path.unlink()
                        total -= size
                now = time.time()
                for tmp in self._tmp_dir().glob("*"):
                    with contextlib.suppress(FileNotFoundError):
                        if now - tmp.stat().st_mtime > _STALE_TEMP_S:
                            tmp.unlink()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class CacheFill:
    """A read-through tee: every byte read from the inner stream is written to a temp file."""

    def __init__(self, cache: BlobCache, digest: str, inner: BinaryIO) -> None:
        self._cache = cache
        self._digest = digest
        self._inner = inner
        fd, tmp = tempfile.mkstemp(dir=cache._tmp_dir(), prefix=digest.replace(":", "-") + ".")
        self._tmp = Path(tmp)
        self._out: Any = os.fdopen(fd, "wb")
        self._failed = False  # a disk problem only costs the cache, never the read

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size)
        if data and not self._failed:
            try:
                self._out.write(data)
            except OSError:
                self._failed = True
        return data

    def commit(self) -> None:
        """The scan read the blob to its end and it matched its digest and size: keep it."""
        if self._failed or self._out.closed:
            return
        try:
            self._out.close()
            self._cache._store(self._tmp, self._digest)
        except OSError:
            self._failed = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._out.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()  # gone already when committed
        self._inner.close()
