"""What a Spark node call returns and how it fails: the errors and the result records."""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Literal

from pydantic import Field

from resources.errors import LockstepError
from resources.model import Model

# ---- errors --------------------------------------------------------------------------------------


class SparkError(LockstepError):
    """A node could not be reached, refused us, or a command on it failed.

    Renders as ``spark node NODE (WHERE): what happened; what to do`` where WHERE is
    ``user@host:port`` for an ssh node and ``local:<root>`` for a local one.
    """

    def __init__(self, message: str, *, node: str | None = None, where: str | None = None) -> None:
        self.node = node
        self.where = where
        self.message = message
        head = (
            f"spark node {node} ({where}): "
            if node and where
            else f"spark node {node}: "
            if node
            else ""
        )
        super().__init__(head + message)


class HostKeyRefused(SparkError):
    """The node's host key is unknown or differs from known_hosts; nothing was run."""


class Unreachable(SparkError):
    """The node did not answer, or the connection kept dropping before a command could start."""


class ConnectionLost(SparkError):
    """The connection dropped while a command ran; it may or may not have finished on the node."""


class PipeFailed(SparkError):
    """`pipe` finished with a failed producer or destination; `result` says what each side did."""

    def __init__(self, message: str, *, node: str, where: str, result: PipeResult) -> None:
        super().__init__(message, node=node, where=where)
        self.result = result


# ---- results -------------------------------------------------------------------------------------


def _short(argv: list[str], limit: int = 80) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RunResult(Model):
    """One command run to its end on a node."""

    node: str
    where: str = Field(description="user@host:port, or local:<root>.")
    argv: list[str] = Field(description="The command as run (secret values masked).")
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def silent(self) -> bool:
        """Exited with no output at all, on stdout or stderr."""
        return not self.stdout and not self.stderr

    def text(self) -> str:
        """stdout as text (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    def describe(self) -> str:
        """One line: node, command, exit code and whether there was output.

        A non-zero exit with no output says so in those words ("exit 120 with no output"): that is
        the shape of a dead output pipe in a launcher,
        not of a failing child (runbook: Bench pipe pump).
        """
        head = f"{self.node}: `{_short(self.argv)}`"
        if self.silent:
            line = f"{head} exit {self.exit_code} with no output"
            if self.exit_code == 120:
                line += (
                    " (a launcher child dying with 120 and no output points at a dead output "
                    "pipe pump, not the child)"
                )
            return line
        return (
            f"{head} exit {self.exit_code}, {len(self.stdout)} bytes stdout, "
            f"{len(self.stderr)} bytes stderr"
        )

    def __str__(self) -> str:
        return self.describe()

    def check(self) -> RunResult:
        """This result when the command exited 0; otherwise a SparkError with its stderr's tail."""
        if self.ok:
            return self
        tail = (self.stderr or self.stdout)[-2000:].decode("utf-8", "replace").strip()
        raise SparkError(
            self.describe() + (f"\n{tail}" if tail else ""), node=self.node, where=self.where
        )


class DetachedHandle(Model):
    """A command started with `start_detached`: what `poll` and `tail` need to follow it."""

    node: str
    pid: int
    log: str = Field(description="Remote path of the combined stdout+stderr.")
    exit_file: str = Field(
        description="Remote path the exit code is written to when the command ends."
    )
    started_at: datetime
    tag: str = Field(
        description=(
            "A token in the detached shell's command line: tells our pid from a recycled one."
        )
    )


class DetachedState(Model):
    """What a detached command is doing now: from its pid and exit file, never from its log."""

    state: Literal["running", "exited", "vanished"]
    exit_code: int | None = None


class PutResult(Model):
    """A tree copied with `put_tree` and verified file by file."""

    node: str
    remote_dir: str
    files: int
    bytes: int = Field(description="Total size of the regular files.")
    sha256: str = Field(
        description=(
            "sha256 of the manifest (path, kind, content sha256, size, exec bit), same on both "
            "sides."
        )
    )
    duration_s: float


class PipeEnd(Model):
    """One side of a `pipe`: a node, what it was sent (or produced), how it exited."""

    node: str
    exit_code: int | None = Field(
        description="None when it never exited (timed out, connection lost)."
    )
    bytes: int
    sha256: str = Field(description="sha256 of exactly the bytes sent to (or read from) it.")
    stdout: bytes = Field(
        default=b"", description="The tail of its stdout (e.g. `docker load`'s 'Loaded image')."
    )
    stderr: bytes = Field(default=b"", description="The tail of its stderr.")
    error: str | None = Field(
        default=None, description="What went wrong on our side of the stream, if anything."
    )

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None


class PipeResult(Model):
    """One producer's stdout streamed into every destination's stdin."""

    src: PipeEnd
    dsts: list[PipeEnd]
    duration_s: float

    @property
    def ok(self) -> bool:
        return (
            self.src.ok
            and self.src.bytes > 0
            and all(d.ok and d.bytes == self.src.bytes for d in self.dsts)
        )
