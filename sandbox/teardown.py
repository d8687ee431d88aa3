"""Stop everything a sandbox runs, by the PIDs it recorded: `lockstep sandbox down`, the demo's
Ctrl-C, and the test fixtures all come here, so there
is one list of what a sandbox can leave running.

In order: iris jobs (their worker process groups, from ``<sandbox>/iris/jobs/*/state.json``); every
container on every engine of the sandbox (the lane's serving containers among them)
(``docker rm -f``, against that engine's own socket); the engines themselves (``dockerd`` by the PID
in its pidfile, which takes its containerd and shims with it); the git daemon. Each step is
idempotent and finds nothing on a sandbox that runs nothing, so a second ``down`` is a no-op.
Nothing here touches the machine's own docker service: every docker command names its engine's
socket with ``-H`` (an unset or inherited DOCKER_HOST cannot send it to ``/var/run/docker.sock``),
and only engines whose state directory lies under the sandbox are stopped.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from sandbox.engines import DOCKER, Engine, engine_dirs, stop_engines
from sandbox.git_server import GitServer

DOCKER_TIMEOUT_S = 60


def stop_sandbox(root: Path) -> list[str]:
    """Stop what the sandbox at `root` runs; return
    one line per thing stopped (empty: nothing ran)."""
    root = Path(root).resolve()
    stopped: list[str] = []
    if not root.is_dir():
        return stopped
    stopped += [f"iris job {job_id}" for job_id in _stop_iris_jobs(root / "iris")]
    for state in dict.fromkeys(engine_dirs(root)):
        stopped += [
            f"container {cid} on the engine of {state}" for cid in _remove_containers(Engine(state))
        ]
    pids = {state: Engine(state).pid() for state in dict.fromkeys(engine_dirs(root))}
    stopped += [f"engine {state} (dockerd pid {pids.get(state)})" for state in stop_engines(root)]
    git = GitServer(root)
    git_pid = git.pid()
    if git.stop():
        stopped.append(f"git daemon (pid {git_pid})")
    return stopped


def _stop_iris_jobs(home: Path) -> list[str]:
    if not (home / "jobs").is_dir():
        return []
    from sandbox.fake_iris import stop_all

    return stop_all(home)


def _remove_containers(engine: Engine) -> list[str]:
    """`docker rm -f` every container of a running
    engine (never starts one); return their short ids."""
    if not engine.running():
        return []

    def docker(*argv: str) -> subprocess.CompletedProcess[str] | None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            return subprocess.run(
                [str(DOCKER), "-H", engine.host, *argv],
                env=engine.env(),
                capture_output=True,
                text=True,
                check=False,
                timeout=DOCKER_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        return None

    listed = docker("ps", "-aq", "--no-trunc")
    ids = listed.stdout.split() if listed is not None and listed.returncode == 0 else []
    if not ids:
        return []
    removed = docker("rm", "-f", *ids)
    # When rm fails the engine's own stop (next) still ends its containers; say only what rm did.
    return [cid[:12] for cid in ids] if removed is not None and removed.returncode == 0 else []
