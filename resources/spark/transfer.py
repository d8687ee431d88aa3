"""Moving bytes through streams: drains, per-destination
feeders, the tar sink, the tree manifest."""

from __future__ import annotations

import hashlib
import io
import json
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resources.spark.results import PipeResult
from resources.spark.transports import _CHUNK, _Closed, _Stream

# Chunks queued per destination of a pipe: a slow destination holds the producer back (backpressure)
# once this many are waiting, so at most _QUEUE_CHUNKS
# * _WINDOW bytes sit in memory per destination.
_QUEUE_CHUNKS = 8
# What we keep of a stream that is only read for a message (a destination's stderr, say).
_TAIL = 64 * 1024

# ---- helpers on streams --------------------------------------------------------------------------


class _Drain(threading.Thread):
    """Reads one output of a stream to its end into a buffer (the last `keep` bytes, if given)."""

    def __init__(self, read: Callable[[int], bytes], *, keep: int | None = None) -> None:
        super().__init__(daemon=True)
        self.read_fn = read
        self.keep = keep
        self.data = bytearray()
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while True:
            try:
                chunk = self.read_fn(_CHUNK)
            except TimeoutError:
                if self.stop.is_set():
                    return
                continue
            except Exception:  # noqa: BLE001
                # the stream went away under us: what we have is all there is
                return
            if not chunk:
                return
            self.data += chunk
            if self.keep is not None and len(self.data) > 2 * self.keep:
                del self.data[: -self.keep]

    def result(self, timeout_s: float | None = None) -> bytes:
        self.join(timeout_s)
        self.stop.set()
        return bytes(self.data[-self.keep :] if self.keep is not None else self.data)


class _Feeder(threading.Thread):
    """Writes queued chunks to one destination's stdin, counting what it sent.

    Each chunk comes with the stream's running sha256 after it (hashed once, by the reader): the
    digest kept for a destination is the one after the last chunk it took in full, i.e. the sha256
    of exactly the bytes it was sent. After a failure it keeps taking (and dropping) chunks, so the
    producer is never blocked by a destination that is already gone."""

    def __init__(self, stream: _Stream) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.queue: queue.Queue[tuple[bytes, Any] | None] = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self.sha: Any = hashlib.sha256()
        self.sent = 0
        self.error: str | None = None
        self._finished = False
        self.start()

    def run(self) -> None:
        while (item := self.queue.get()) is not None:
            chunk, digest_after = item
            if self.error is not None:
                continue
            try:
                self.stream.write(chunk)
            except _Closed:
                self.error = "it stopped reading its stdin (exited or the connection closed)"
            except TimeoutError:
                self.error = "it stopped accepting data (write timed out)"
                self.stream.abort()
            except Exception as exc:  # noqa: BLE001  # paramiko: a dead transport, a failed re-key
                self.error = f"writing to it failed: {exc or type(exc).__name__}"
                self.stream.abort()
            else:
                self.sha = digest_after
                self.sent += len(chunk)
        self.stream.close_stdin()

    def finish(self) -> None:
        """No more chunks: close its stdin once everything queued is written."""
        if not self._finished:
            self._finished = True
            self.queue.put(None)


# ---- the manifest both sides compute -------------------------------------------------------------

# Run as-is by `python3 -c` on the node and exec'd here, so both sides list a tree the same way.
# One JSON line per entry, sorted by path: [path, "file", sha256, size, owner-exec] /
# [path, "link", target] / [path, "dir"] / [path, "other"].
_MANIFEST_PY = r"""
import hashlib, json, os, stat, sys

def manifest(root):
    entries = []
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                entries.append([rel, "link", os.readlink(path)])
            elif stat.S_ISDIR(st.st_mode):
                entries.append([rel, "dir"])
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                entries.append([rel, "file", digest.hexdigest(), st.st_size, bool(st.st_mode & 0o100)])
            else:
                entries.append([rel, "other"])
    entries.sort(key=lambda e: e[0])
    return [json.dumps(e) for e in entries]

if __name__ == "__main__":
    sys.stdout.write("".join(line + "\n" for line in manifest(sys.argv[1])))
"""  # noqa: E501


