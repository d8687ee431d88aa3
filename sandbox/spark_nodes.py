"""The sandbox's DGX Spark nodes: local directories that stand in for the build node and the lane.

Only what cannot exist on one machine is simulated: the nodes' docker daemon (`sandbox/fake_docker.py`)
and the served model that tool-eval-bench talks to (`sandbox/fake_bench.py`). Everything else is real:
build.sh runs in bash, the forks are fetched with git, `docker save | docker load` is a real byte
stream, and boot gates run a real python on the image's installed packages.

A node is ``<sandbox>/nodes/<name>/``:

    bin/docker            wrapper: python -m sandbox.fake_docker --state <node>/docker "$@"
    bin/tool-eval-bench   wrapper: python -m sandbox.fake_bench --docker-state <node>/docker "$@"
    docker/               the node's image store (images/<id>/, repositories.json)
    home/                 the node's $HOME (the `local` transport sets HOME here); bench knobs live here

The `local` transport of `resources.spark` runs a command in the node's root with ``root/bin`` first on
PATH and HOME=``root/home``, so these wrappers answer to `docker` and `tool-eval-bench` there. They name
absolute paths (this python, the project, the node) and so work from any working directory.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from resources.site import SparkNode, SparkSection
from sandbox.layout import NODES, NODES_DIR, Sandbox

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BENCH_KNOBS = ".sandbox-bench.json"  # in the node's home: {"score": 60.0, "fault": "dead-pipe"}


def node_root(sandbox_root: Path, name: str) -> Path:
    return sandbox_root / NODES_DIR / name


def _wrapper(node: Path, module: str, state_flag: str, what: str) -> str:
    python = shlex.quote(sys.executable)
    project = shlex.quote(str(PROJECT_ROOT))
    state = shlex.quote(str(node / "docker"))
    return (
        "#!/bin/sh\n"
        f"# {what} on sandbox DGX Spark node {node.name} (simulator: {module.replace('.', '/')}.py).\n"
        "# Written by `lockstep sandbox up`; works from any directory.\n"
        f"PYTHONPATH={project} exec {python} -m {module} {state_flag} {state} \"$@\"\n"
    )


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(mode)
        os.replace(tmp, path)
    elif path.stat().st_mode & 0o777 != mode:
        path.chmod(mode)


def install_node(node: Path) -> Path:
    """Create (or repair) one node directory: bin/ wrappers, docker/ state, home/. Idempotent."""
    node = node.resolve()
    for sub in ("bin", "home", "docker"):
        (node / sub).mkdir(parents=True, exist_ok=True)
    _write_if_changed(node / "bin" / "docker", _wrapper(node, "sandbox.fake_docker", "--state", "docker"), 0o755)
    _write_if_changed(node / "bin" / "tool-eval-bench",
                      _wrapper(node, "sandbox.fake_bench", "--docker-state", "tool-eval-bench"), 0o755)
    return node


def install_nodes(sb: Sandbox) -> list[Path]:
    """Create the sandbox's nodes under ``<sandbox>/nodes/`` (idempotent); return their roots."""
    return [install_node(node_root(sb.root, name)) for name in NODES]


def spark_section() -> SparkSection:
    """The site's [spark] table: the sandbox nodes, reached through the `local` transport."""
    return SparkSection(nodes=[
        SparkNode(name=name, transport="local", root=f"{NODES_DIR}/{name}", roles=roles)  # type: ignore[arg-type]
        for name, roles in NODES.items()
    ])


def node_env(node: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the `local` transport gives a command on `node`: bin/ first on PATH, HOME=home/."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{node / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["HOME"] = str(node / "home")
    return env


def set_bench_knobs(node: Path, *, score: float | None = None, fault: str | None = None) -> Path:
    """Make the node's tool-eval-bench score `score` (e.g. under the baseline) or misbehave (`fault`:
    "dead-pipe" = exit 120 with no output, the runbook's dead pipe pump). Both None: back to normal."""
    path = node / "home" / BENCH_KNOBS
    knobs = {k: v for k, v in (("score", score), ("fault", fault)) if v is not None}
    if knobs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(knobs) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return path
