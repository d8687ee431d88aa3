"""The sandbox's real Docker engines and its git daemon: started, found and stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import git
import pytest

from sandbox.engines import DOCKER, Engine, engine_dirs, running_states, stop_engines
from sandbox.git_server import GitServer, running_servers
from sandbox.processes import alive, command_lines


def engine_processes(engine: Engine) -> list[int]:
    """Every process (dockerd, containerd, shims) whose
    command line names the engine's run dir or state."""
    needles = (str(engine.run_dir), str(engine.state))
    return [
        pid for pid, argv in command_lines() if any(n in word for word in argv for n in needles)
    ]


def docker(engine: Engine, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DOCKER), *argv],
        env=engine.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_engine_runs_its_containers_and_stops_with_them_by_pid(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "node" / "engine")
    pid = engine.start()
    try:
        assert engine.start() == pid  # idempotent: the running engine is kept
        assert engine.pid() == pid and alive(pid) and engine.socket.is_socket()
        engine.ensure_bases(["python"])
        loaded = docker(
            engine, "image", "inspect", "--format", "{{.Id}}", "lockstep-sandbox/python:3.11"
        ).stdout
        engine.ensure_bases(["python"])  # already there: not loaded again
        assert (
            docker(
                engine, "image", "inspect", "--format", "{{.Id}}", "lockstep-sandbox/python:3.11"
            ).stdout
            == loaded
        )
        run = docker(
            engine,
            "run",
            "-d",
            "--network",
            "none",
            "lockstep-sandbox/python:3.11",
            "python",
            "-c",
            "import time; time.sleep(300)",
        )
        assert run.returncode == 0, run.stderr
        assert running_states(tmp_path) == [engine.state] and engine.state in engine_dirs(tmp_path)
        assert len(engine_processes(engine)) >= 3  # dockerd, containerd, the container's shim
    finally:
        assert stop_engines(tmp_path) == [engine.state]
    assert not alive(pid) and engine_processes(engine) == [] and not engine.run_dir.exists()
    assert stop_engines(tmp_path) == []  # nothing left to stop
    shutil.rmtree(tmp_path / "node")  # nothing mounted under it any more


def test_a_killed_engine_leaves_nothing_running_or_mounted_after_stop(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "engine")
    pid = engine.start()
    os.kill(pid, signal.SIGKILL)  # a crash: its data root stays mounted

    def mounts() -> list[str]:
        return [
            line
            for line in Path("/proc/mounts").read_text().splitlines()
            if str(engine.state) in line
        ]

    while alive(pid):
        time.sleep(0.05)
    assert mounts(), "dockerd mounts its data root; a killed one leaves it mounted"
    with pytest.raises(OSError):
        shutil.rmtree(engine.state)
    assert not engine.stop()  # it was not running, but what it left is cleaned up
    assert engine_processes(engine) == [] and mounts() == []
    shutil.rmtree(engine.state)


def test_the_git_daemon_serves_the_sandbox_repos_keeps_its_port_and_stops_by_pid(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sandbox"
    bare = root / "repos" / "fork.git"
    git.Repo.init(bare, bare=True)
    work = git.Repo.init(tmp_path / "work")
    (tmp_path / "work" / "f").write_text("x\n")
    work.index.add(["f"])
    sha = work.index.commit("one").hexsha
    work.git.push(bare.as_uri(), "HEAD:refs/heads/main")

    server = GitServer(root)
    port = server.ensure()
    try:
        assert server.ensure() == port and server.url(bare) == f"git://127.0.0.1:{port}/fork.git"
        listed = subprocess.run(
            ["git", "ls-remote", server.url(bare), "main"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert listed.stdout.split() == [sha, "refs/heads/main"]
        assert [s.root for s in running_servers(tmp_path)] == [root]
        first = server.pid()
        assert first is not None and server.stop() and not alive(first)
        assert running_servers(tmp_path) == [] and not server.stop()
        assert server.ensure() == port  # the same URL after a restart: build files keep naming it
    finally:
        server.stop()
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run(
            ["git", "ls-remote", server.url(bare)], capture_output=True, timeout=30, check=True
        )
