"""SparkNodes.pipe fan-out: one producer to 1
destination vs to 3, side by side in one run, over ssh.

    uv run python bench/fanout_bench.py [--mib 512] [--dsts 3] [--repeat 3] [--no-sequential]

Starts its own sshd on 127.0.0.1 (tests/support/sshd_server.py; stopped by PID at the end). Every
node name points at that sshd, so the producer and each destination is its own ssh connection and
channel, as in `docker save IMG | ssh dst docker load` to a lane. The producer is `head -c N
/dev/zero` and each destination `cat > /dev/null`, so the numbers are the fan-out itself (read once,
encrypt and send once per destination), not docker. The 1-destination and N-destination runs
alternate `--repeat` times and the medians are compared, so a neighbour's burst of CPU hits both
alike. Prints seconds for one destination, for N in parallel, and (unless --no-sequential) for N one
after another, the ratios, how busy the machine's CPUs were (every process on it, not only ours)
and how much CPU this Python process used. Asserts only that every destination got every byte
(the sha256 of what was sent equals the producer's).

Unless --no-openssh, the same fan-out is also timed with nothing of lockstep in it, as a floor for
this machine: OpenSSH's own client, `ssh src head ... | tee >(ssh dst cat) ...`, alternating 1 and N
destinations the same way. Where that reference cannot reach the goal either, the limit is the
machine's cores (every destination adds an encrypt and a decrypt on the same CPUs), not lockstep.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

# Run as a script: the repo root is not on sys.path, and the sshd launcher lives with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paramiko

from resources.spark import SparkNodes
from tests.support.sshd_server import PASSPHRASE, PASSPHRASE_ENV, start_sshd, stop_sshd

MiB = 1024 * 1024


class Run(NamedTuple):
    seconds: float
    cpu_busy: float  # share of all CPUs busy during the run (every process on the machine)
    python_cpu_s: float  # CPU seconds this process used (all its threads)


def _cpu_ticks() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _python_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fan_out(spark: SparkNodes, *, size: int, dsts: list[str]) -> Run:
    busy0, total0 = _cpu_ticks()
    cpu0 = _python_cpu()
    started = time.perf_counter()
    result = spark.pipe(src="src", src_argv=["head", "-c", str(size), "/dev/zero"], dsts=dsts,
                        dst_argv=["sh", "-c", "cat > /dev/null"])  # fmt: skip
    seconds = time.perf_counter() - started
    busy1, total1 = _cpu_ticks()
    for end in result.dsts:
        assert (end.exit_code, end.bytes, end.sha256) == (0, size, result.src.sha256), end
    return Run(seconds, (busy1 - busy0) / max(1, total1 - total0), _python_cpu() - cpu0)


def openssh_fan_out(server: object, key: Path, *, size: int, dsts: int) -> float:
    """Seconds for `ssh src head -c N /dev/zero | tee
    >(ssh dst 'wc -c') ...` with OpenSSH's client."""
    ssh = shlex.join([
        "ssh", "-T", "-x", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={server.known_hosts}", "-i", str(key), "-p", str(server.port),
        f"{server.user}@127.0.0.1",
    ])  # fmt: skip
    sinks = " ".join(f">({ssh} 'wc -c' >&2)" for _ in range(dsts))
    # bash's `wait` also waits for the process substitutions, so every destination is counted.
    script = f"{ssh} head -c {size} /dev/zero | tee {sinks} >/dev/null; wait"
    started = time.perf_counter()
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    seconds = time.perf_counter() - started
    counts = done.stderr.split()
    assert done.returncode == 0 and counts == [str(size)] * dsts, (
        done.returncode,
        done.stderr[-500:],
    )
    return seconds


