"""`lockstep sandbox down`: everything a sandbox runs stops, found by the PIDs it recorded; a second
`down` finds nothing; and a machine without docker.io is told which package to install."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from lockstep.cli import main
from sandbox import engines
from sandbox.engines import DOCKER, ENGINE_DIR, Engine, EngineError, require_docker_io
from sandbox.git_server import GitServer
from sandbox.gpu_toolchain import CUDA_BASE_TAG
from sandbox.layout import BUILD_NODE
from sandbox.processes import alive
from sandbox.spark_nodes import node_root, start_engines
from sandbox.teardown import stop_sandbox
from sandbox.world import up
from tests.support.servers import processes


def _tree(pids: list[int]) -> set[int]:
    """`pids` and every live process below them (by PPid in /proc)."""
    children: dict[int, list[int]] = {}
    for info in processes():
        if info.state != "Z":
            children.setdefault(info.ppid, []).append(info.pid)
    found, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_down_stops_engines_containers_and_the_git_daemon_and_a_second_down_finds_nothing(
    tmp_path: Path,
) -> None:
    sb = up(tmp_path / "sandbox")
    try:
        dockerds = start_engines(sb)
        build = Engine(node_root(sb.root, BUILD_NODE) / ENGINE_DIR)
        # A container that would run for minutes, on the
        # build node's engine (its Jovian base is loaded).
        run = subprocess.run(
            [
                str(DOCKER),
                "-H",
                build.host,
                "run",
                "-d",
                "--network",
                "none",
                "--name",
                "sleeper",
                CUDA_BASE_TAG,
                "python3",
                "-c",
                "import time; time.sleep(600)",
            ],
            env=build.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        git_port = GitServer(sb.root).ensure()
        git_pid = GitServer(sb.root).pid()
        assert git_pid is not None and git_port > 0
        # dockerd, its containerd, the shim, the container's python
        running = _tree([*dockerds, git_pid])
        assert len(running) > len(dockerds) + 2, running

        result = CliRunner().invoke(
            main, ["sandbox", "down", "--dir", str(sb.root)], catch_exceptions=False
        )

        assert result.exit_code == 0, result.output
        assert (
            f"container {run.stdout.strip()[:12]} on the engine of {build.state}" in result.output
        )
        assert f"git daemon (pid {git_pid})" in result.output
        assert all(f"dockerd pid {pid}" in result.output for pid in dockerds), result.output
        assert [pid for pid in running if alive(pid)] == []
        assert not GitServer(sb.root).pid() and not any(
            Engine(s).running() for s in engines.engine_dirs(sb.root)
        )

        again = CliRunner().invoke(
            main, ["sandbox", "down", "--dir", str(sb.root)], catch_exceptions=False
        )
        assert (
            again.exit_code == 0
            and "stopped" not in again.output
            and "nothing runs" in again.output
        )
        assert stop_sandbox(sb.root) == []
    finally:
        stop_sandbox(sb.root)


def test_down_on_a_directory_without_a_sandbox_is_a_no_op(tmp_path: Path) -> None:
    assert stop_sandbox(tmp_path / "never-made") == []
    assert stop_sandbox(tmp_path) == []


def test_without_docker_io_the_error_names_the_package_and_up_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "DOCKERD", tmp_path / "no-dockerd")
    with pytest.raises(EngineError, match=r"no-dockerd not found.*install Debian's docker\.io"):
        require_docker_io()

    result = CliRunner().invoke(main, ["sandbox", "up", "--dir", str(tmp_path / "sb")])

    assert result.exit_code != 0 and "docker.io" in result.output
    assert not (tmp_path / "sb").exists()  # refused before anything was made
