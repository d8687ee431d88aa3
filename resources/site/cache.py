"""Validated site files kept per path while the files they were read from are unchanged.

Every sensor tick loads the site, and parsing and validating it cost more than the `ls-remote` the
tick is for; the file is nearly always the same as on the last tick.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Generic, TypeVar

Config = TypeVar("Config")
Stamp = tuple[int, int, int, int, int]


def stamp_of(path: Path) -> Stamp | None:
    """What any write, replacement or rename-over of the file changes (None: no file there).

    ctime is in it because a copy can carry an old mtime (`cp -p`, tar, rsync -t) onto a recycled
    inode at the same size; nobody can set ctime.
    """
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class SiteCache(Generic[Config]):
    """Site configs by path, each kept with the stamps of the files its load read (the site file and
    its trusted key files), so an edit of any of them is read on the next load.

    A file that changed within `SETTLED_NS` of being read is not kept: file times tick in steps (a
    jiffy; two seconds on FAT), and a second write inside the step of the first could leave every
    stamp as it was. Past that, a later write gets a later time. Only a file that loaded is kept, so
    a broken edit is read again, and its error raised, on every load until it is fixed.
    """

    SETTLED_NS = 2_000_000_000
    SIZE = 16

    def __init__(self) -> None:
        # path -> (the key files it names, the stamps of the site file and of each, the config)
        self._entries: dict[str, tuple[list[Path], tuple[Stamp | None, ...], Config]] = {}

    def get(self, path: Path, stamp: Stamp) -> Config | None:
        """The config read from `path` when it had `stamp`, if its key files are unchanged too."""
        entry = self._entries.get(os.path.abspath(path))
        if entry is None or entry[1][0] != stamp:
            return None
        deps, stamps, config = entry
        return config if tuple(stamp_of(p) for p in deps) == stamps[1:] else None

    def put(
        self, path: Path, stamp: Stamp, config: Config, started_ns: int, deps: list[Path]
    ) -> None:
        """Keep `config`, read from `path` (which had `stamp`) by a load that started at
        `started_ns`; `deps` are the other files that load read (the trusted key files)."""
        stamps = (stamp, *(stamp_of(p) for p in deps))
        newest = max(t for s in stamps if s is not None for t in s[3:])
        if newest >= started_ns - self.SETTLED_NS:
            return
        key = os.path.abspath(path)
        self._entries.pop(key, None)
        if len(self._entries) >= self.SIZE:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = (deps, stamps, config)