def median(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="bytes streamed, in MiB (default 512)")
    parser.add_argument(
        "--dsts", type=int, default=3, help="destinations of the parallel run (default 3)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="alternating runs of each; medians compared (default 3)",
    )
    parser.add_argument(
        "--no-sequential", action="store_true", help="skip the one-after-another run"
    )
    parser.add_argument("--no-openssh", action="store_true", help="skip the OpenSSH-only reference")
    args = parser.parse_args()
    size = args.mib * MiB
    names = [f"dst{i}" for i in range(1, args.dsts + 1)]

    os.environ[PASSPHRASE_ENV] = PASSPHRASE
    with tempfile.TemporaryDirectory(prefix="lockstep-fanout-") as tmp:
        server = start_sshd(Path(tmp) / "sshd")
        spark = SparkNodes(
            nodes=[server.node(n) for n in ["src", *names]], known_hosts=str(server.known_hosts),
            key_path=str(server.client_key), passphrase_env=PASSPHRASE_ENV,
        )  # fmt: skip
        try:
            # decrypt the key once, outside the timings
            spark.run(node="src", argv=["true"]).check()
            cipher = spark._transport("src")._client.get_transport().local_cipher  # type: ignore[attr-defined]
            fan_out(spark, size=8 * MiB, dsts=names)  # warm up
            ones, manys = [], []
            for _ in range(args.repeat):
                ones.append(fan_out(spark, size=size, dsts=names[:1]))
                manys.append(fan_out(spark, size=size, dsts=names))
            one, many = median(ones), median(manys)
            seq = None
            if not args.no_sequential:
                runs = [fan_out(spark, size=size, dsts=[n]) for n in names]
                seconds = sum(r.seconds for r in runs)
                seq = Run(
                    seconds,
                    sum(r.cpu_busy * r.seconds for r in runs) / seconds,
                    sum(r.python_cpu_s for r in runs),
                )
            ref: list[tuple[float, float]] = []
            if not args.no_openssh:
                # A key without a passphrase, for this run only:
                # OpenSSH's client cannot read the env var.
                key = Path(tmp) / "bench_ed25519"
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
                )
                with open(server.root / "authorized_keys", "a") as keys:
                    keys.write(key.with_suffix(".pub").read_text())
                openssh_fan_out(server, key, size=8 * MiB, dsts=len(names))  # warm up
                for _ in range(args.repeat):
                    ref.append(
                        (
                            openssh_fan_out(server, key, size=size, dsts=1),
                            openssh_fan_out(server, key, size=size, dsts=len(names)),
                        )
                    )
        finally:
            spark.close()
            stop_sshd(server)

    sshd_version = os.popen("/usr/sbin/sshd -V 2>&1").read().split(",")[0].strip()
    print(f"fan-out of {args.mib} MiB from one producer over loopback ssh: {sshd_version} sshd, "
          f"paramiko {paramiko.__version__} ({cipher}), {os.cpu_count()} CPUs")  # fmt: skip
    print(
        f"{'destinations':<16}{'seconds':>9}{'MiB/s per dst':>15}{'CPU busy':>10}"
        f"{'python CPU s':>14}"
    )
    rows = [("1", one), (f"{args.dsts} parallel", many)] + (
        [(f"{args.dsts} sequential", seq)] if seq else []
    )
    for label, run in rows:
        # Each destination gets all the bytes; one after
        # another, each has the run's 1/N of the time.
        per_dst = args.mib / run.seconds * (args.dsts if label.endswith("sequential") else 1)
        print(
            f"{label:<16}{run.seconds:>9.2f}{per_dst:>15.0f}{run.cpu_busy:>10.0%}{run.python_cpu_s:>14.2f}"
        )
    print(
        f"ratio time({args.dsts} parallel)/time(1) = {many.seconds / one.seconds:.2f}   (goal < "
        "1.4)   "
        f"medians of {args.repeat}; all ratios: "
        + ", ".join(f"{m.seconds / o.seconds:.2f}" for o, m in zip(ones, manys, strict=True))
    )
    if seq:
        print(f"ratio time({args.dsts} sequential)/time(1) = {seq.seconds / one.seconds:.2f}")
    if ref:
        o, m = sorted(r[0] for r in ref)[len(ref) // 2], sorted(r[1] for r in ref)[len(ref) // 2]
        print(
            f"reference, OpenSSH client + tee, no lockstep: 1 dst {o:.2f} s, {args.dsts} dsts "
            f"{m:.2f} s, "
            f"ratio {m / o:.2f}; all ratios: " + ", ".join(f"{b / a:.2f}" for a, b in ref)
        )
    floor = f"; OpenSSH + tee here: {m / o:.2f}" if ref else ""
    print(
        f"RATIO fan-out to {args.dsts} over loopback ssh: seconds / seconds to 1: "
        f"{many.seconds / one.seconds:.2f} "
        f"(goal < 1.4{floor})"
    )


if __name__ == "__main__":
    main()
