"""The sandbox's DGX Spark nodes: local directories that stand in for the build node and the lane.

Each node runs its own real Docker engine (sandbox/engines.py: Debian's docker.io, one dockerd per
node, state under the node's ``engine/``). Only what cannot exist on one machine is simulated: the
GPU toolchain inside a build and the served model the bench tools talk to. build.sh runs in bash,
`docker build` is BuildKit, `docker save | docker load` moves real images between engines,
containers are real, and the bench tools are the real
`tool-eval-bench` and `llama-benchy` from .tools/bench.

A node is ``<sandbox>/nodes/<name>/``:

    bin/docker            wrapper: DOCKER_HOST=<this node's engine> /usr/bin/docker "$@" (starts the
    engine) bin/tool-eval-bench   wrapper: exec .tools/bench/bin/tool-eval-bench "$@"
    bin/llama-benchy      wrapper: .tools/bench/bin/llama-benchy
    "$@", offline (sandbox/bench_offline.py
                          leaves a tokenizer and the book in home/ on first use)
    engine/               the node's dockerd: data root, pidfile, log
    home/                 the node's $HOME (the `local`
    transport sets HOME here); bench knobs live here

The `local` transport of `resources.spark` runs a command in the node's root with ``root/bin`` first
on PATH and HOME=``root/home``, so these wrappers answer to `docker`, `tool-eval-bench` and
`llama-benchy` there. They name absolute paths (this python, the
project, the node) and so work from any working directory.

The one bench knob (`set_bench_knobs(node, fault="dead-pipe")`) stands in for the launcher the lane
runs its bench through: sm121's output pump before its fix (runbook: Bench pipe pump) killed the
tool on its first write, so the command exited 120
with no output; the wrappers then do exactly that.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from resources.site.spark import SparkNode, SparkSection
from sandbox.bench_offline import TOKENIZER_DIR
from sandbox.engines import DOCKER, ENGINE_DIR, Engine
from sandbox.layout import NODES, NODES_DIR, Sandbox

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BENCH_KNOBS = ".sandbox-bench.json"  # in the node's home: {"fault": "dead-pipe"}
BENCH_BIN = PROJECT_ROOT / ".tools" / "bench" / "bin"


def node_root(sandbox_root: Path, name: str) -> Path:
    return sandbox_root / NODES_DIR / name


def _docker_wrapper(node: Path, bases: list[str]) -> str:
    engine = Engine(node / ENGINE_DIR)
    sock, pidfile = shlex.quote(str(engine.socket)), shlex.quote(str(engine.pidfile))
    ensure = " ".join(
        [
            shlex.quote(sys.executable),
            "-m",
            "sandbox.engines",
            "ensure",
            shlex.quote(str(engine.state)),
            *(f"--base {b}" for b in bases),
        ]
    )
    return (
        "#!/bin/sh\n"
        f"# docker on sandbox DGX Spark node {node.name}: Debian's docker.io client against this "
        "node's own\n"
        "# engine (sandbox/engines.py; its state in engine/). The first command starts the "
        "engine.\n"
        "# Written by `lockstep sandbox up`; works from any directory.\n"
        # the sandbox dir may hold shell syntax
        f"DOCKER_HOST={shlex.quote(f'unix://{engine.socket}')}; export DOCKER_HOST\n"
        "DOCKER_BUILDKIT=1; export DOCKER_BUILDKIT\n"
        f'if ! {{ [ -S {sock} ] && pid=$(cat {pidfile} 2>/dev/null) && kill -0 "$pid" '
        "2>/dev/null; }; then\n"
        f"  PYTHONPATH={shlex.quote(str(PROJECT_ROOT))} {ensure} || exit 125\n"
        "fi\n"
        f'exec {shlex.quote(str(DOCKER))} "$@"\n'
    )


def node_bases(name: str) -> list[str]:
    """The base images a node's engine holds from its start: the build node builds FROM them."""
    return ["jovian"] if "build" in NODES.get(name, []) else []


