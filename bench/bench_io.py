"""What the benchmarks share: an incompressible byte stream made as it is read."""

from __future__ import annotations

import io
import os


class RandomBytes(io.RawIOBase):
    """`size` incompressible bytes, generated as they are read (a GiB never sits in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = os.urandom(n)
        self.left -= n
        return n
