"""Fan-out on a bandwidth-limited lane: 1 source
and 3 nodes in network namespaces, each link shaped.

    uv run python bench/lane_fanout_bench.py [--mib 320] [--rate-mib 100] [--repeat 3]

Needs root (network namespaces, veth, `tc`). Creates, with names unique to this run, a bridge
namespace and four node namespaces (`lsb<id>-src`, `-a`, `-b`, `-c`), one veth pair from each node
to the bridge, addresses in 10.<x>.<y>.0/24, and a tbf qdisc on BOTH ends of every veth, so each
node's link carries --rate-mib MiB/s each way (`tc -s` is read afterwards to show it shaped). Nodes
a, b, c each run their own sshd (`ip netns exec NS sshd -D -e -f CFG`, stopped by PID). lockstep
runs in the source namespace (a child of this script: `ip netns exec lsb<id>-src python ...
--inner`), so the source's uplink is the link every star copy crosses, as the build node's (or the
Dagster host's) is on a real lane.

Then, alternating --repeat times and compared by medians, lockstep's SparkNodes streams
`head -c N /dev/zero` (a local node in the source namespace) to `cat > /dev/null`:
  1 node            pipe to a
  star, parallel    pipe to a, b, c (three copies on the uplink)
  star, sequential  pipe to a, then b, then c
  relay             SparkNodes.relay along a -> b ->
  c: lockstep sends to a only; a tees into its own
                    sink and into its own ssh to b (key and known_hosts named for that hop), b to c.
  openssh 1 node,   the same two with nothing of lockstep in them (bash, OpenSSH's client and `tee`
  openssh relay     on every node): this machine's floor for a chain.
Each run also counts the bytes the source's uplink carried (its veth's tx_bytes), in copies of N.
The last line is the relay's time to 3 over the time to 1 (goal <= 1.15). Every namespace (and with
them the veths) is removed at the end, also on Ctrl-C or SIGTERM; what still ran inside one is
killed by PID first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script: the repo root is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1024 * 1024
SSHD = os.environ.get("LOCKSTEP_SSHD", "/usr/sbin/sshd")
NODES = ("a", "b", "c")
MODES = ("1 node", "star parallel", "star sequential", "relay", "openssh 1 node", "openssh relay")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, timeout=60)


# ---- the lane ------------------------------------------------------------------------------------


class Lane:
    """The namespaces, veths, qdiscs and sshds of one run; `close()` removes all of it."""

    def __init__(self, root: Path, *, rate_mib: int) -> None:
        self.id = secrets.token_hex(3)
        self.root = root
        self.rate_mib = rate_mib
        self.prefix = f"10.{int(self.id[:2], 16) % 200 + 20}.{int(self.id[2:4], 16)}"
        self.bridge = f"lsb{self.id}-br"
        self.ns = {name: f"lsb{self.id}-{name}" for name in ("src", *NODES)}
        self.addr = {name: f"{self.prefix}.{i + 1}" for i, name in enumerate(("src", *NODES))}
        self.created: list[str] = []
        self.sshd: dict[str, subprocess.Popen[bytes]] = {}

    def up(self) -> None:
        sh("ip", "netns", "add", self.bridge)
        self.created.append(self.bridge)
        sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.bridge, "link", "set", "br0", "up")
        rate = f"{self.rate_mib * 8}mibit"  # tc's mibit: 2^20 bits/s, so 800mibit = 100 MiB/s
        for i, (name, ns) in enumerate(self.ns.items()):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            peer = f"p{self.id}{i}"
            sh(
                "ip",
                "-n",
                self.bridge,
                "link",
                "add",
                peer,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            sh("ip", "-n", self.bridge, "link", "set", peer, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # Both ends: the node's upload (its eth0's egress)
            # and its download (the bridge port's egress).
            for where, dev in ((ns, "eth0"), (self.bridge, peer)):
                sh(
                    "ip",
                    "netns",
                    "exec",
                    where,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    "512kb",
                    "latency",
                    "50ms",
                )

    def keys(self) -> None:
        for name in ("client", "relay", *(f"host_{n}" for n in NODES)):
            sh(
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"lane-bench-{name}",
                "-f",
                str(self.root / name),
            )
        (self.root / "authorized_keys").write_text(
            (self.root / "client.pub").read_text() + (self.root / "relay.pub").read_text()
        )
        (self.root / "known_hosts").write_text("".join(self.known_hosts_line(n) for n in NODES))
        for name, nxt in itertools.pairwise(NODES):
            (self.root / f"relay_known_hosts_{name}").write_text(self.known_hosts_line(nxt))
        (self.root / "src-node" / "bin").mkdir(parents=True)

    def known_hosts_line(self, node: str) -> str:
        kind, blob = (self.root / f"host_{node}.pub").read_text().split()[:2]
        return f"{self.addr[node]} {kind} {blob}\n"

    def start_sshds(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        user = os.environ.get("USER") or "root"
        for node in NODES:
            cfg = self.root / f"sshd_{node}.conf"
            cfg.write_text(
                f"Port 22\nListenAddress {self.addr[node]}\nHostKey {self.root / f'host_{node}'}\n"
                f"AuthorizedKeysFile {self.root / 'authorized_keys'}\nPidFile "
                f"{self.root / f'sshd_{node}.pid'}\n"
                "PermitRootLogin prohibit-password\nPubkeyAuthentication "
                "yes\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nAllowUsers "
                f"{user}\nMaxSessions 64\n"
                "MaxStartups 64:30:128\nLogLevel INFO\n"
                # Each node its own home: the login shell then reads that node's (empty) rc files,
                # not this machine's ~/.bashrc (Debian's bash reads
                # it for ssh commands: pyenv init, 0.5 s).
                f"SetEnv HOME={self.root / f'home_{node}'}\n"
            )
            (self.root / f"home_{node}").mkdir()
            log = open(self.root / f"sshd_{node}.log", "wb")  # noqa: SIM115 (sshd keeps it open)
            self.sshd[node] = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[node], SSHD, "-D", "-e", "-f", str(cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 15
        for node in NODES:
            log = self.root / f"sshd_{node}.log"
            while "Server listening" not in log.read_text(errors="replace"):
                if self.sshd[node].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd in {self.ns[node]} did not start: "
                        f"{log.read_text(errors='replace')[-2000:]}"
                    )
                time.sleep(0.05)

    def qdisc_stats(self) -> dict[str, str]:
        """`tc -s qdisc` of every shaped device: the proof that tbf shaped (overlimits > 0)."""
        out = {}
        for i, (name, ns) in enumerate(self.ns.items()):
            for where, dev, side in ((ns, "eth0", "up"), (self.bridge, f"p{self.id}{i}", "down")):
                out[f"{name} {side}"] = sh(
                    "ip", "netns", "exec", where, "tc", "-s", "qdisc", "show", "dev", dev
                ).stdout
        return out

    def close(self) -> None:
        for proc in self.sshd.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for ns in reversed(self.created):
            # Whatever still runs inside OUR namespace is
            # ours (a per-connection sshd, a relay's ssh).
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.created.clear()


# ---- the runs, inside the source namespace -------------------------------------------------------


def tx_bytes() -> int:
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine: every process on it, not only ours."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def inner(config_path: Path) -> None:
    """Time the four modes with lockstep's SparkNodes (run in the source namespace); write JSON."""
    from resources.spark import SparkNodes

    cfg = json.loads(config_path.read_text())
    root = Path(cfg["root"])
    nodes: list[dict[str, object]] = [
        {"name": "src", "transport": "local", "root": str(root / "src-node")}
    ]
    for name in NODES:
        node: dict[str, object] = {
            "name": name,
            "host": cfg["addr"][name],
            "port": 22,
            "user": cfg["user"],
        }
        if name != NODES[-1]:
            node |= {
                "relay_key": str(root / "relay"),
                "relay_known_hosts": str(root / f"relay_known_hosts_{name}"),
            }
        nodes.append(node)
    spark = SparkNodes(
        nodes=nodes,
        known_hosts=str(root / "known_hosts"),
        key_path=str(root / "client"),
        connect_timeout_s=10.0,
        command_timeout_s=120.0,
    )
    sink = ["sh", "-c", "cat > /dev/null"]

    def produce(size: int) -> list[str]:
        return ["head", "-c", str(size), "/dev/zero"]

    def ssh(key: Path, known_hosts: Path, node: str) -> str:
        return shlex.join(
            [
                "ssh",
                "-F",
                "none",
                "-T",
                "-x",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                f"UserKnownHostsFile={known_hosts}",
                "-o",
                "IdentitiesOnly=yes",
                "-i",
                str(key),
                "-o",
                "Ciphers=aes128-gcm@openssh.com",
                cfg["addr"][node],
            ]
        )

    def openssh(size: int, chain: list[str]) -> None:
        """The same chain with nothing of lockstep in it:
        bash, OpenSSH's client and `tee` on every node."""
        script = "cat > /dev/null"
        for node, nxt in reversed(list(itertools.pairwise(chain))):
            hop = ssh(root / "relay", root / f"relay_known_hosts_{node}", nxt)
            script = f"tee -p >(cat > /dev/null) | {hop} {shlex.quote(script)}"
        line = (
            f"head -c {size} /dev/zero | "
            f"{ssh(root / 'client', root / 'known_hosts', chain[0])} {shlex.quote(script)}"
        )
        subprocess.run(["bash", "-c", line], check=True, timeout=600)

    def run(mode: str, size: int) -> tuple[float, float, float]:
        spark.close()  # every mode starts from no connection, as a run does
        (busy0, total0), tx0, started = cpu_ticks(), tx_bytes(), time.perf_counter()
        if mode == "1 node":
            done = [spark.pipe(src="src", src_argv=produce(size), dsts=["a"], dst_argv=sink)]
        elif mode == "star parallel":
            done = [spark.pipe(src="src", src_argv=produce(size), dsts=list(NODES), dst_argv=sink)]
        elif mode == "star sequential":
            done = [
                spark.pipe(src="src", src_argv=produce(size), dsts=[n], dst_argv=sink)
                for n in NODES
            ]
        elif mode == "openssh 1 node":
            openssh(size, ["a"])
            done = []
        elif mode == "openssh relay":
            openssh(size, list(NODES))
            done = []
        else:
            relayed = spark.relay(
                src="src", src_argv=produce(size), chain=list(NODES), load_argv=sink
            )
            assert relayed.loaded == list(NODES) and relayed.head.bytes == size, relayed
            done = []
        for result in done:
            assert all(d.exit_code == 0 and d.bytes == size for d in result.dsts), result
        seconds, (busy1, total1) = time.perf_counter() - started, cpu_ticks()
        return seconds, (tx_bytes() - tx0) / size, (busy1 - busy0) / max(1, total1 - total0)

    size = cfg["mib"] * MiB
    try:
        for mode in MODES:  # warm up: connections, page cache, the relay's ssh on every node
            run(mode, 4 * MiB)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        copies: dict[str, list[float]] = {m: [] for m in MODES}
        busy: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(cfg["repeat"]):
            for mode in MODES:
                seconds, uplink, cpu = run(mode, size)
                times[mode].append(seconds)
                copies[mode].append(uplink)
                busy[mode].append(cpu)
                print(
                    (
                        f"  {mode:<16} {seconds:6.2f} s  uplink {uplink:4.2f} copies  CPU busy "
                        f"{cpu:4.0%}"
                    ),
                    flush=True,
                )
    finally:
        spark.close()
    Path(cfg["out"]).write_text(json.dumps({"times": times, "copies": copies, "busy": busy}))


