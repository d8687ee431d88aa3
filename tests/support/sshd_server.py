"""A real OpenSSH `sshd` on 127.0.0.1, for the SparkNodes tests and the fan-out bench.

Everything lives under a directory the caller owns: a fresh ed25519 host key, a client key (with a
passphrase, so key decryption is exercised), authorized_keys, a known_hosts line for
``[127.0.0.1]:PORT``, sshd_config and the PID file. sshd is started in the foreground
(``sshd -D -e -f CFG``) on a free port, polled until it sends its SSH banner, and stopped by its PID
(terminate, wait, kill) together with the per-connection sshd processes it forked; the loops are
tests/support/servers.py's. The machine's own sshd (port 22, /etc/ssh) is never touched.

Needs the `openssh-server` package (`./dev setup` installs it) and the privilege-separation
directory /run/sshd, which is created when missing.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import processes, start_on_free_port, stop_process, wait_until_ready

SSHD = os.environ.get("LOCKSTEP_SSHD", "/usr/sbin/sshd")
PASSPHRASE_ENV = "LOCKSTEP_TEST_SSH_PASSPHRASE"
# Throw-away: protects a key generated for one test session and deleted with its directory.
PASSPHRASE = "correct-horse-battery-staple-4f2c"

_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PidFile {pid_file}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowUsers {user}
MaxSessions 64
MaxStartups 64:30:128
LogLevel ERROR
"""


@dataclass
class SshdServer:
    """One running sshd and the files a client needs to reach it."""

    proc: subprocess.Popen[bytes]
    port: int
    root: Path
    user: str

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def client_key(self) -> Path:
        return self.root / "client_ed25519"

    @property
    def host_key(self) -> Path:
        return self.root / "host_ed25519"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def node(self, name: str, **extra: object) -> dict[str, object]:
        """A [[spark.nodes]] entry for this server."""
        return {
            "name": name,
            "transport": "ssh",
            "host": self.host,
            "port": self.port,
            "user": self.user,
            **extra,
        }

    def connection_pids(self, client_port: int) -> list[int]:
        """The sshd processes serving the TCP connection
        whose client side is 127.0.0.1:`client_port`.

        Found the way `ss -p` does: the socket's inode from /proc/net/tcp, then every process of
        ours holding a file descriptor on it.
        """
        inodes = set()
        local = f"0100007F:{self.port:04X}"
        remote = f"0100007F:{client_port:04X}"
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[2] == remote:
                inodes.add(f"socket:[{fields[9]}]")
        pids = []
        for pid in _descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                fd_dir = Path(f"/proc/{pid}/fd")
                if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                    pids.append(pid)
        return pids


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def _answers(port: int) -> bool:
    """True once sshd accepts a connection and sends its `SSH-2.0-...` banner."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (by PPid in /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for info in processes():
        children.setdefault(info.ppid, []).append(info.pid)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def make_keys(root: Path) -> None:
    """Host key, passphrase-protected client key, authorized_keys (no sshd needed)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, passphrase in (("host_ed25519", ""), ("client_ed25519", PASSPHRASE)):
        if not (root / name).exists():
            # -a 2: few KDF rounds, so decrypting this throw-away
            # key costs milliseconds, not 0.2 s a test.
            _run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-a",
                    "2",
                    "-N",
                    passphrase,
                    "-C",
                    f"lockstep-test-{name}",
                    "-f",
                    str(root / name),
                ]
            )
    (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
    (root / "client_ed25519").chmod(0o600)


def known_hosts_line(host: str, port: int, pubkey_file: Path) -> str:
    """`[host]:port ssh-ed25519 AAAA...` for a public key file."""
    kind, blob = pubkey_file.read_text().split()[:2]
    return f"[{host}]:{port} {kind} {blob}\n"


def start_sshd(root: Path, *, ready_timeout_s: float = 15.0, extra_config: str = "") -> SshdServer:
    """Start sshd for the current user under `root`; returns once it sends its banner.

    `extra_config`: more sshd_config lines, e.g. ``SetEnv PATH=...`` so a session finds a sandbox
    node's `docker` the way a DGX node's login finds the real one."""
    if not Path(SSHD).exists():
        raise RuntimeError(
            f"no sshd at {SSHD}: install it with `apt-get install -y openssh-server` "
            "(./dev setup does) or point LOCKSTEP_SSHD at one"
        )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    make_keys(root)
    user = getpass.getuser()

    def start(port: int) -> SshdServer:
        config = root / "sshd_config"
        config.write_text(_CONFIG.format(
            port=port, host_key=root / "host_ed25519", authorized_keys=root / "authorized_keys",
            pid_file=root / "sshd.pid", user=user,
        ) + extra_config)  # fmt: skip
        (root / "known_hosts").write_text(
            known_hosts_line("127.0.0.1", port, root / "host_ed25519.pub")
        )
        with open(root / "sshd.log", "wb") as log:
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        server = SshdServer(proc=proc, port=port, root=root, user=user)
        wait_until_ready(
            proc,
            lambda: _answers(port),
            timeout_s=ready_timeout_s,
            interval_s=0.05,
            log=server.log,
            tail_chars=2000,
            stop=lambda: stop_sshd(server),
            message=lambda _returncode, tail: (
                f"sshd did not answer within {ready_timeout_s} s; its log:\n{tail}"
            ),
        )
        return server

    return start_on_free_port(start)


def stop_sshd(server: SshdServer) -> None:
    """Stop exactly the sshd we started, by its PID,
    and the per-connection sshd processes it forked."""
    # Listed before the listener goes: once it has, they
    # are re-parented and no longer found under its PID.
    leftovers = _descendants(server.proc.pid) if server.proc.poll() is None else []
    stop_process(server.proc, grace_s=5)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def running_sshd(root: Path, *, extra_config: str = "") -> Iterator[SshdServer]:
    server = start_sshd(root, extra_config=extra_config)
    try:
        yield server
    finally:
        stop_sshd(server)
