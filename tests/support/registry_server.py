"""A real `docker-registry` (Debian's build of
distribution/distribution) on 127.0.0.1, for tests and benches.

Started with subprocess.Popen on a free port with filesystem storage under a directory the caller
owns, polled on /v2/ until it answers 200, and stopped by its PID (terminate, wait, kill); the
loops are tests/support/servers.py's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import start_on_free_port, stop_process, wait_until_ready

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
# Basic auth against a bcrypt htpasswd file (distribution's `htpasswd` access controller).
_AUTH = """\
auth:
  htpasswd:
    realm: lockstep-test
    path: {htpasswd}
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


def _answers(port: int, *, authed: bool = False) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:
        return authed and exc.code == 401  # it answers, and wants a login
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def start_registry(
    root: Path, *, ready_timeout_s: float = 15.0, htpasswd: Path | None = None
) -> RegistryServer:
    """Start a registry storing under `root`; returns once /v2/ answers 200 (401 with `htpasswd`:
    then every request needs basic auth as a user of that bcrypt htpasswd file)."""
    root.mkdir(parents=True, exist_ok=True)
    binary = registry_binary()

    def start(port: int) -> RegistryServer:
        config = root / "config.yml"
        config.write_text(
            _CONFIG.format(storage=root / "storage", port=port)
            + (_AUTH.format(htpasswd=htpasswd) if htpasswd else "")
        )
        with open(root / "registry.log", "wb") as log:
            proc = subprocess.Popen(
                [binary, "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        server = RegistryServer(proc=proc, port=port, root=root)
        wait_until_ready(
            proc,
            lambda: _answers(port, authed=htpasswd is not None),
            timeout_s=ready_timeout_s,
            interval_s=0.05,
            log=server.log,
            tail_chars=2000,
            stop=lambda: stop_registry(server),
            message=lambda _returncode, tail: (
                f"docker-registry did not answer on /v2/ within {ready_timeout_s} s; its "
                f"log:\n{tail}"
            ),
        )
        return server

    return start_on_free_port(start)


def stop_registry(server: RegistryServer) -> None:
    """Stop exactly the process we started, by its PID."""
    stop_process(server.proc, grace_s=5)


@contextlib.contextmanager
def running_registry(root: Path, *, htpasswd: Path | None = None) -> Iterator[RegistryServer]:
    server = start_registry(root, htpasswd=htpasswd)
    try:
        yield server
    finally:
        stop_registry(server)
