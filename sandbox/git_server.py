"""The sandbox's git server: ``git daemon`` on 127.0.0.1 serving the sandbox's bare repos.

A build inside a Docker engine cannot see the host's ``file://`` repos; it reaches this server over
the host network (``docker build --network=host``), as a real build reaches GitHub. Read-only (the
daemon's default: no ``receive-pack``). The port is chosen once per sandbox and kept in
``<sandbox>/gitd/port``, so the ``git://127.0.0.1:PORT/...`` URLs written into build files stay
valid across restarts. Started on first use (``ensure``),
stopped by the PID in ``<sandbox>/gitd/pid``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox.processes import alive, command_lines

START_TIMEOUT_S = 10.0


class GitServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class GitServer:
    """The git daemon of the sandbox at `root`, serving `root/repos`."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / "gitd"

    @property
    def base_path(self) -> Path:
        return self.root / "repos"

    def port(self) -> int:
        """The sandbox's git port, chosen (a free one) the first time it is asked for."""
        self.state.mkdir(parents=True, exist_ok=True)
        with _locked(self.state / "lock"):
            return self._port()

    def _port(self) -> int:
        path = self.state / "port"
        if path.is_file():
            return int(path.read_text().strip())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        path.write_text(f"{port}\n", encoding="utf-8")
        return port

    def url(self, bare: Path) -> str:
        """The git:// URL of a bare repo under ``<sandbox>/repos``."""
        rel = bare.resolve().relative_to(self.base_path.resolve())
        return f"git://127.0.0.1:{self.port()}/{rel.as_posix()}"

    def url_base(self) -> str:
        """``git://127.0.0.1:PORT/``: the daemon's root,
        under which each bare repo is its relative path."""
        return f"git://127.0.0.1:{self.port()}/"

    def pid(self) -> int | None:
        try:
            pid = int((self.state / "pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"daemon" in cmdline and str(self.base_path).encode() in cmdline else None

    def _answers(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def ensure(self) -> int:
        """Start the daemon unless it runs; return its port."""
        self.state.mkdir(parents=True, exist_ok=True)
        with _locked(self.state / "lock"):
            port = self._port()
            if self.pid() is not None and self._answers(port):
                return port
            argv = [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--listen=127.0.0.1",
                f"--port={port}",
                f"--base-path={self.base_path}",
                f"--pid-file={self.state / 'pid'}",
                "--informative-errors",
                str(self.base_path),
            ]
            with (self.state / "log").open("ab") as log:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise GitServerError(
                        f"git daemon on 127.0.0.1:{port} exited {proc.returncode} "
                        f"(port taken? its log: {self.state / 'log'})"
                    )
                if self._answers(port):
                    (self.state / "pid").write_text(f"{proc.pid}\n", encoding="utf-8")
                    return port
                time.sleep(0.05)
            proc.kill()
            raise GitServerError(
                f"git daemon did not listen on 127.0.0.1:{port} in {START_TIMEOUT_S:.0f} s"
            )

    def stop(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not alive(pid):
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        return True


def running_servers(root: Path) -> list[GitServer]:
    """The sandbox git daemons running under `root` (read off their --pid-file), for a teardown that
    does not know each sandbox's root."""
    prefix = str(root.resolve()) + "/"
    found = []
    for _pid, argv in command_lines():
        pidfile = next(
            (a.removeprefix("--pid-file=") for a in argv if a.startswith("--pid-file=")), ""
        )
        if "daemon" in argv and pidfile.startswith(prefix):
            found.append(GitServer(Path(pidfile).parent.parent))
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
