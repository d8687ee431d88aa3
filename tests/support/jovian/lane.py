"""The sandbox lane's nodes, `docker` on one of them,
and a tiny real image of a rev built on them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sandbox.spark_nodes import node_env

LANE_NODES = ("spark-a", "spark-b")


def docker(node: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`docker ...` on a sandbox node, the way the `local` transport runs it."""
    return subprocess.run(
        ["docker", *argv],
        cwd=node,
        env=node_env(node),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


MODEL_SERVER = (Path(__file__).resolve().parents[3] / "sandbox" / "model_server.py").read_text(
    encoding="utf-8"
)


VLLM_SCRIPT = (
    "#!/usr/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n"
)


def tiny_image(nodes: list[Path], tmp: Path, rev: str, knobs: str = "") -> str:
    """A small real image of a rev (FROM the sandbox's Python base: a `vllm` package whose CLI is
    the sandbox's model server, `knobs` its vllm/sandbox_model.toml)
    built on the first node and moved to the
    others by `docker save | docker load`, as jovian/distributed_image does; its image ID."""
    ctx = tmp / f"ctx-{rev}-{abs(hash(knobs))}"
    pkg = ctx / "site" / "vllm"
    (pkg / "entrypoints" / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"REV = {rev!r}\n__version__ = '0.26.1rc0+glm53.{rev}'\n")
    for sub in ("entrypoints", "entrypoints/cli"):
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "entrypoints" / "cli" / "main.py").write_text(MODEL_SERVER)
    if knobs:
        (pkg / "sandbox_model.toml").write_text(knobs)
    info = ctx / "site" / f"vllm-0.26.1rc0+glm53.{rev}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.1rc0+glm53.{rev}\n"
    )
    (ctx / "vllm").write_text(VLLM_SCRIPT)
    (ctx / "vllm").chmod(0o755)
    (ctx / "Dockerfile").write_text(
        "FROM lockstep-sandbox/python:3.11\n"
        "COPY site/ /usr/local/lib/python3.11/dist-packages/\nCOPY vllm /usr/local/bin/vllm\n"
    )
    tag = f"jovian-judgement:{rev}-glm53"
    built = docker(nodes[0], "build", "-q", "--network", "none", "-t", tag, str(ctx))
    assert built.returncode == 0, built.stderr
    image_id = built.stdout.strip()
    for node in nodes[1:]:
        save = subprocess.Popen(
            ["docker", "save", image_id],
            cwd=nodes[0],
            env=node_env(nodes[0]),
            stdout=subprocess.PIPE,
        )
        load = subprocess.run(
            ["docker", "load", "-q"],
            cwd=node,
            env=node_env(node),
            stdin=save.stdout,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert save.wait(60) == 0 and load.returncode == 0, load.stderr
        assert docker(node, "tag", image_id, tag).returncode == 0
    return image_id
