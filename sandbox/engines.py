"""Real Docker engines for the sandbox: one ``dockerd``
per node directory, started and stopped by PID.

Each sandbox Spark node (and the sandbox's kaniko stand-in) gets its own engine, Debian's
``docker.io`` run as root exactly as its contract says::

    dockerd --data-root STATE/root --exec-root RUN/exec
    --pidfile STATE/pid -H unix://RUN/docker.sock \
            --iptables=false --bridge=none

STATE is ``<node>/engine`` (images, containers, the log); RUN is a short directory under ``/run``
named by a hash of STATE, because a unix socket path may not exceed 108 bytes and pytest's
directories are long. The node's ``bin/docker`` wrapper sets ``DOCKER_HOST`` to that socket and
``DOCKER_BUILDKIT=1`` and runs Debian's own client, ``/usr/bin/docker``: the newer static client
some machines put first on PATH refuses BuildKit without the buildx plugin. The first docker command
on a node starts its engine (``ensure``); ``lockstep sandbox down`` and the test fixtures stop every
engine of a sandbox by the PID in its pidfile. The machine's own docker service is never touched.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import hashlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox.processes import alive, command_lines

DOCKERD = Path("/usr/sbin/dockerd")
DOCKER = Path("/usr/bin/docker")  # the engine's own client (docker.io), BuildKit built in
RUN_ROOT = Path("/run/lockstep-engines")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 5  # dockerd's own grace for running containers when it stops
ENGINE_DIR = "engine"
# Named bases a node can ask for: name -> "module:function" returning a sandbox.base_image.BaseSpec.
BASES: dict[str, str] = {
    "python": "sandbox.engines:python_base",
    "jovian": "sandbox.gpu_toolchain:jovian_base",
    "deploy": "sandbox.deploy_images:deploy_base",
    "postgres": "sandbox.deploy_images:postgres_base",
}


class EngineError(RuntimeError):
    """An engine could not be started or stopped; the message says what to do."""


def require_docker_io() -> None:
    """One clear error on a machine without Debian's docker.io (the engine and its client)."""
    missing = [str(p) for p in (DOCKERD, DOCKER) if not p.is_file()]
    if missing:
        raise EngineError(
            f"{' and '.join(missing)} not found: the sandbox's nodes run real Docker engines; "
            "install Debian's docker.io (apt-get install docker.io, or ./dev setup)"
        )


def python_base():
    from sandbox.base_image import BaseSpec

    return BaseSpec(tags=("lockstep-sandbox/python:3.11",))


