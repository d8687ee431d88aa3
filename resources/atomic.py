"""Every file lockstep writes goes through here: all of it or none of it, and a clear error if not.

A full disk (ENOSPC), a quota (EDQUOT), a file-size limit (EFBIG) or a read-only mount while a
profile, a lock, a report or an index is written would otherwise leave half a file behind (which
a later run reads, commits or pushes) and end in a bare ``OSError: [Errno 28]`` traceback. Here
the bytes go to a temp file in the same directory (so the rename cannot cross filesystems), are
fsynced, and replace the destination in one `os.replace`; on any failure the temp file is removed,
the destination keeps its old content (or stays absent), and WriteFailed names the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from resources.errors import LockstepError

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class WriteFailed(LockstepError):
    """A file could not be written; the destination was left as it was before."""

    def __init__(self, path: Path, exc: OSError) -> None:
        self.path = path
        self.errno = exc.errno
        code = errno.errorcode.get(exc.errno or 0, "")
        what = exc.strerror or str(exc) or type(exc).__name__
        if exc.errno in _NO_SPACE:
            hint = "free space on that disk (or raise its quota or file-size limit) and run again"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            hint = "make that directory writable for the user lockstep runs as, and run again"
        else:
            hint = "check that disk and run again"
        super().__init__(
            f"cannot write {path}: {what}{f' ({code})' if code else ''}; {hint}. "
            f"{path.name} was left as it was before"
        )


class _Output:
    """The temp file as the block sees it: a failed
    write names the destination, not the temp file."""

    def __init__(self, path: Path, raw: BinaryIO) -> None:
        self._path = path
        self._raw = raw

    def write(self, data: bytes | bytearray | memoryview) -> int:
        try:
            return self._raw.write(data)
        except OSError as exc:
            raise WriteFailed(self._path, exc) from None


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[_Output]:
    """A binary file that becomes `path` when the block ends without an exception.

    An exception inside the block (a failed check, a broken source) discards the temp file and
    propagates as it is; an OSError from writing, syncing
    or renaming becomes WriteFailed naming `path`.
    """
    path = Path(path)
    tmp, fd = _create_temp(path)
    try:
        raw = os.fdopen(fd, "wb")
        try:
            yield _Output(path, raw)
            try:
                raw.flush()
                os.fsync(raw.fileno())
            except OSError as exc:
                raise WriteFailed(path, exc) from None
        finally:
            # a flush that fails again here: WriteFailed is raised already
            with contextlib.suppress(OSError):
                raw.close()
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise WriteFailed(path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _sync_dir(path.parent)


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """`path` holds `data` (str: as UTF-8) or, on WriteFailed, exactly what it held before."""
    with atomic_output(path) as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)


def _create_temp(path: Path) -> tuple[Path, int]:
    """An empty temp file beside `path` and its
    descriptor, with the mode `path` has (a new file: 0666
    less the umask, as open() gives; mkstemp's 0600
    would hide a checked-out file from the group)."""
    while True:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteFailed(path, exc) from None
        with contextlib.suppress(OSError):  # FileNotFoundError: a new file keeps the umask's mode
            os.fchmod(fd, stat.S_IMODE(path.stat().st_mode))
        return tmp, fd


def _sync_dir(directory: Path) -> None:
    # The rename itself is durable only once the directory is synced; a failure here loses nothing.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