def local_manifest(root: Path) -> list[str]:
    """The manifest lines of a local tree (the same code the node runs)."""
    namespace: dict[str, Any] = {"__name__": "lockstep_manifest"}
    # our own constant source
    exec(compile(_MANIFEST_PY, "<lockstep manifest>", "exec"), namespace)  # noqa: S102
    return namespace["manifest"](str(root))


def _first_difference(local: list[str], remote: list[str]) -> str | None:
    """The first path (in sorted order) whose entry differs, described; None when identical."""
    mine = {json.loads(line)[0]: json.loads(line) for line in local}
    theirs = {json.loads(line)[0]: json.loads(line) for line in remote}
    for path in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(path), theirs.get(path)
        if a == b:
            continue
        if b is None:
            return f"{path}: missing on the node"
        if a is None:
            return (
                f"{path}: on the node but not in the local tree (put into an empty directory, "
                "e.g. one per rev)"
            )
        if a[1] != b[1]:
            return f"{path}: a {a[1]} here, a {b[1]} on the node"
        if a[1] == "file" and a[2:4] != b[2:4]:
            return (
                f"{path}: content differs (here {a[3]} bytes sha256 {a[2][:12]}, node {b[3]} "
                f"bytes sha256 {b[2][:12]})"
            )
        if a[1] == "file":
            return f"{path}: executable bit differs (here {a[4]}, node {b[4]})"
        if a[1] == "link":
            return f"{path}: symlink target differs (here {a[2]!r}, node {b[2]!r})"
        return f"{path}: differs"
    return None


class _TarSink(io.RawIOBase):
    """A write-only file object for tarfile that sends to a stream in large writes."""

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.buffer += data
        if len(self.buffer) >= _CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buffer:
            self.stream.write(bytes(self.buffer))
            self.total += len(self.buffer)
            self.buffer.clear()


def _pipe_failure(
    result: PipeResult, src_where: str, dst_where: dict[str, str]
) -> tuple[str, str, str]:
    def tail(data: bytes) -> str:
        text = data.decode("utf-8", "replace").strip()[-1000:]
        return f": {text}" if text else ""

    src = result.src
    bad = [d for d in result.dsts if not d.ok or d.bytes != src.bytes]
    others = "; ".join(
        f"{d.node} exit {d.exit_code}"
        + (f" ({d.error})" if d.error else "")
        + f" after {d.bytes} bytes"
        for d in bad
    )
    if not src.ok:
        what = src.error or f"exit {src.exit_code}"
        return (
            src.node,
            src_where,
            (
                (
                    f"the producer on {src.node} failed: {what} after {src.bytes} "
                    f"bytes{tail(src.stderr)}"
                )
                + (f"; destinations: {others}" if others else "")
            ),
        )
    if src.bytes == 0:
        return (
            src.node,
            src_where,
            (
                f"the producer on {src.node} exit {src.exit_code} with no output — nothing was "
                "sent; "
                f"a silent empty stream is a failure, not an empty image{tail(src.stderr)}"
            ),
        )
    first = bad[0]
    detail = first.error or f"exit {first.exit_code}"
    if first.ok and first.bytes != src.bytes:
        detail = f"got {first.bytes} of {src.bytes} bytes"
    return (
        first.node,
        dst_where[first.node],
        (
            (
                f"destination {first.node} failed: {detail} (exit "
                f"{first.exit_code}){tail(first.stderr or first.stdout)}"
            )
            + (f"; all failed destinations: {others}" if len(bad) > 1 else "")
            + "; the others "
            f"({', '.join(d.node for d in result.dsts if d not in bad) or 'none'}) got all "
            f"{src.bytes} bytes"
        ),
    )
