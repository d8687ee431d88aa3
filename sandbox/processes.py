"""What runs on this machine, read from /proc: the sandbox's teardown finds its engines and git
daemons by the command lines they were started with, and waits for them by PID."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def command_lines() -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every process this user may read."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            raw = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(proc.name), raw.decode(errors="replace").rstrip("\0").split("\0")


def alive(pid: int) -> bool:
    """Running, and not a zombie. A child of this process that exited is reaped here."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
