"""SparkNodes: the DGX Spark node inventory and how commands reach it.

Two transports behind one internal interface (`_Transport` opens a `_Stream`: one running command
with its stdin, stdout, stderr and exit code):

- ``ssh``: paramiko. Host keys are checked against the site's known_hosts with a `RejectPolicy`
  (never auto-added); key auth from ``key_path``, its passphrase read from the environment variable
  ``passphrase_env`` names (the value is never stored, logged or shown); keepalives; a connect
  timeout and a command timeout. One cached connection per node carries the short commands and is
  replaced when it died; bulk streams (`put_tree`, `pipe`) get a connection of their own.
- ``local``: a subprocess on this machine, in the node's ``root`` directory, with ``root/bin`` first
  on PATH and ``HOME=root/home`` — the embedded sandbox's nodes.

Every command is an argv list. It reaches the node as ONE ``sh -c <script>`` whose script is built
with `shlex.join`/`shlex.quote` only, so a tag or directory named ``r28; touch /tmp/x`` is a name,
never a command, whatever login shell the node's user has.

Long jobs (a 2-hour image build, a 16 GB distribution) are started detached (``setsid nohup``)
and followed by STATE — the pid and an exit file — never by log strings: a dead output pipe exits
120 with an empty log (runbook: "Bench pipe pump"). Reads are idempotent, so a dropped connection
is reconnected for them; a dropped connection never fails a poll or the build behind it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import queue
import re
import select
import shlex
import signal
import socket
import subprocess
import tarfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import dagster as dg
import paramiko
from pydantic import BaseModel, Field, PrivateAttr, field_validator

from resources.errors import LockstepError
from resources.secrets import redact, redact_argv, secret_values
from resources.site import SiteConfig, SparkNode

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Bulk streaming. Reads hand over whatever has arrived, up to this much at a time.
_CHUNK = 1 << 20
# Chunks queued per destination of a pipe: a slow destination holds the producer back (backpressure)
# once this many are waiting, so at most _QUEUE_CHUNKS * _WINDOW bytes sit in memory per destination.
_QUEUE_CHUNKS = 8
# What we keep of a stream that is only read for a message (a destination's stderr, say).
_TAIL = 64 * 1024
# Our receive window and the largest packet we accept from sshd on a bulk channel. A bigger window
# does not help paramiko (its receive buffer gets slower as it grows); bigger packets do.
_WINDOW = 4 << 20
_MAX_PACKET = 256 << 10
# paramiko re-keys after 512 MiB by default, and a re-key it starts while a channel closes can stall
# its transport thread for the key-exchange timeout and kill the connection. OpenSSH itself re-keys
# AES connections after 2^32 blocks (64 GiB); we do the same, and bulk streams use fresh connections.
_REKEY_BYTES = 1 << 36
_REKEY_PACKETS = 1 << 31
# AES-GCM first: the cheapest authenticated cipher for both paramiko and sshd.
_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr", "aes192-ctr")
# Idempotent reads (poll, tail, manifest) retry on a dropped connection this often, with these pauses.
_READ_PAUSES = (0.0, 1.0, 3.0)


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
        head = f"spark node {node} ({where}): " if node and where else f"spark node {node}: " if node else ""
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


class RunResult(BaseModel):
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
        the shape of a dead output pipe in a launcher, not of a failing child (runbook: Bench pipe pump).
        """
        head = f"{self.node}: `{_short(self.argv)}`"
        if self.silent:
            line = f"{head} exit {self.exit_code} with no output"
            if self.exit_code == 120:
                line += " (a launcher child dying with 120 and no output points at a dead output pipe pump, not the child)"
            return line
        return f"{head} exit {self.exit_code}, {len(self.stdout)} bytes stdout, {len(self.stderr)} bytes stderr"

    def __str__(self) -> str:
        return self.describe()

    def check(self) -> RunResult:
        """This result when the command exited 0; otherwise a SparkError with its stderr's tail."""
        if self.ok:
            return self
        tail = (self.stderr or self.stdout)[-2000:].decode("utf-8", "replace").strip()
        raise SparkError(self.describe() + (f"\n{tail}" if tail else ""), node=self.node, where=self.where)


class DetachedHandle(BaseModel):
    """A command started with `start_detached`: what `poll` and `tail` need to follow it."""

    node: str
    pid: int
    log: str = Field(description="Remote path of the combined stdout+stderr.")
    exit_file: str = Field(description="Remote path the exit code is written to when the command ends.")
    started_at: datetime
    tag: str = Field(description="A token in the detached shell's command line: tells our pid from a recycled one.")


class DetachedState(BaseModel):
    """What a detached command is doing now: from its pid and exit file, never from its log."""

    state: Literal["running", "exited", "vanished"]
    exit_code: int | None = None


class PutResult(BaseModel):
    """A tree copied with `put_tree` and verified file by file."""

    node: str
    remote_dir: str
    files: int
    bytes: int = Field(description="Total size of the regular files.")
    sha256: str = Field(description="sha256 of the manifest (path, kind, content sha256, size, exec bit), same on both sides.")
    duration_s: float


class PipeEnd(BaseModel):
    """One side of a `pipe`: a node, what it was sent (or produced), how it exited."""

    node: str
    exit_code: int | None = Field(description="None when it never exited (timed out, connection lost).")
    bytes: int
    sha256: str = Field(description="sha256 of exactly the bytes sent to (or read from) it.")
    stdout: bytes = Field(default=b"", description="The tail of its stdout (e.g. `docker load`'s 'Loaded image').")
    stderr: bytes = Field(default=b"", description="The tail of its stderr.")
    error: str | None = Field(default=None, description="What went wrong on our side of the stream, if anything.")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None