@dataclass(frozen=True)
class Engine:
    """One engine, by its state directory."""

    state: Path

    @property
    def run_dir(self) -> Path:
        return RUN_ROOT / hashlib.sha256(str(self.state.resolve()).encode()).hexdigest()[:16]

    @property
    def socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pidfile(self) -> Path:
        return self.state / "pid"

    @property
    def log(self) -> Path:
        return self.state / "dockerd.log"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["DOCKER_HOST"] = self.host
        env["DOCKER_BUILDKIT"] = "1"
        return env

    def pid(self) -> int | None:
        """The engine's PID when its pidfile names a live dockerd, else None."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"dockerd" in cmdline and str(self.state).encode() in cmdline else None

    def ping(self, timeout_s: float = 2.0) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout_s)
                s.connect(str(self.socket))
                s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                return s.recv(64).split(b"\r\n", 1)[0].endswith(b" 200 OK")
        except OSError:
            return False

    def running(self) -> bool:
        return self.pid() is not None and self.ping()

    def start(self) -> int:
        """Start the engine unless it runs; return its PID
        (0: it answers, but its PID is not visible from
        here, as in a container given only the socket). Safe from several processes at once."""
        if self.ping():
            return self.pid() or 0
        require_docker_io()
        self.state.mkdir(parents=True, exist_ok=True)
        with _locked(self.state / "lock"):
            pid = self.pid()
            if pid is not None and self.ping():
                return pid
            if pid is not None:
                _stop_pid(pid)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "state").write_text(str(self.state.resolve()), encoding="utf-8")
            argv = [
                str(DOCKERD),
                "--data-root",
                str(self.state / "root"),
                "--exec-root",
                str(self.run_dir / "exec"),
                "--pidfile",
                str(self.pidfile),
                "-H",
                self.host,
                "--iptables=false",
                "--bridge=none",
                "--shutdown-timeout",
                str(SHUTDOWN_TIMEOUT_S),
            ]
            with self.log.open("ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    close_fds=True,
                )
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise EngineError(
                        f"dockerd for {self.state} exited {proc.returncode} at start: "
                        f"{_tail(self.log)} (its log: {self.log})"
                    )
                if self.ping(0.5):
                    return proc.pid
                time.sleep(0.05)
            _stop_pid(proc.pid)
            raise EngineError(
                f"dockerd for {self.state} did not answer on {self.socket} in "
                f"{START_TIMEOUT_S:.0f} s "
                f"(its log: {self.log})"
            )

    def stop(self) -> bool:
        """Stop the engine by its PID (its containers,
        its containerd and their shims stop with it)."""
        with _locked(self.state / "lock") if self.state.is_dir() else contextlib.nullcontext():
            pid = self.pid()
            if pid is not None:
                _stop_pid(pid)
            _kill_leftovers(self.run_dir)
            _unmount_under(self.state)
            _unmount_under(self.run_dir)
            # its socket and exec-root: nothing to keep
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return pid is not None

    def ensure_bases(self, names: list[str]) -> None:
        """Load each named base (sandbox/base_image.py) unless the engine already holds its tags."""
        for name in names:
            module, _, func = BASES[name].partition(":")
            spec = getattr(importlib.import_module(module), func)()
            from sandbox.base_image import BaseImageError, base_archive, image_id

            have = subprocess.run(
                [str(DOCKER), "image", "inspect", "--format", "{{.Id}}", *spec.tags],
                env=self.env(),
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            try:
                archive = base_archive(spec)
            except (BaseImageError, OSError) as exc:
                # A process that cannot read this machine's files (a run container given the
                # engine's socket) uses the base the engine already
                # holds, loaded by whoever made the sandbox.
                if have.returncode == 0:
                    continue
                raise EngineError(
                    f"base {name} is not in {self.state} and cannot be made here: {exc}"
                ) from exc
            want = image_id(archive)
            if have.returncode == 0 and set(have.stdout.split()) == {want}:
                continue
            load = subprocess.run(
                [str(DOCKER), "load", "-q", "-i", str(archive)],
                env=self.env(),
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
            if load.returncode != 0:
                raise EngineError(
                    f"docker load of base {name} ({archive}) into {self.state}: "
                    f"{load.stderr.strip()}"
                )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)


def _kill_leftovers(run_dir: Path) -> None:
    """A containerd or shim that outlived its dockerd
    (a kill -9, a crash) names the run dir: stop it."""
    needle = str(run_dir)
    for pid, argv in command_lines():
        if pid != os.getpid() and any(needle in word for word in argv):
            _stop_pid(pid)


def _unmount_under(state: Path) -> None:
    """dockerd bind-mounts its data root (and overlay
    layers under it); an engine that was killed leaves
    them mounted, and then its directory cannot be
    removed. Lazily unmount what is left, deepest first."""
    prefix = str(state.resolve()) + "/"
    try:
        points = [
            line.split()[1].replace("\\040", " ")
            for line in Path("/proc/mounts").read_text().splitlines()
        ]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)


def running_states(root: Path) -> list[Path]:
    """The state dirs of the engines running under `root`, read off the running dockerds' --pidfile
    (no walk of the tree: an engine's data root holds every layer it ever unpacked)."""
    prefix = str(root.resolve()) + "/"
    found = []
    for _pid, argv in command_lines():
        if argv[0].endswith("dockerd") and "--pidfile" in argv[:-1]:
            pidfile = argv[argv.index("--pidfile") + 1]
            if pidfile.startswith(prefix):
                found.append(Path(pidfile).parent)
    return sorted(found)


def engine_dirs(root: Path) -> list[Path]:
    """Every engine state directory of a sandbox: the
    nodes', the TPU build's, and any running under it."""
    if not root.is_dir():
        return []
    known = [*root.glob(f"nodes/*/{ENGINE_DIR}"), *root.glob(f"iris/{ENGINE_DIR}")]
    return sorted({*(p for p in known if p.is_dir()), *running_states(root)})


def stop_engines(root: Path) -> list[Path]:
    """Stop every engine of the sandbox at `root` by
    PID; return the state dirs that were running."""
    states = list(dict.fromkeys(engine_dirs(root)))
    # In parallel: each dockerd gives its containers SHUTDOWN_TIMEOUT_S to stop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(states))) as pool:
        stopped = list(pool.map(lambda state: Engine(state).stop(), states))
    return [state for state, was in zip(states, stopped, strict=True) if was]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.engines")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ensure = sub.add_parser(
        "ensure", help="start the engine of STATE unless it runs; load the named bases"
    )
    ensure.add_argument("state", type=Path)
    ensure.add_argument("--base", action="append", default=[], choices=sorted(BASES))
    stop = sub.add_parser("stop", help="stop every engine under a sandbox root")
    stop.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "ensure":
            engine = Engine(args.state)
            engine.start()
            engine.ensure_bases(args.base)
        else:
            for state in stop_engines(args.root):
                print(f"stopped the engine of {state}")
    except Exception as exc:  # noqa: BLE001 - the wrapper's caller sees one line, not a traceback
        print(f"sandbox engine: {exc}", file=sys.stderr)
        return 125
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
