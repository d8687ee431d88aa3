"""A real `docker-registry` (Debian's build of distribution/distribution) on 127.0.0.1, for tests and benches.

Started with subprocess.Popen on a free port with filesystem storage under a directory the caller
owns, polled on /v2/ until it answers 200, and stopped by its PID (terminate, wait, kill).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Debian's package installs /usr/bin/docker-registry; upstream's binary is called `registry`.
_CANDIDATES = ("docker-registry", "registry")

_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
"""


@dataclass
class RegistryServer:
    """One running registry: `host` is what HttpRegistry(host=...) takes."""

    proc: subprocess.Popen[bytes]
    port: int
    root: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "registry.log"


def registry_binary() -> str:
    """The registry binary, or an error that says how to install it."""
    if env := os.environ.get("LOCKSTEP_DOCKER_REGISTRY"):
        return env
    for name in _CANDIDATES:
        if found := shutil.which(name):
            return found
    raise RuntimeError(
        "no docker-registry binary on PATH: install it with `apt-get install -y docker-registry` "
        "(./dev setup does) or point LOCKSTEP_DOCKER_REGISTRY at one"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def start_registry(root: Path, *, ready_timeout_s: float = 15.0) -> RegistryServer:
    """Start a registry storing under `root`; returns once /v2/ answers 200."""
    root.mkdir(parents=True, exist_ok=True)
    binary = registry_binary()
    # A free port can be taken between our probe and the registry's bind: try a few.
    last_log = ""
    for _ in range(3):
        port = _free_port()
        config = root / "config.yml"
        config.write_text(_CONFIG.format(storage=root / "storage", port=port))
        with open(root / "registry.log", "wb") as log:
            proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        server = RegistryServer(proc=proc, port=port, root=root)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(port):
                return server
            time.sleep(0.05)
        stop_registry(server)
        last_log = server.log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"docker-registry did not answer on /v2/ within {ready_timeout_s} s; its log:\n{last_log}")


def stop_registry(server: RegistryServer) -> None:
    """Stop exactly the process we started, by its PID."""
    if server.proc.poll() is not None:
        return
    server.proc.terminate()
    try:
        server.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=5)


@contextlib.contextmanager
def running_registry(root: Path) -> Iterator[RegistryServer]:
    server = start_registry(root)
    try:
        yield server
    finally:
        stop_registry(server)
