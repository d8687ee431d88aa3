"""Image distribution: a real image of more than 1 GiB from a build node's Docker engine to three
lane nodes' engines over real sshd, star and relay,
against the same-host floor, side by side in one run.

    uv run python bench/image_distribution_bench.py [--gib 1] [--repeat 3]

Needs root and Debian's docker.io (one dockerd per node, sandbox/engines.py) and openssh-server.
Starts, under a temporary directory: five engines ("build", lane nodes "a", "b", "c", and "floor"),
each a sandbox node directory (sandbox/spark_nodes.py: bin/docker against the node's engine), and
one sshd per lane node on 127.0.0.1 (tests/support/sshd_server.py) whose sessions find that node's
`docker` first on PATH, as a DGX node's login finds the real one. The image is built offline on
"build": FROM the offline base `lockstep-sandbox/python:3.11` (Engine.ensure_bases) plus one layer
of --gib GiB of random (incompressible) bytes; the lane and floor
engines hold no base, so every run moves every layer.

Then, alternating --repeat times and compared by medians:
  floor   `docker save IMG | docker load` from "build"
  to "floor", both engines on this host: no ssh,
          no lockstep; what moving the image costs on this machine at all
  floor3  the same-host reference for three: one
  `docker save` on "build" tee'd into `docker load` on
          a, b and c (fifos, no ssh, no lockstep): what
          three loads of the image cost on this machine
  star    lockstep's own path, jovian_assets.node_build.distribute_image(mode="star"): one
          `docker save` on the build node (a `local` node) streamed by SparkNodes.pipe over ssh into
          `docker load` on a, b and c in parallel
  relay   the same with mode="relay": lockstep sends
  to a only; a tees into its `docker load` and into
          its own OpenSSH client to b (relay_key /
          relay_known_hosts of its [[spark.nodes]] entry), b to c
Before each run the image is removed from the receiving engines. After each, the image ID on every
receiving engine must equal the built one (distribute_image checks the lane; the two floors are
checked here). The last line is the relay's time over the floor's. Every engine, sshd and
per-connection sshd is stopped by PID at the end, also on Ctrl-C or SIGTERM.

On one 2-core machine every lane node shares the CPUs and the disk with the others and with the
build node: the star's three encrypting streams and three `docker load`s compete for the same two
cores, which separate DGX nodes would not; read the ratios as this machine's, not a lane's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script: the repo root is not on sys.path, and the sshd launcher lives with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jovian_assets.node_build import NodeImage, distribute_image
from resources.spark import SparkNodes
from sandbox.engines import DOCKER, ENGINE_DIR, Engine, require_docker_io
from sandbox.spark_nodes import install_node
from tests.support.sshd_server import (
    PASSPHRASE,
    PASSPHRASE_ENV,
    SshdServer,
    known_hosts_line,
    start_sshd,
    stop_sshd,
)

GiB = 1024**3
MiB = 1024**2
LANE = ["a", "b", "c"]
TAG = "lockstep-bench/distribution:big"
MODES = ("floor", "floor3", "star", "relay")
DOCKER_TIMEOUT_S = 1800


def docker(engine: Engine, *argv: str, timeout: float = DOCKER_TIMEOUT_S) -> str:
    """Debian's client against `engine` by its socket (never the machine's own docker service)."""
    done = subprocess.run(
        [str(DOCKER), "-H", engine.host, *argv],
        env=engine.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"docker {' '.join(argv[:2])} on {engine.state}: {done.stderr.strip()[-2000:]}"
        )
    return done.stdout.strip()


def build_image(engine: Engine, context: Path, size: int) -> tuple[str, int]:
    """FROM the offline python base plus one layer of
    `size` random bytes; (image ID, image bytes)."""
    engine.ensure_bases(["python"])
    context.mkdir(parents=True)
    with (context / "big.bin").open("wb") as out:
        left = size
        while left:
            chunk = os.urandom(min(left, 16 * MiB))
            out.write(chunk)
            left -= len(chunk)
    (context / "Dockerfile").write_text(
        "FROM lockstep-sandbox/python:3.11\nCOPY big.bin /opt/bench/big.bin\n"
    )
    docker(engine, "build", "--network", "none", "-q", "-t", TAG, str(context))
    (context / "big.bin").unlink()  # the engine holds it now
    image_id = docker(engine, "image", "inspect", "--format", "{{.Id}}", TAG)
    return image_id, int(docker(engine, "image", "inspect", "--format", "{{.Size}}", TAG))


def remove_image(engine: Engine) -> None:
    """The receiving side starts empty each run: no layer of the image is there to skip."""
    if docker(engine, "image", "ls", "-q", TAG):
        docker(engine, "rmi", "-f", TAG)


class Bench:
    """The engines, node directories and sshds of one run; `close()` stops all of it by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes = {
            name: install_node(root / "nodes" / name) for name in ["build", *LANE, "floor"]
        }
        self.engines = {name: Engine(node / ENGINE_DIR) for name, node in self.nodes.items()}
        self.sshd: dict[str, SshdServer] = {}
        self.spark: SparkNodes | None = None

    def start(self) -> None:
        for engine in self.engines.values():
            engine.start()
        relay_key = self.root / "relay_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(relay_key)],
            check=True,
            timeout=30,
        )
        for name in LANE:
            node = self.nodes[name]
            self.sshd[name] = start_sshd(
                self.root / f"sshd-{name}",
                extra_config=(
                    f"SetEnv PATH={node / 'bin'}:/usr/local/bin:/usr/bin:/bin "
                    f"HOME={node / 'home'}\n"
                ),
            )
        authorized = (self.sshd["a"].client_key.with_suffix(".pub").read_text()
                      + relay_key.with_suffix(".pub").read_text())  # fmt: skip
        for server in self.sshd.values():
            (server.root / "authorized_keys").write_text(authorized)
        known_hosts = self.root / "lockstep_known_hosts"
        known_hosts.write_text(
            "".join(
                known_hosts_line(s.host, s.port, s.host_key.with_suffix(".pub"))
                for s in self.sshd.values()
            )
        )
        nodes: list[dict[str, object]] = [
            {
                "name": "build",
                "transport": "local",
                "root": str(self.nodes["build"]),
                "roles": ["build"],
            }
        ]
        for name, nxt in zip(LANE, [*LANE[1:], None], strict=True):
            node = self.sshd[name].node(name, roles=["lane"])
            # this node forwards the relay: its hop's key and the next node's host key
            if nxt is not None:
                hop_hosts = self.nodes[name] / "relay_known_hosts"
                s = self.sshd[nxt]
                hop_hosts.write_text(
                    known_hosts_line(s.host, s.port, s.host_key.with_suffix(".pub"))
                )
                node |= {"relay_key": str(relay_key), "relay_known_hosts": str(hop_hosts)}
            nodes.append(node)
        # the test sshd's client key is passphrase-protected
        os.environ[PASSPHRASE_ENV] = PASSPHRASE
        self.spark = SparkNodes(
            nodes=nodes,
            known_hosts=str(known_hosts),
            key_path=str(self.sshd["a"].client_key),
            passphrase_env=PASSPHRASE_ENV,
            connect_timeout_s=10.0,
            command_timeout_s=float(DOCKER_TIMEOUT_S),
        )

    def close(self) -> None:
        if self.spark is not None:
            self.spark.close()
        for server in self.sshd.values():
            stop_sshd(server)
        for engine in self.engines.values():
            engine.stop()

    def run(self, mode: str, image: NodeImage) -> float:
        """Seconds for one distribution in `mode`, the receivers emptied first and checked after."""
        assert self.spark is not None
        receivers = ["floor"] if mode == "floor" else LANE
        engines = self.engines
        for name in receivers:
            remove_image(self.engines[name])
        self.spark.close()  # every run opens its connections, as a Dagster run does
        started = time.perf_counter()
        if mode == "floor":
            build, floor = self.engines["build"], self.engines["floor"]
            line = f"{DOCKER} -H {build.host} save {TAG} | {DOCKER} -H {floor.host} load -q"
            subprocess.run(["bash", "-o", "pipefail", "-c", line], check=True, capture_output=True,
                           timeout=DOCKER_TIMEOUT_S)  # fmt: skip
            seconds = time.perf_counter() - started
            got = docker(floor, "image", "inspect", "--format", "{{.Id}}", TAG)
            assert got == image.image_id, f"floor holds {got}, the build node {image.image_id}"
            return seconds
        if mode == "floor3":
            fifos = [self.root / f"fifo-{name}" for name in LANE[:2]]
            for fifo in fifos:
                fifo.unlink(missing_ok=True)
                os.mkfifo(fifo)
            a, b, c = (engines[name].host for name in LANE)
            line = (
                f"{DOCKER} -H {a} load -q < {fifos[0]} & A=$!; {DOCKER} -H {b} load -q < "
                f"{fifos[1]} & B=$!; "
                f"{DOCKER} -H {engines['build'].host} save {TAG} | tee {fifos[0]} {fifos[1]} | "
                f"{DOCKER} -H {c} load -q && wait $A && wait $B"
            )
            subprocess.run(["bash", "-o", "pipefail", "-c", line], check=True, capture_output=True,
                           timeout=DOCKER_TIMEOUT_S)  # fmt: skip
            seconds = time.perf_counter() - started
            got = {
                name: docker(engines[name], "image", "inspect", "--format", "{{.Id}}", TAG)
                for name in LANE
            }
            assert set(got.values()) == {image.image_id}, f"{got}, the build node {image.image_id}"
            return seconds
        # raises unless every ID matches
        done = distribute_image(self.spark, image, nodes=LANE, mode=mode)
        seconds = time.perf_counter() - started
        assert set(done.nodes.values()) == {image.image_id} and list(done.nodes) == LANE, done
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gib",
        type=float,
        default=1.0,
        help="GiB of random bytes in the image's own layer (default 1)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="alternating rounds; medians compared (default 3)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("image_distribution_bench needs root: it runs Docker engines (dockerd)")
    require_docker_io()
    for tool in ("ssh", "ssh-keygen", "/usr/sbin/sshd"):
        if not shutil.which(tool):
            sys.exit(
                f"image_distribution_bench needs {tool} (apt-get install -y openssh-client "
                "openssh-server)"
            )

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the finally below stops the engines and sshds

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(
        prefix="lockstep-distbench-", ignore_cleanup_errors=True
    ) as tmp:
        bench = Bench(Path(tmp))
        try:
            bench.start()
            started = time.perf_counter()
            image_id, size = build_image(
                bench.engines["build"], Path(tmp) / "context", int(args.gib * GiB)
            )
            print(
                f"built {TAG} on the build node's engine: {size / GiB:.2f} GiB ({size} bytes), "
                f"{image_id} "
                f"({time.perf_counter() - started:.0f} s); {os.cpu_count()} CPUs; lane a, b, c "
                "over sshd on "
                "127.0.0.1",
                flush=True,
            )
            image = NodeImage(
                rev="bench",
                tag=TAG,
                node="build",
                image_id=image_id,
                build_dir_checksum="",
                duration_s=0.0,
            )
            for _ in range(args.repeat):
                for mode in MODES:
                    seconds = bench.run(mode, image)
                    times[mode].append(seconds)
                    print(f"  {mode:<6} {seconds:7.2f} s", flush=True)
        finally:
            bench.close()
    median = {mode: statistics.median(v) for mode, v in times.items()}
    print(
        f"{'mode':<8}{'seconds':>9}{'x floor':>9}   (median of {args.repeat}; image "
        f"{size / GiB:.2f} GiB)"
    )
    for mode in MODES:
        print(f"{mode:<8}{median[mode]:>9.2f}{median[mode] / median['floor']:>9.2f}")
    print(
        "image IDs equal to the build node's on a, b, c (floor3, star, relay) and on floor: "
        f"{image_id}"
    )
    print(
        "over the same-host reference for three (floor3): star "
        f"{median['star'] / median['floor3']:.2f}, "
        f"relay {median['relay'] / median['floor3']:.2f}; floor3 / floor = "
        f"{median['floor3'] / median['floor']:.2f}"
    )
    print(f"star to 3 / floor to 1 = {median['star'] / median['floor']:.2f}")
    print(
        f"RATIO image of {size / GiB:.2f} GiB to 3 lane nodes over ssh, relay, seconds / "
        "same-host docker save | "
        f"docker load: {median['relay'] / median['floor']:.2f}"
    )


if __name__ == "__main__":
    main()