def _bench_wrapper(node: Path, tool: str) -> str:
    real = shlex.quote(str(BENCH_BIN / tool))
    knobs = shlex.quote(str(node / "home" / BENCH_KNOBS))
    lines = [
        "#!/bin/sh",
        (
            f"# The real {tool} (.tools/bench) on sandbox DGX Spark node {node.name}. Written "
            "by `lockstep sandbox up`."
        ),
        (
            f"if [ ! -x {real} ]; then echo '{tool}: not installed: run ./dev setup (installs "
            ".tools/bench)' >&2; exit 127; fi"
        ),
        (
            "# The pre-fix sm121 launcher's dead output pump: exit 120, no output "
            "(set_bench_knobs fault=dead-pipe)."
        ),
        f"if [ -f {knobs} ] && grep -q '\"dead-pipe\"' {knobs}; then exit 120; fi",
    ]
    if tool == "llama-benchy":
        home = node / "home"
        tokenizer = shlex.quote(str(home / TOKENIZER_DIR / "tokenizer.json"))
        offline = (
            f"{shlex.quote(str(BENCH_BIN / 'python'))} "
            f"{shlex.quote(str(PROJECT_ROOT / 'sandbox' / 'bench_offline.py'))} "
            f"--home {shlex.quote(str(home))} --tokenizer {shlex.quote(str(home / TOKENIZER_DIR))}"
        )
        lines.append(f"[ -f {tokenizer} ] || {offline} || exit 1")
        lines.append("HF_HUB_OFFLINE=1; export HF_HUB_OFFLINE")
    lines.append(f'exec {real} "$@"')
    return "\n".join(lines) + "\n"


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(mode)
        os.replace(tmp, path)
    elif path.stat().st_mode & 0o777 != mode:
        path.chmod(mode)


def install_node(node: Path, bases: list[str] | None = None) -> Path:
    """Create (or repair) one node directory: bin/ wrappers, engine/ state, home/. Idempotent.
    `bases`: the base images its engine loads when it starts (default: by the node's role)."""
    node = node.resolve()
    for sub in ("bin", "home", ENGINE_DIR):
        (node / sub).mkdir(parents=True, exist_ok=True)
    wanted = node_bases(node.name) if bases is None else bases
    _write_if_changed(node / "bin" / "docker", _docker_wrapper(node, wanted), 0o755)
    for tool in ("tool-eval-bench", "llama-benchy"):
        _write_if_changed(node / "bin" / tool, _bench_wrapper(node, tool), 0o755)
    return node


def install_nodes(sb: Sandbox) -> list[Path]:
    """Create the sandbox's nodes under ``<sandbox>/nodes/`` (idempotent); return their roots."""
    return [install_node(node_root(sb.root, name)) for name in NODES]


def start_engines(sb: Sandbox) -> list[int]:
    """Start every node's engine now (``lockstep sandbox
    up``, ``lockstep demo``) with its bases loaded."""
    pids = []
    for name in NODES:
        engine = Engine(node_root(sb.root, name) / ENGINE_DIR)
        pids.append(engine.start())
        engine.ensure_bases(node_bases(name))
    return pids


def spark_section() -> SparkSection:
    """The site's [spark] table: the sandbox nodes, reached through the `local` transport."""
    return SparkSection(
        nodes=[
            SparkNode(name=name, transport="local", root=f"{NODES_DIR}/{name}", roles=roles)  # type: ignore[arg-type]
            for name, roles in NODES.items()
        ]
    )


def node_env(node: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the `local` transport gives a
    command on `node`: bin/ first on PATH, HOME=home/."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{node / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["HOME"] = str(node / "home")
    return env


def write_knobs(path: Path, knobs: dict[str, Any]) -> Path:
    """A sandbox node's knobs file: written when any knob
    is set, removed when none is (back to normal)."""
    if knobs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(knobs) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return path


def set_bench_knobs(node: Path, *, fault: str | None = None) -> Path:
    """Make the node's bench commands misbehave (`fault`: "dead-pipe" = exit 120 with no output, the
    runbook's dead pipe pump). None: back to normal.
    (A low score comes from the served image instead:
    a rev marked broken, sandbox/model_server.py.)"""
    return write_knobs(node / "home" / BENCH_KNOBS, {"fault": fault} if fault is not None else {})
