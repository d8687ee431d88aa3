"""How commands reach a node: the sh script they become, the streams they run as, the transports.

A `_Transport` opens a `_Stream`: one running command with its stdin, stdout, stderr and exit code.
``ssh`` is paramiko, ``local`` a subprocess in the node's root (the sandbox's nodes). Transports
take a `TransportSettings`, never the resource.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resources.secrets import redact, secret_values
from resources.site.spark import SparkNode
from resources.spark.results import ConnectionLost, HostKeyRefused, SparkError, Unreachable

if TYPE_CHECKING:
    import paramiko

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

# Bulk streaming. Reads hand over whatever has arrived, up to this much at a time.
_CHUNK = 1 << 20
# Our receive window and the largest packet we accept from sshd on a bulk channel. A bigger window
# does not help paramiko (its receive buffer gets slower as it grows); bigger packets do.
_WINDOW = 4 << 20
_MAX_PACKET = 256 << 10
# paramiko re-keys after 512 MiB by default, and a re-key it starts while a channel closes can stall
# its transport thread for the key-exchange timeout and kill the connection. OpenSSH itself re-keys
# AES connections after 2^32 blocks (64 GiB); we do
# the same, and bulk streams use fresh connections.
_REKEY_BYTES = 1 << 36
_REKEY_PACKETS = 1 << 31
# AES-GCM first: the cheapest authenticated cipher for both paramiko and sshd.
_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
    "aes192-ctr",
)


# ---- what a transport is given -------------------------------------------------------------------


@dataclass(frozen=True)
class TransportSettings:
    """The [spark] table's connection settings and secrets, as the transports take them.

    Plain values (compared, so a resource copied with other settings gets new transports) plus the
    decrypted key, loaded once per settings object. The passphrase is read from $passphrase_env
    when the key loads and is never kept.
    """

    known_hosts: str = "~/.ssh/known_hosts"
    key_path: str | None = None
    passphrase_env: str | None = None
    passphrase: str | None = field(default=None, repr=False)
    redact_env: tuple[str, ...] = ()
    connect_timeout_s: float = 15.0
    keepalive_s: int = 30
    _key: list[paramiko.PKey] = field(default_factory=list, compare=False, repr=False)

    def current_passphrase(self) -> str | None:
        if self.passphrase:
            return self.passphrase
        if not self.passphrase_env:
            return None
        return os.environ.get(self.passphrase_env) or None

    def secrets(self) -> list[str]:
        own = [p] if (p := self.current_passphrase()) else []
        return [*own, *secret_values(list(self.redact_env))]

    def say(self, text: str) -> str:
        """`text` with every secret value masked."""
        return redact(text, self.secrets())

    def hidden_env(self) -> set[str]:
        """The variables a local node's command must not inherit."""
        return {e for e in (self.passphrase_env, *self.redact_env) if e}

    def pkey(self) -> paramiko.PKey | None:
        """The private key, decrypted once (the passphrase itself is not kept)."""
        import paramiko

        if not self.key_path:
            return None
        if self._key:
            return self._key[0]
        path = Path(self.key_path).expanduser()
        env = self.passphrase_env
        try:
            passphrase = self.current_passphrase()
            key = paramiko.PKey.from_path(path, passphrase.encode() if passphrase else None)
        except FileNotFoundError:
            raise SparkError(f"ssh key {path} does not exist; fix [spark] key_path") from None
        except (paramiko.PasswordRequiredException, TypeError) as exc:
            # paramiko's own loader raises the former, cryptography's (paramiko >= 4) a TypeError.
            if isinstance(exc, TypeError) and "password" not in str(exc).lower():
                raise
            hint = (
                f"export {env} with it"
                if env
                else "set [spark] passphrase_env to the NAME of an env var holding it"
            )
            raise SparkError(
                f"ssh key {path} is encrypted and no passphrase was given: {hint}"
            ) from None
        except (paramiko.SSHException, ValueError, OSError) as exc:
            given = (
                f"the passphrase in ${env}"
                if env and self.current_passphrase()
                else "no passphrase"
            )
            raise SparkError(
                self.say(
                    f"cannot load ssh key {path} with {given}: {exc}; check the key file and the "
                    "value of "
                    f"{env or '[spark] passphrase_env'}"
                )
            ) from None
        self._key.append(key)
        return key


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
        import paramiko

        view = memoryview(data)
        sent = 0
        try:
            while sent < len(view):
                n = self.chan.send(view[sent:])  # one packet per call; a view slice copies nothing
                if n == 0:
                    raise _Closed()
                sent += n
        except TimeoutError:
            raise TimeoutError from None
        # "Socket is closed", a dead transport
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise _Closed() from exc

    def close_stdin(self) -> None:
        import paramiko

        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()

    def read(self, n: int) -> bytes:
        import paramiko

        try:
            return self.chan.recv(n)
        except TimeoutError:
            raise TimeoutError from None
        except (OSError, EOFError, paramiko.SSHException):
            return b""  # the end of this stream; `wait` tells a lost connection from an exit

    def read_stderr(self, n: int) -> bytes:
        import paramiko

        try:
            return self.chan.recv_stderr(n)
        except TimeoutError:
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
        # Closed without an exit status on a live connection: the remote shell itself was killed by
        # a signal (sshd sends exit-signal, which paramiko
        # does not report). ssh(1) says 255 then, too.
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
    """A local process's pipes, read and written by other threads (drains, feeders).

    `close()` must not free an fd while such a thread is in select() or read() on it: the number is
    reused by the next pipe this process opens (a git subprocess's, say), and a select() sleeping on
    a reused write end holds that pipe open, so its
    reader never sees EOF and hangs. So every use of an
    fd is counted, `close()` wakes the users through
    a pipe of its own and waits for them to leave."""

    _CLOSE_WAIT_S = 5.0

    def __init__(self, proc: subprocess.Popen[bytes], timeout_s: float | None) -> None:
        self.proc = proc
        self.timeout_s = timeout_s
        assert proc.stdin and proc.stdout and proc.stderr
        self._in = proc.stdin.fileno()
        os.set_blocking(self._in, False)
        self._wake_r, self._wake_w = os.pipe()
        self._users: dict[int, int] = {}  # fd -> threads in a syscall on it
        self._closing = False
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def _using(self, pipe: Any) -> Any:
        with self._idle:
            if self._closing or pipe is None or pipe.closed:
                raise _Closed()
            fd = pipe.fileno()
            self._users[fd] = self._users.get(fd, 0) + 1
        try:
            yield fd
        finally:
            with self._idle:
                self._users[fd] -= 1
                self._idle.notify_all()

    def _ready(self, fd: int, *, write: bool = False) -> None:
        r, w, _ = select.select(
            [self._wake_r] if write else [fd, self._wake_r],
            [fd] if write else [],
            [],
            self.timeout_s,
        )
        if self._wake_r in r:
            raise _Closed()
        if not (r or w):
            raise TimeoutError

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        sent = 0
        with self._using(self.proc.stdin) as fd:
            while sent < len(view):
                self._ready(fd, write=True)
                try:
                    sent += os.write(fd, view[sent : sent + (1 << 20)])
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ValueError, OSError) as exc:
                    raise _Closed() from exc

    def close_stdin(self) -> None:
        assert self.proc.stdin
        # not while a feeder is writing to it (the feeder calls this when it is done)
        with self._idle:
            if self._idle.wait_for(lambda: not self._users.get(self._in), self._CLOSE_WAIT_S):
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()

    def _read(self, pipe: Any, n: int) -> bytes:
        try:
            with self._using(pipe) as fd:
                self._ready(fd)
                return os.read(fd, n)
        except TimeoutError:
            raise
        except (_Closed, OSError):
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
        with self._idle:
            if self._closing:
                return
            self._closing = True
            os.write(self._wake_w, b"x")
            if not self._idle.wait_for(lambda: not any(self._users.values()), self._CLOSE_WAIT_S):
                # a thread is stuck in a syscall on them: leak
                # the fds rather than hand their numbers on
                return
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                if pipe:
                    pipe.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class _Transport(ABC):
    """How commands reach one node."""

    def __init__(self, node: SparkNode, settings: TransportSettings, where: str) -> None:
        self.node = node
        self.settings = settings
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
    def __init__(self, node: SparkNode, settings: TransportSettings) -> None:
        super().__init__(node, settings, f"local:{node.root}")
        self.root = Path(node.root)
        self.hidden_env = settings.hidden_env()

    def open(self, script: str, *, timeout_s: float | None, bulk: bool = False) -> _Stream:
        if not self.root.is_dir():
            raise SparkError(
                f"the node's root directory {self.root} does not exist; create it (the sandbox "
                "does: "
                "`lockstep sandbox up`) or fix `root` of this [[spark.nodes]] entry",
                node=self.node.name,
                where=self.where,
            )
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in self.hidden_env}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["HOME"] = str(home)
        proc = subprocess.Popen(
            ["sh", "-c", _no_exec(script)],
            cwd=self.root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        # fewer, larger reads and writes (1 MiB pipes instead of 64 KiB), where Linux allows it
        if bulk:
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError, AttributeError):
                    fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _CHUNK)  # type: ignore[union-attr]
        return _LocalStream(proc, timeout_s)