class PipeResult(BaseModel):
    """One producer's stdout streamed into every destination's stdin."""

    src: PipeEnd
    dsts: list[PipeEnd]
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.src.ok and self.src.bytes > 0 and all(d.ok and d.bytes == self.src.bytes for d in self.dsts)


# ---- the command a node runs ---------------------------------------------------------------------


def _script(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """A POSIX sh script that runs `argv` (in `cwd`, with `env`), every value quoted."""
    if not argv:
        raise ValueError("argv is empty: give the command as a list, e.g. ['docker', 'images']")
    parts = []
    for key, value in (env or {}).items():
        if not _ENV_KEY.match(key):
            raise ValueError(f"environment variable name {key!r} is not a shell identifier")
        parts.append(f"{key}={shlex.quote(value)}")
    command = " ".join([*parts, shlex.join(argv)])
    if cwd is not None:
        command = f"cd {shlex.quote(cwd)} && {command}"
    return command


def _no_exec(script: str) -> str:
    """`script` so that sh waits for its last command instead of exec'ing it: a command killed by a
    signal then still yields an exit code (128+N) rather than a vanished shell."""
    return f"{script}\nexit $?"


# ---- streams and transports ----------------------------------------------------------------------


class _Closed(Exception):
    """The other end of stdin went away (the command exited or the channel closed)."""


class _Stream(ABC):
    """One running command. `read*` return b"" at end of stream and raise TimeoutError when nothing
    arrived within the stream's timeout; `write` raises _Closed when the reader is gone."""

    @abstractmethod
    def write(self, data: bytes | memoryview) -> None: ...

    @abstractmethod
    def close_stdin(self) -> None: ...

    @abstractmethod
    def read(self, n: int) -> bytes: ...

    @abstractmethod
    def read_stderr(self, n: int) -> bytes: ...

    @abstractmethod
    def wait(self, timeout_s: float | None) -> int | None:
        """The exit code, or None when it has not exited within `timeout_s`.

        Raises _Lost when the connection dropped before an exit code arrived."""

    @abstractmethod
    def abort(self) -> None:
        """Stop waiting for it: close the channel (ssh), kill its process group (local)."""

    def close(self) -> None:
        self.abort()


class _Lost(Exception):
    """The connection under a stream dropped."""


class _SshStream(_Stream):
    def __init__(self, chan: paramiko.Channel, owned: paramiko.SSHClient | None = None) -> None:
        self.chan = chan
        self.owned = owned  # a connection opened for this stream alone, closed with it

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        sent = 0
        try:
            while sent < len(view):
                n = self.chan.send(view[sent:])  # one packet per call; a view slice copies nothing
                if n == 0:
                    raise _Closed()
                sent += n
        except socket.timeout:
            raise TimeoutError from None
        except (OSError, EOFError, paramiko.SSHException) as exc:  # "Socket is closed", a dead transport
            raise _Closed() from exc

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()

    def read(self, n: int) -> bytes:
        try:
            return self.chan.recv(n)
        except socket.timeout:
            raise TimeoutError from None
        except (OSError, EOFError, paramiko.SSHException):
            return b""  # the end of this stream; `wait` tells a lost connection from an exit

    def read_stderr(self, n: int) -> bytes:
        try:
            return self.chan.recv_stderr(n)
        except socket.timeout:
            raise TimeoutError from None
        except (OSError, EOFError, paramiko.SSHException):
            return b""

    def wait(self, timeout_s: float | None) -> int | None:
        if not self.chan.status_event.wait(timeout_s):
            return None
        if self.chan.exit_status != -1:
            return self.chan.exit_status
        transport = self.chan.get_transport()
        if transport is None or not transport.is_active():
            raise _Lost()  # closed without an exit status because the connection went away
        # Closed without an exit status on a live connection: the remote shell itself was killed by a
        # signal (sshd sends exit-signal, which paramiko does not report). ssh(1) says 255 then, too.
        return 255

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.chan.close()

    def close(self) -> None:
        self.abort()
        if self.owned is not None:
            with contextlib.suppress(Exception):
                self.owned.close()


class _LocalStream(_Stream):
    def __init__(self, proc: subprocess.Popen[bytes], timeout_s: float | None) -> None:
        self.proc = proc
        self.timeout_s = timeout_s
        assert proc.stdin and proc.stdout and proc.stderr
        self._in = proc.stdin.fileno()
        os.set_blocking(self._in, False)

    def _ready(self, fd: int, *, write: bool = False) -> None:
        r, w, _ = select.select([] if write else [fd], [fd] if write else [], [], self.timeout_s)
        if not (r or w):
            raise TimeoutError

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            self._ready(self._in, write=True)
            try:
                sent += os.write(self._in, view[sent : sent + (1 << 20)])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise _Closed() from exc

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin
            self.proc.stdin.close()

    def _read(self, pipe: Any, n: int) -> bytes:
        fd = pipe.fileno()
        self._ready(fd)
        try:
            return os.read(fd, n)
        except OSError:
            return b""

    def read(self, n: int) -> bytes:
        return self._read(self.proc.stdout, n)

    def read_stderr(self, n: int) -> bytes:
        return self._read(self.proc.stderr, n)

    def wait(self, timeout_s: float | None) -> int | None:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        # sh reports a signal death as 128+N, subprocess as -N: keep the shell's convention.
        return 128 - code if code < 0 else code

    def abort(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.abort()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                if pipe:
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class _Transport(ABC):
    """How commands reach one node."""

    def __init__(self, node: SparkNode, owner: SparkNodes, where: str) -> None:
        self.node = node
        self.owner = owner
        self.where = where

    @abstractmethod
    def open(self, script: str, *, timeout_s: float | None, bulk: bool = False) -> _Stream:
        """Start `script` under ``sh -c``. `timeout_s` bounds each read and write (None: block).

        Raises _NotStarted when it certainly did not start (safe to retry anywhere)."""

    def close(self) -> None:
        """Drop cached connections."""


class _NotStarted(Exception):
    """The command was certainly not started: the connection was dead before it was sent."""


class _LocalTransport(_Transport):
    def __init__(self, node: SparkNode, owner: SparkNodes, *, hidden_env: Iterable[str]) -> None:
        super().__init__(node, owner, f"local:{node.root}")
        self.root = Path(node.root)
        self.hidden_env = set(hidden_env)

    def open(self, script: str, *, timeout_s: float | None, bulk: bool = False) -> _Stream:
        if not self.root.is_dir():
            raise SparkError(
                f"the node's root directory {self.root} does not exist; create it (the sandbox does: "
                "`lockstep sandbox up`) or fix `root` of this [[spark.nodes]] entry",
                node=self.node.name, where=self.where,
            )  # fmt: skip
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in self.hidden_env}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["HOME"] = str(home)
        proc = subprocess.Popen(
            ["sh", "-c", _no_exec(script)], cwd=self.root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        if bulk:  # fewer, larger reads and writes (1 MiB pipes instead of 64 KiB), where Linux allows it
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError, AttributeError):
                    fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _CHUNK)  # type: ignore[union-attr]
        return _LocalStream(proc, timeout_s)