# ---- the outer run -------------------------------------------------------------------------------


def _qdisc_line(text: str) -> str:
    m = re.search(
        r"qdisc tbf .*? rate (\S+).*?Sent (\d+) bytes \d+ pkt \(dropped (\d+), overlimits (\d+)",
        text,
        re.DOTALL,
    )
    return (
        f"tbf {m.group(1)}, sent {int(m.group(2)) / MiB:7.0f} MiB, overlimits {m.group(4)}"
        if m
        else "NO tbf"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mib", type=int, default=256, help="bytes streamed per run, in MiB (default 256)"
    )
    parser.add_argument(
        "--rate-mib", type=int, default=100, help="each link's rate each way, MiB/s (default 100)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="alternating rounds; medians compared (default 3)"
    )
    parser.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner)
        return
    if os.geteuid() != 0:
        sys.exit("lane_fanout_bench needs root: network namespaces, veth pairs and tc")
    for tool in ("ip", "tc", "ssh", "ssh-keygen", SSHD):
        if not shutil.which(tool):
            sys.exit(
                f"lane_fanout_bench needs {tool} (apt-get install -y iproute2 openssh-client "
                "openssh-server)"
            )

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the finally below removes the namespaces

    # SIGINT too: a shell that starts us in the background hands SIGINT down ignored.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    with tempfile.TemporaryDirectory(prefix="lockstep-lane-") as tmp:
        root = Path(tmp)
        lane = Lane(root, rate_mib=args.rate_mib)
        try:
            lane.up()
            lane.keys()
            lane.start_sshds()
            cfg = {
                "root": str(root),
                "addr": lane.addr,
                "user": os.environ.get("USER") or "root",
                "mib": args.mib,
                "repeat": args.repeat,
                "out": str(root / "results.json"),
            }
            (root / "config.json").write_text(json.dumps(cfg))
            print(
                f"lane {lane.prefix}.0/24 (namespaces lsb{lane.id}-*), every link "
                f"{args.rate_mib} MiB/s each way "
                f"(tbf), {args.mib} MiB per run, {os.cpu_count()} CPUs",
                flush=True,
            )
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    lane.ns["src"],
                    sys.executable,
                    __file__,
                    "--inner",
                    str(root / "config.json"),
                ],
                check=True,
                timeout=900,
            )
            stats = lane.qdisc_stats()
            results = json.loads((root / "results.json").read_text())
        finally:
            lane.close()
    left = [ns for ns in sh("ip", "netns", "list").stdout.split() if ns.startswith(f"lsb{lane.id}")]
    assert not left, f"namespaces left behind: {left}"

    print("shaping (tc -s qdisc, over the whole run):")
    for link, text in stats.items():
        print(f"  {link:<8} {_qdisc_line(text)}")
    times = {m: statistics.median(v) for m, v in results["times"].items()}
    copies = {m: statistics.median(v) for m, v in results["copies"].items()}
    busy = {m: statistics.median(v) for m, v in results["busy"].items()}
    ideal = args.mib / args.rate_mib
    print(
        f"{'mode':<18}{'seconds':>9}{'x time(1)':>11}{'uplink copies':>15}{'CPU busy':>10}"
        f"   (one copy at the link rate: {ideal:.2f} s; CPU busy: the whole machine's, every "
        "process on it)"
    )
    for mode in MODES:
        print(
            f"{mode:<18}{times[mode]:>9.2f}{times[mode] / times['1 node']:>11.2f}"
            f"{copies[mode]:>15.2f}"
            f"{busy[mode]:>10.0%}"
        )
    ratios = [
        r / o for o, r in zip(results["times"]["1 node"], results["times"]["relay"], strict=True)
    ]
    print(
        f"star parallel 3/1 = {times['star parallel'] / times['1 node']:.2f}, star sequential "
        "3/1 = "
        f"{times['star sequential'] / times['1 node']:.2f}; relay per round: "
        + ", ".join(f"{r:.2f}" for r in ratios)
    )
    print(
        f"reference, OpenSSH client + tee on every node, no lockstep: relay 3/1 = "
        f"{times['openssh relay'] / times['openssh 1 node']:.2f}"
    )
    print(
        f"RATIO fan-out to 3 on a {args.rate_mib} MiB/s lane, relay, seconds / seconds to 1: "
        f"{times['relay'] / times['1 node']:.2f} (goal <= 1.15)"
    )


if __name__ == "__main__":
    main()