def _transport_factory(sock: socket.socket, **kwargs: Any) -> paramiko.Transport:
    import paramiko

    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    offered = list(options.ciphers)
    options.ciphers = [c for c in _CIPHERS if c in offered] + [
        c for c in offered if c not in _CIPHERS
    ]
    transport.packetizer.REKEY_BYTES = _REKEY_BYTES
    transport.packetizer.REKEY_PACKETS = _REKEY_PACKETS
    return transport


class _SshTransport(_Transport):
    def __init__(self, node: SparkNode, settings: TransportSettings) -> None:
        host = f"[{node.host}]" if ":" in node.host else node.host
        super().__init__(
            node, settings, f"{node.user + '@' if node.user else ''}{host}:{node.port}"
        )
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # -- connecting --

    def _error(self, message: str, cls: type[SparkError] = SparkError) -> SparkError:
        return cls(self.settings.say(message), node=self.node.name, where=self.where)

    def _silent(self, timeout: float) -> SparkError:
        return self._error(
            f"no answer within {timeout:g}s ([spark] connect_timeout_s: connect, ssh banner, "
            "authentication); "
            "is the node up and its sshd answering from here? Raise connect_timeout_s for a slow "
            "link",
            Unreachable,
        )

    def _known_hosts_name(self) -> str:
        return self.node.host if self.node.port == 22 else f"[{self.node.host}]:{self.node.port}"

    def _keyscan(self) -> str:
        port = "" if self.node.port == 22 else f"-p {self.node.port} "
        return (
            f"ssh-keyscan {port}-t ed25519 {self.node.host} >> "
            f"{shlex.quote(self.settings.known_hosts)}"
        )

    def connect(self) -> paramiko.SSHClient:
        """A new authenticated connection (host key checked first: on a refusal nothing runs)."""
        import paramiko

        from resources.spark.host_keys import _RefuseUnknownHost, _UnknownHost

        known_hosts = Path(self.settings.known_hosts).expanduser()
        if not known_hosts.is_file():
            raise self._error(
                f"known_hosts file {known_hosts} does not exist, so the node's host key cannot "
                "be checked; "
                "after confirming the fingerprint on the node (`ssh-keygen -lf "
                "/etc/ssh/ssh_host_ed25519_key.pub` "
                f"there), add it with `{self._keyscan()}`, or point [spark] known_hosts at the "
                "right file",
                HostKeyRefused,
            )
        client = paramiko.SSHClient()
        try:
            client.load_host_keys(str(known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise self._error(
                f"cannot read known_hosts {known_hosts}: {exc}", HostKeyRefused
            ) from None
        client.set_missing_host_key_policy(_RefuseUnknownHost())
        pkey = self.settings.pkey()
        timeout = self.settings.connect_timeout_s
        started = time.monotonic()
        try:
            client.connect(
                self.node.host,
                port=self.node.port,
                username=self.node.user or None,
                pkey=pkey,
                allow_agent=pkey is None,
                look_for_keys=pkey is None,
                passphrase=self.settings.current_passphrase() if pkey is None else None,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                transport_factory=_transport_factory,
            )
        except _UnknownHost as exc:
            client.close()
            raise self._error(
                f"the host key it offered ({exc.key.get_name()} {exc.key.fingerprint}) is not in "
                f"{known_hosts} under {self._known_hosts_name()}; refused — host keys are "
                "verified, never "
                "auto-added, and nothing was run. Check that fingerprint on the node itself "
                "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there), then add it: "
                f"`{self._keyscan()}`",
                HostKeyRefused,
            ) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise self._error(
                f"HOST KEY MISMATCH: it offered {exc.key.get_name()} {exc.key.fingerprint} but "
                f"{known_hosts} "
                f"has {exc.expected_key.get_name()} {exc.expected_key.fingerprint} for "
                f"{self._known_hosts_name()}; "
                "refused, nothing was run. The node was reinstalled — or something is in the "
                "middle. Confirm the "
                "new fingerprint on the node's console (`ssh-keygen -lf "
                "/etc/ssh/ssh_host_ed25519_key.pub`), then "
                f"replace the entry: `ssh-keygen -R '{self._known_hosts_name()}' -f "
                f"{shlex.quote(str(known_hosts))}` "
                f"and `{self._keyscan()}`",
                HostKeyRefused,
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            key = self.settings.key_path or "the agent's and ~/.ssh's keys"
            raise self._error(
                f"authentication as {self.node.user or '(current user)'} failed with {key} "
                f"({exc}); add the public "
                f"key to that user's ~/.ssh/authorized_keys on the node"
                + (
                    f" (`ssh-copy-id -i {self.settings.key_path}.pub -p {self.node.port} "
                    f"{self.node.user or 'USER'}@{self.node.host}`)"
                    if self.settings.key_path
                    else ""
                )
            ) from None
        except TimeoutError:
            client.close()
            raise self._silent(timeout) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            if time.monotonic() - started >= timeout:
                # A server that accepts and never sends its banner ends in paramiko's banner
                # timeout, which surfaces as "Error reading SSH protocol banner"
                # or "No existing session": it was silence.
                raise self._silent(timeout) from None
            raise self._error(
                f"cannot connect: {exc or type(exc).__name__}; is the node up, sshd listening on "
                "port "
                f"{self.node.port}, and the host/port in [[spark.nodes]] right?",
                Unreachable,
            ) from None
        transport = client.get_transport()
        assert transport is not None
        if self.settings.keepalive_s:
            transport.set_keepalive(self.settings.keepalive_s)
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
        import paramiko

        # Bulk streams get their own connection: they never queue behind (or stall) the control one.
        client = self.connect() if bulk else self._cached()
        transport = client.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise EOFError("connection is not active")
            chan = transport.open_session(
                window_size=_WINDOW if bulk else None,
                max_packet_size=_MAX_PACKET if bulk else None,
                timeout=self.settings.connect_timeout_s,
            )
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
                (
                    f"the connection dropped while starting a command ({exc}); it may or may "
                    "not have started"
                ),
                ConnectionLost,
            ) from None
        return _SshStream(chan, owned=client if bulk else None)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