class _RefuseUnknownHost(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key, so the error can show its fingerprint."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHost(hostname, key)


class _UnknownHost(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} not found in known_hosts")
        self.hostname = hostname
        self.key = key


def _transport_factory(sock: socket.socket, **kwargs: Any) -> paramiko.Transport:
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    offered = list(options.ciphers)
    options.ciphers = [c for c in _CIPHERS if c in offered] + [c for c in offered if c not in _CIPHERS]
    transport.packetizer.REKEY_BYTES = _REKEY_BYTES
    transport.packetizer.REKEY_PACKETS = _REKEY_PACKETS
    return transport


class _SshTransport(_Transport):
    def __init__(self, node: SparkNode, owner: SparkNodes) -> None:
        host = f"[{node.host}]" if ":" in node.host else node.host
        super().__init__(node, owner, f"{node.user + '@' if node.user else ''}{host}:{node.port}")
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # -- connecting --

    def _error(self, message: str, cls: type[SparkError] = SparkError) -> SparkError:
        return cls(self.owner._say(message), node=self.node.name, where=self.where)

    def _known_hosts_name(self) -> str:
        return self.node.host if self.node.port == 22 else f"[{self.node.host}]:{self.node.port}"

    def _keyscan(self) -> str:
        port = "" if self.node.port == 22 else f"-p {self.node.port} "
        return f"ssh-keyscan {port}-t ed25519 {self.node.host} >> {shlex.quote(self.owner.known_hosts)}"

    def connect(self) -> paramiko.SSHClient:
        """A new authenticated connection (host key checked first: on a refusal nothing runs)."""
        known_hosts = Path(self.owner.known_hosts).expanduser()
        if not known_hosts.is_file():
            raise self._error(
                f"known_hosts file {known_hosts} does not exist, so the node's host key cannot be checked; "
                f"after confirming the fingerprint on the node (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` "
                f"there), add it with `{self._keyscan()}`, or point [spark] known_hosts at the right file",
                HostKeyRefused,
            )
        client = paramiko.SSHClient()
        try:
            client.load_host_keys(str(known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise self._error(f"cannot read known_hosts {known_hosts}: {exc}", HostKeyRefused) from None
        client.set_missing_host_key_policy(_RefuseUnknownHost())
        pkey = self.owner._pkey()
        timeout = self.owner.connect_timeout_s
        try:
            client.connect(
                self.node.host, port=self.node.port, username=self.node.user or None, pkey=pkey,
                allow_agent=pkey is None, look_for_keys=pkey is None,
                passphrase=self.owner._passphrase() if pkey is None else None,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                transport_factory=_transport_factory,
            )  # fmt: skip
        except _UnknownHost as exc:
            client.close()
            raise self._error(
                f"the host key it offered ({exc.key.get_name()} {exc.key.fingerprint}) is not in "
                f"{known_hosts} under {self._known_hosts_name()}; refused — host keys are verified, never "
                "auto-added, and nothing was run. Check that fingerprint on the node itself "
                f"(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there), then add it: `{self._keyscan()}`",
                HostKeyRefused,
            ) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise self._error(
                f"HOST KEY MISMATCH: it offered {exc.key.get_name()} {exc.key.fingerprint} but {known_hosts} "
                f"has {exc.expected_key.get_name()} {exc.expected_key.fingerprint} for {self._known_hosts_name()}; "
                "refused, nothing was run. The node was reinstalled — or something is in the middle. Confirm the "
                "new fingerprint on the node's console (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then "
                f"replace the entry: `ssh-keygen -R '{self._known_hosts_name()}' -f {shlex.quote(str(known_hosts))}` "
                f"and `{self._keyscan()}`",
                HostKeyRefused,
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            key = self.owner.key_path or "the agent's and ~/.ssh's keys"
            raise self._error(
                f"authentication as {self.node.user or '(current user)'} failed with {key} ({exc}); add the public "
                f"key to that user's ~/.ssh/authorized_keys on the node"
                + (f" (`ssh-copy-id -i {self.owner.key_path}.pub -p {self.node.port} "
                   f"{self.node.user or 'USER'}@{self.node.host}`)" if self.owner.key_path else "")
            ) from None  # fmt: skip
        except (TimeoutError, socket.timeout):
            client.close()
            raise self._error(
                f"no answer within {timeout:g}s (connect_timeout_s); is the node up and reachable from here?",
                Unreachable,
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise self._error(
                f"cannot connect: {exc or type(exc).__name__}; is the node up, sshd listening on port "
                f"{self.node.port}, and the host/port in [[spark.nodes]] right?",
                Unreachable,
            ) from None
        transport = client.get_transport()
        assert transport is not None
        if self.owner.keepalive_s:
            transport.set_keepalive(self.owner.keepalive_s)
        return client

    def _cached(self) -> paramiko.SSHClient:
        with self._lock:
            client = self._client
            transport = client.get_transport() if client else None
            if client is not None and transport is not None and transport.is_active():
                return client
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            self._client = self.connect()
            return self._client

    def _drop(self, client: paramiko.SSHClient) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        with contextlib.suppress(Exception):
            client.close()

    def open(self, script: str, *, timeout_s: float | None, bulk: bool = False) -> _Stream:
        # Bulk streams get their own connection: they never queue behind (or stall) the control one.
        client = self.connect() if bulk else self._cached()
        transport = client.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise EOFError("connection is not active")
            chan = transport.open_session(
                window_size=_WINDOW if bulk else None, max_packet_size=_MAX_PACKET if bulk else None,
                timeout=self.owner.connect_timeout_s,
            )  # fmt: skip
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # Nothing was sent: the connection was dead already. Forget it; the caller may retry.
            self._drop(client)
            raise _NotStarted(str(exc)) from None
        chan.settimeout(timeout_s)
        try:
            chan.exec_command(shlex.join(["sh", "-c", _no_exec(script)]))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop(client)
            raise self._error(
                f"the connection dropped while starting a command ({exc}); it may or may not have started",
                ConnectionLost,
            ) from None
        return _SshStream(chan, owned=client if bulk else None)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


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
            except Exception:  # the stream went away under us: what we have is all there is
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
            except Exception as exc:  # paramiko: a dead transport, a failed re-key
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
"""


def local_manifest(root: Path) -> list[str]:
    """The manifest lines of a local tree (the same code the node runs)."""
    namespace: dict[str, Any] = {"__name__": "lockstep_manifest"}
    exec(compile(_MANIFEST_PY, "<lockstep manifest>", "exec"), namespace)  # our own constant source
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
            return f"{path}: on the node but not in the local tree (put into an empty directory, e.g. one per rev)"
        if a[1] != b[1]:
            return f"{path}: a {a[1]} here, a {b[1]} on the node"
        if a[1] == "file" and a[2:4] != b[2:4]:
            return f"{path}: content differs (here {a[3]} bytes sha256 {a[2][:12]}, node {b[3]} bytes sha256 {b[2][:12]})"
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


# ---- the resource --------------------------------------------------------------------------------


class SparkNodes(dg.ConfigurableResource):
    """The DGX Spark nodes a site names, and the commands lockstep runs on them.

    Build it from the site file with `spark_for(site)`. Every call names a node; every command is
    an argv list, quoted for the remote shell, never spliced into a string. Every call has a
    timeout. Secret values (the key's passphrase, the variables in `redact_env`) never appear in a
    log line, an error or a result.
    """

    nodes: list[dict[str, Any]] = Field(description="[[spark.nodes]] entries (SparkNode fields).")
    known_hosts: str = Field(default="~/.ssh/known_hosts", description="Host keys to verify against; never written.")
    key_path: str | None = Field(default=None, description="Private key file; none: the ssh agent and ~/.ssh keys.")
    passphrase_env: str | None = Field(default=None, description="NAME of the env var with the key's passphrase.")
    passphrase: str | None = Field(
        default=None, description="The passphrase, as a dg.EnvVar of passphrase_env when wired in Definitions; "
        "unset: read $passphrase_env when the key is loaded.",
    )
    connect_timeout_s: float = Field(default=15.0, gt=0)
    command_timeout_s: float = Field(
        default=600.0, gt=0, description="Default timeout of `run`; for bulk streams, the longest stall allowed."
    )
    keepalive_s: int = Field(default=30, ge=0, description="SSH keepalive interval (0: none).")
    redact_env: list[str] = Field(
        default_factory=list, description="Names of more env vars whose values are masked in everything said here."
    )

    _transports: dict[str, _Transport] = PrivateAttr(default_factory=dict)
    _pkey_cache: list[paramiko.PKey] = PrivateAttr(default_factory=list)

    @field_validator("nodes", mode="before")
    @classmethod
    def _valid_nodes(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        nodes = [SparkNode.model_validate(n.model_dump() if isinstance(n, SparkNode) else n) for n in value]
        names = [n.name for n in nodes]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"node names must be unique; {', '.join(dupes)} appear more than once")
        for n in nodes:
            if n.transport == "ssh" and not n.host:
                raise ValueError(f"node {n.name}: an ssh node needs a host")
            if n.transport == "local" and not n.root:
                raise ValueError(f"node {n.name}: a local node needs a root directory")
        return [n.model_dump() for n in nodes]

    # -- plumbing --

    def _secrets(self) -> list[str]:
        own = [p] if (p := self._passphrase()) else []
        return [*own, *secret_values(self.redact_env)]

    def _say(self, text: str) -> str:
        return redact(text, self._secrets())

    def _passphrase(self) -> str | None:
        if self.passphrase:
            return self.passphrase
        if not self.passphrase_env:
            return None
        return os.environ.get(self.passphrase_env) or None

    def _pkey(self) -> paramiko.PKey | None:
        """The private key, decrypted once per resource (the passphrase itself is not kept)."""
        if not self.key_path:
            return None
        if self._pkey_cache:
            return self._pkey_cache[0]
        path = Path(self.key_path).expanduser()
        env = self.passphrase_env
        try:
            passphrase = self._passphrase()
            key = paramiko.PKey.from_path(path, passphrase.encode() if passphrase else None)
        except FileNotFoundError:
            raise SparkError(f"ssh key {path} does not exist; fix [spark] key_path") from None
        except (paramiko.PasswordRequiredException, TypeError) as exc:
            # paramiko's own loader raises the former, cryptography's (paramiko >= 4) a TypeError.
            if isinstance(exc, TypeError) and "password" not in str(exc).lower():
                raise
            hint = (
                f"export {env} with it" if env else "set [spark] passphrase_env to the NAME of an env var holding it"
            )
            raise SparkError(f"ssh key {path} is encrypted and no passphrase was given: {hint}") from None
        except (paramiko.SSHException, ValueError, OSError) as exc:
            given = f"the passphrase in ${env}" if env and self._passphrase() else "no passphrase"
            raise SparkError(self._say(
                f"cannot load ssh key {path} with {given}: {exc}; check the key file and the value of "
                f"{env or '[spark] passphrase_env'}"
            )) from None  # fmt: skip
        self._pkey_cache.append(key)
        return key

    def node(self, name: str) -> SparkNode:
        """The inventory entry of node `name`."""
        for raw in self.nodes:
            if raw["name"] == name:
                return SparkNode.model_validate(raw)
        known = ", ".join(n["name"] for n in self.nodes) or "none"
        raise SparkError(f"no [[spark.nodes]] entry named {name!r} (the site has: {known}); add it to the site file")

    def names(self, role: str | None = None) -> list[str]:
        """Node names, optionally only those with `role` ("build" or "lane")."""
        return [n["name"] for n in self.nodes if role is None or role in n.get("roles", [])]

    def _transport(self, name: str) -> _Transport:
        cached = self._transports.get(name)
        # A model_copy shares the private cache with its original; its settings may differ.
        if cached is None or cached.owner is not self:
            spec = self.node(name)
            if spec.transport == "local":
                hidden = [e for e in (self.passphrase_env, *self.redact_env) if e]
                cached = _LocalTransport(spec, self, hidden_env=hidden)
            else:
                cached = _SshTransport(spec, self)
            self._transports = {**self._transports, name: cached}
        return cached

    def _open(self, node: str, script: str, *, timeout_s: float | None, bulk: bool = False) -> tuple[_Transport, _Stream]:
        """Start a script; a connection found dead before anything was sent is replaced once."""
        transport = self._transport(node)
        try:
            return transport, transport.open(script, timeout_s=timeout_s, bulk=bulk)
        except _NotStarted:
            try:
                return transport, transport.open(script, timeout_s=timeout_s, bulk=bulk)
            except _NotStarted as exc:
                raise Unreachable(
                    self._say(f"the connection keeps dropping before a command can start ({exc}); is the node up?"),
                    node=node, where=transport.where,
                ) from None

    def close(self) -> None:
        """Close every cached connection (they are reopened when needed)."""
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    # -- commands --

    def run(
        self,
        *,
        node: str,
        argv: list[str],
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """Run `argv` on `node` to its end and return its exit code and output (a non-zero exit is
        a result, not an error: use `.check()`).

        `cwd` and `env` apply on the node (a relative `cwd` is relative to the login directory for
        ssh, to the node's root for local). Raises SparkError when the node cannot be reached, when
        the command outlives `timeout_s` (default command_timeout_s), or when the connection drops
        while it runs (it may or may not have finished then: check before running it again).
        """
        argv = [str(a) for a in argv]
        script = self._checked_script(node, argv, cwd=cwd, env=env)
        limit = timeout_s if timeout_s is not None else self.command_timeout_s
        shown = redact_argv(argv, self._secrets())
        dg.get_dagster_logger().debug(f"spark {node}: {shlex.join(shown)}")
        started = time.monotonic()
        transport, stream = self._open(node, script, timeout_s=None)
        try:
            out = _Drain(stream.read)
            err = _Drain(stream.read_stderr)
            feeder = threading.Thread(target=self._feed, args=(stream, stdin), daemon=True)
            feeder.start()
            deadline = started + limit
            try:
                code = stream.wait(max(0.0, deadline - time.monotonic()))
            except _Lost:
                raise ConnectionLost(
                    self._say(f"the connection dropped while `{_short(shown)}` ran; it may or may not have "
                              "finished there — check on the node before running it again"),
                    node=node, where=transport.where,
                ) from None  # fmt: skip
            if code is None:
                stream.abort()
                what = "it was killed" if isinstance(stream, _LocalStream) else (
                    "the channel was closed; the command may still be running on the node")
                raise SparkError(
                    self._say(f"`{_short(shown)}` did not finish within {limit:g}s; {what}. "
                              "Give it a longer timeout_s, or start it with start_detached and poll it"),
                    node=node, where=transport.where,
                )  # fmt: skip
            stdout = out.result(max(1.0, deadline - time.monotonic()))
            stderr = err.result(1.0)
        finally:
            stream.close()
        return RunResult(
            node=node, where=transport.where, argv=shown, exit_code=code, stdout=stdout, stderr=stderr,
            duration_s=round(time.monotonic() - started, 3),
        )  # fmt: skip

    @staticmethod
    def _feed(stream: _Stream, data: bytes | None) -> None:
        with contextlib.suppress(_Closed, TimeoutError):
            if data:
                stream.write(data)
        stream.close_stdin()

    def _checked_script(self, node: str, argv: list[str], *, cwd: str | None, env: dict[str, str] | None) -> str:
        try:
            return _script(argv, cwd=cwd, env=env)
        except ValueError as exc:
            raise SparkError(str(exc), node=node) from None

    def _read(self, *, node: str, argv: list[str], timeout_s: float | None = None) -> RunResult:
        """`run` for an idempotent read: a dropped connection is reconnected and the read repeated."""
        last: SparkError | None = None
        for pause in _READ_PAUSES:
            time.sleep(pause)
            try:
                return self.run(node=node, argv=argv, timeout_s=timeout_s)
            except (ConnectionLost, Unreachable) as exc:
                last = exc  # the network blinked or the node is coming back: try again shortly
            self._transport(node).close()
        assert last is not None
        raise last

    def start_detached(
        self,
        *,
        node: str,
        argv: list[str],
        log: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> DetachedHandle:
        """Start `argv` on `node` so it outlives this connection and this process; return its pid.

        Runs ``setsid nohup sh -c '<argv>; echo $? > <exit file>' > <log> 2>&1 < /dev/null &``
        (the exit file is ``<log>.exit``, written atomically when the command ends), every part
        quoted. Follow it with `poll` (state) and `tail` (log lines for metadata only).
        """
        argv = [str(a) for a in argv]
        body = self._checked_script(node, argv, cwd=cwd, env=env)
        tag = f"lockstep-{uuid.uuid4().hex[:16]}"
        exit_file = f"{log}.exit"
        # The command may `cd` (cwd): the exit file is addressed by an absolute path fixed before it starts.
        inner = (
            f': {tag}; {body}; echo $? > "$LOCKSTEP_EXIT_FILE.{tag}" && mv -f "$LOCKSTEP_EXIT_FILE.{tag}" "$LOCKSTEP_EXIT_FILE"'
        )
        outer = (
            f"rm -f {shlex.quote(exit_file)} || exit 1; "
            f'mkdir -p -- "$(dirname -- {shlex.quote(log)})" || exit 1; '
            f'LOCKSTEP_EXIT_FILE="$(cd -- "$(dirname -- {shlex.quote(exit_file)})" && pwd)/$(basename -- {shlex.quote(exit_file)})" '
            f"|| exit 1; export LOCKSTEP_EXIT_FILE; "
            f"setsid nohup sh -c {shlex.quote(inner)} > {shlex.quote(log)} 2>&1 < /dev/null & echo $!"
        )
        shown = redact_argv(argv, self._secrets())
        dg.get_dagster_logger().info(f"spark {node}: detached `{shlex.join(shown)}`, log {log}")
        started_at = datetime.now(timezone.utc)
        transport, stream = self._open(node, outer, timeout_s=None)
        try:
            stream.close_stdin()
            out = _Drain(stream.read)
            err = _Drain(stream.read_stderr)
            try:
                code = stream.wait(self.command_timeout_s)
            except _Lost:
                code = None
            stdout, stderr = out.result(5.0), err.result(1.0)
        finally:
            stream.close()
        pid_text = stdout.decode("utf-8", "replace").strip()
        if code != 0 or not pid_text.isdigit():
            raise SparkError(
                self._say(f"could not start `{_short(shown)}` detached (exit {code}): "
                          f"{(stderr or stdout).decode('utf-8', 'replace').strip()[-2000:] or 'no output'}"),
                node=node, where=transport.where,
            )  # fmt: skip
        return DetachedHandle(node=node, pid=int(pid_text), log=log, exit_file=exit_file, started_at=started_at, tag=tag)

    # A process counts as ours while it lives AND its command line carries the handle's tag: a pid
    # recycled by another process (or a zombie, whose cmdline is empty) is not our command.
    _POLL = (
        'if [ -s "$2" ]; then echo "exited $(cat "$2")"; '
        'elif kill -0 "$1" 2>/dev/null && { [ ! -d /proc/self ] || tr "\\000" "\\n" < "/proc/$1/cmdline" '
        '| grep -qF -- "$3"; }; then echo running; '
        'elif [ -s "$2" ]; then echo "exited $(cat "$2")"; '
        "else echo vanished; fi"
    )

    def poll(self, *, handle: DetachedHandle) -> DetachedState:
        """The state of a detached command: running (its pid is alive and is ours), exited (with the
        code from its exit file), or vanished (gone without an exit file: killed, or the node rebooted).

        Never reads the log. A dropped connection is reconnected and the poll repeated.
        """
        result = self._read(node=handle.node, argv=["sh", "-c", self._POLL, "lockstep-poll", str(handle.pid),
                                                    handle.exit_file, handle.tag])  # fmt: skip
        words = result.text().split()
        if result.exit_code != 0 or not words:
            raise SparkError(self._say(f"cannot tell the state of pid {handle.pid}: {result.describe()}"),
                             node=handle.node, where=result.where)  # fmt: skip
        if words[0] == "exited":
            if len(words) == 2 and words[1].lstrip("-").isdigit():
                return DetachedState(state="exited", exit_code=int(words[1]))
            raise SparkError(f"exit file {handle.exit_file} holds {' '.join(words[1:])!r}, not an exit code",
                             node=handle.node, where=result.where)  # fmt: skip
        if words[0] in ("running", "vanished"):
            return DetachedState(state=words[0])  # type: ignore[arg-type]
        raise SparkError(f"unexpected poll answer {result.text()!r}", node=handle.node, where=result.where)

    def tail(self, *, handle: DetachedHandle, lines: int = 40) -> str:
        """The last `lines` lines of a detached command's log, secrets masked — for metadata only;
        its state comes from `poll`."""
        result = self._read(node=handle.node, argv=["tail", "-n", str(int(lines)), "--", handle.log])
        return self._say((result.stdout or result.stderr).decode("utf-8", "replace"))

    def put_tree(self, *, node: str, local_dir: Path, remote_dir: str) -> PutResult:
        """Copy a local directory tree into `remote_dir` on `node` as ONE tar stream, then verify it.

        Both sides compute a manifest (sha256 of every file, sizes, owner-exec bits, symlink
        targets, directories; sorted by path) — the node with `python3` — and must agree; otherwise
        SparkError names the first differing path. `remote_dir` is created if missing; files
        already there that the tree does not have count as differences (use a fresh directory).
        """
        local = Path(local_dir)
        if not local.is_dir():
            raise SparkError(f"put_tree: {local} is not a directory", node=node)
        started = time.monotonic()
        manifest = local_manifest(local)
        extract = shlex.join(["mkdir", "-p", "--", remote_dir]) + " && " + shlex.join(
            ["tar", "-x", "-f", "-", "--no-same-owner", "-C", remote_dir])  # fmt: skip
        dg.get_dagster_logger().info(f"spark {node}: put {local} -> {remote_dir} ({len(manifest)} entries)")
        transport, stream = self._open(node, extract, timeout_s=self.command_timeout_s, bulk=True)
        try:
            err = _Drain(stream.read_stderr, keep=_TAIL)
            out = _Drain(stream.read, keep=_TAIL)
            sink = _TarSink(stream)
            failure: str | None = None
            try:
                with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    for line in manifest:
                        rel = json.loads(line)[0]
                        info = tar.gettarinfo(str(local / rel), arcname=rel)
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        if info.isreg():
                            with open(local / rel, "rb") as f:
                                tar.addfile(info, f)
                        else:
                            tar.addfile(info)
                sink.flush()
            except _Closed:
                failure = "tar on the node stopped reading"
            except TimeoutError:
                failure = f"the stream stalled for {self.command_timeout_s:g}s"
            stream.close_stdin()
            try:
                code = stream.wait(self.command_timeout_s)
            except _Lost:
                code = None
            stderr = err.result(5.0) or out.result(1.0)
        finally:
            stream.close()
        if failure or code != 0:
            raise SparkError(
                self._say(f"put_tree into {remote_dir} failed ({failure or f'tar exit {code}'}): "
                          f"{stderr.decode('utf-8', 'replace').strip()[-2000:] or 'no output'}"),
                node=node, where=transport.where,
            )  # fmt: skip
        remote = self._read(node=node, argv=["python3", "-c", _MANIFEST_PY, remote_dir])
        if remote.exit_code != 0:
            raise SparkError(
                self._say(f"cannot list {remote_dir} to verify the copy (needs python3 on the node): "
                          f"{remote.describe()}\n{remote.stderr.decode('utf-8', 'replace')[-2000:]}"),
                node=node, where=transport.where,
            )  # fmt: skip
        remote_lines = remote.text().splitlines()
        if difference := _first_difference(manifest, remote_lines):
            raise SparkError(f"put_tree into {remote_dir} did not arrive identical: {difference}",
                             node=node, where=transport.where)  # fmt: skip
        files = [json.loads(line) for line in manifest]
        return PutResult(
            node=node, remote_dir=remote_dir,
            files=sum(1 for e in files if e[1] == "file"), bytes=sum(e[3] for e in files if e[1] == "file"),
            sha256=hashlib.sha256("".join(line + "\n" for line in manifest).encode()).hexdigest(),
            duration_s=round(time.monotonic() - started, 3),
        )  # fmt: skip

    def pipe(self, *, src: str, src_argv: list[str], dsts: list[str], dst_argv: list[str]) -> PipeResult:
        """Stream `src_argv`'s stdout on node `src` into `dst_argv`'s stdin on every node in `dsts`,
        in parallel: each chunk is read once and handed to one writer thread per destination through
        a bounded queue, so the slowest destination sets the pace (backpressure) and nothing is
        buffered without bound. This is ``docker save IMG | ssh dst docker load`` for a whole lane.

        Returns per side: exit code, bytes, sha256 of exactly the bytes it was sent (the producer's:
        of what it produced). Raises PipeFailed (with `.result`) naming the node and exit code when the
        producer exits non-zero or with no output, or any destination fails or got less than all of it.
        A stall longer than command_timeout_s on either side aborts the whole stream.
        """
        if not dsts:
            raise SparkError("pipe needs at least one destination node", node=src)
        if len(set(dsts)) != len(dsts):
            raise SparkError(f"pipe destinations repeat a node: {', '.join(dsts)}", node=src)
        src_script = self._checked_script(src, [str(a) for a in src_argv], cwd=None, env=None)
        dst_script = self._checked_script(dsts[0], [str(a) for a in dst_argv], cwd=None, env=None)
        secrets = self._secrets()
        shown = f"{shlex.join(redact_argv(src_argv, secrets))} | {shlex.join(redact_argv(dst_argv, secrets))}"
        dg.get_dagster_logger().info(f"spark pipe {src} -> {', '.join(dsts)}: {shown}")
        stall = self.command_timeout_s
        started = time.monotonic()
        opened: list[_Stream] = []
        feeders: list[tuple[str, _Transport, _Feeder, _Drain, _Drain]] = []
        try:
            # Destinations first: the producer should not start before its output has somewhere to go.
            for dst in dsts:
                transport, stream = self._open(dst, dst_script, timeout_s=stall, bulk=True)
                opened.append(stream)
                feeder = _Feeder(stream)
                feeders.append((dst, transport, feeder, _Drain(stream.read, keep=_TAIL),
                                _Drain(stream.read_stderr, keep=_TAIL)))  # fmt: skip
            src_transport, producer = self._open(src, src_script, timeout_s=stall, bulk=True)
            opened.append(producer)
            producer.close_stdin()
            src_err = _Drain(producer.read_stderr, keep=_TAIL)
            src_sha = hashlib.sha256()
            total = 0
            src_error: str | None = None
            while True:
                try:
                    chunk = producer.read(_WINDOW)  # all that has arrived: paramiko's buffer is cheapest emptied
                except TimeoutError:
                    src_error = f"no output for {stall:g}s (command_timeout_s); stream aborted"
                    producer.abort()
                    break
                if not chunk:
                    break
                src_sha.update(chunk)
                digest_after = src_sha.copy()
                total += len(chunk)
                live = [f for _, _, f, _, _ in feeders if f.error is None]
                if not live:
                    src_error = "every destination failed; producer stopped"
                    producer.abort()
                    break
                for feeder in live:
                    feeder.queue.put((chunk, digest_after))
            for _, _, feeder, _, _ in feeders:
                feeder.finish()
            try:
                src_code = producer.wait(stall) if src_error is None else None
            except _Lost:
                src_code, src_error = None, "the connection dropped before it exited"
            src_end = PipeEnd(node=src, exit_code=src_code, bytes=total, sha256=src_sha.hexdigest(),
                              stderr=src_err.result(5.0), error=src_error)  # fmt: skip
            ends: list[PipeEnd] = []
            for dst, _, feeder, out, err in feeders:
                feeder.join(stall)
                error = feeder.error
                try:
                    code = feeder.stream.wait(stall)
                    if code is None:
                        error = error or f"did not exit within {stall:g}s of its stdin closing"
                except _Lost:
                    code, error = None, error or "the connection dropped before it exited"
                ends.append(PipeEnd(node=dst, exit_code=code, bytes=feeder.sent, sha256=feeder.sha.hexdigest(),
                                    stdout=out.result(5.0), stderr=err.result(1.0), error=error))  # fmt: skip
        finally:
            for stream in opened:
                stream.close()
            for _, _, feeder, _, _ in feeders:
                feeder.finish()
        result = PipeResult(src=src_end, dsts=ends, duration_s=round(time.monotonic() - started, 3))
        if not result.ok:
            node, where, message = self._pipe_failure(result, src_transport.where,
                                                      {d: t.where for d, t, *_ in feeders})  # fmt: skip
            raise PipeFailed(self._say(f"{shown}: {message}"), node=node, where=where, result=result)
        return result

    @staticmethod
    def _pipe_failure(result: PipeResult, src_where: str, dst_where: dict[str, str]) -> tuple[str, str, str]:
        def tail(data: bytes) -> str:
            text = data.decode("utf-8", "replace").strip()[-1000:]
            return f": {text}" if text else ""

        src = result.src
        bad = [d for d in result.dsts if not d.ok or d.bytes != src.bytes]
        others = "; ".join(
            f"{d.node} exit {d.exit_code}" + (f" ({d.error})" if d.error else "") + f" after {d.bytes} bytes"
            for d in bad
        )
        if not src.ok:
            what = src.error or f"exit {src.exit_code}"
            return src.node, src_where, (
                f"the producer on {src.node} failed: {what} after {src.bytes} bytes{tail(src.stderr)}"
                + (f"; destinations: {others}" if others else "")
            )
        if src.bytes == 0:
            return src.node, src_where, (
                f"the producer on {src.node} exit {src.exit_code} with no output — nothing was sent; "
                f"a silent empty stream is a failure, not an empty image{tail(src.stderr)}"
            )
        first = bad[0]
        detail = first.error or f"exit {first.exit_code}"
        if first.ok and first.bytes != src.bytes:
            detail = f"got {first.bytes} of {src.bytes} bytes"
        return first.node, dst_where[first.node], (
            f"destination {first.node} failed: {detail} (exit {first.exit_code}){tail(first.stderr or first.stdout)}"
            + (f"; all failed destinations: {others}" if len(bad) > 1 else "")
            + f"; the others ({', '.join(d.node for d in result.dsts if d not in bad) or 'none'}) got all "
            f"{src.bytes} bytes"
        )


def spark_for(site: SiteConfig, *, env_vars: bool = False) -> SparkNodes:
    """The SparkNodes a site file describes: its [spark] table, with `root` of local nodes, the
    known_hosts file and the key path resolved against the site file's directory.

    `env_vars`: the passphrase as ``dg.EnvVar`` (for Definitions); otherwise read when the key loads.
    """
    section = site.spark
    if section is None:
        raise LockstepError(f"{site.path}: no [spark] table; add one with the nodes (see [[spark.nodes]])")
    nodes = []
    for node in section.nodes:
        data = node.model_dump()
        if node.transport == "local" and node.root:
            data["root"] = str(site.resolve_path(node.root))
        nodes.append(data)
    return SparkNodes(
        nodes=nodes,
        known_hosts=str(site.resolve_path(section.known_hosts)),
        key_path=str(site.resolve_path(section.key_path)) if section.key_path else None,
        passphrase_env=section.passphrase_env,
        passphrase=dg.EnvVar(section.passphrase_env) if env_vars and section.passphrase_env else None,
        connect_timeout_s=section.connect_timeout_s,
        command_timeout_s=section.command_timeout_s,
        keepalive_s=section.keepalive_s,
        redact_env=[name for name in site.secret_env_names() if name != section.passphrase_env],
    )
