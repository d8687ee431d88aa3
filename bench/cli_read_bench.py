"""`lockstep status`, `promote --plan`, `rollback --plan` (read commands, from a fresh process) vs
`import dagster`, side by side.

    uv run python bench/cli_read_bench.py [--repeat 15]

Issue 26: a read command answers in at most 1.5 s from a fresh process. It reads the newest
`lockstep/status` observation through the webserver's GraphQL (lockstep/graphql.py) and never
imports dagster. This bench prepares an instance in a temp dir with one status observation (recorded
as status_sensor records it: tpu_assets/status.py `status_observation`), starts `dagster-webserver`
on it (the repo's workspace, no site file), then times, alternating, fresh processes of
`lockstep status --json`, `lockstep status` (the human form, which also asks for the sensor's last
tick) and `python -c "import dagster"` (the reference): wall seconds from the start until the
process ends, medians. Then `-X importtime` of `lockstep status --json` checks that dagster is not
imported and names the dearest packages it does import.

Asserts nothing about timings. Its last line is the slowest read command's ratio to `import
dagster`. The webserver is stopped by its PID (its process group) at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.5
LOCKSTEP = Path(sys.executable).parent / "lockstep"
WEBSERVER = Path(sys.executable).parent / "dagster-webserver"


def clean_env(work: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOCKSTEP_", "DAGSTER_"))
        and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")
    }
    for name in ("home", "dagster_home", "cache", "pycache", "cwd"):
        (work / name).mkdir()
    (work / "dagster_home" / "dagster.yaml").write_text("")
    env.update(
        PYTHONPATH=str(ROOT),
        HOME=str(work / "home"),
        DAGSTER_HOME=str(work / "dagster_home"),
        LOCKSTEP_CACHE=str(work / "cache"),
        PYTHONPYCACHEPREFIX=str(work / "pycache"),
    )
    return env


def record_status(home: Path) -> None:
    """One status observation on the instance at `home`,
    shaped as on a site with a lane (in this process:
    it imports dagster, the timed commands must not)."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from lockstep.status_model import (
        ConsumerLock,
        Hold,
        LaneFacts,
        NewestBuild,
        Refusal,
        RollbackFacts,
        Status,
        TpuFacts,
        mismatch_warnings,
    )
    from tpu_assets.status import status_observation

    tpu = TpuFacts(
        image="registry.example/lockstep/tpu-runtime",
        tag="tpu",
        digest="sha256:" + "d" * 64,
        build="c" * 40,
        baked_harbor="a" * 40,
        baked_from="verified record",
    )
    consumer = ConsumerLock(branch="main", head="e" * 40, harbor_commit="b" * 40)
    lanes = [
        LaneFacts(
            name="glm53-2x",
            action="boot",
            rev="r28",
            tag="jovian-judgement:r28-glm53",
            expected_image_id="sha256:" + "1" * 64,
            nodes={"spark-a": "sha256:" + "1" * 64, "spark-b": "sha256:" + "1" * 64},
            ready_since=time.time() - 3600,
            score=87,
            baseline="86 (r27, run x)",
            gate_passed=True,
            bench_at=time.time() - 3000,
        )
    ]
    plan = "\n".join(
        [":tpu is at sha256:dddd."]
        + [f"  build {i}{'0' * 7} sha256:{i * 12}: refused: why" for i in range(1, 6)]
    )
    status = Status(
        as_of=time.time(),
        tpu=tpu,
        consumer=consumer,
        tag_hold=Hold(held=False),
        harbor_hold=Hold(held=False),
        newest_build=NewestBuild(
            build="f" * 40,
            digest="sha256:" + "9" * 64,
            harbor_commit="b" * 40,
            verified_at=time.time() - 600,
            promotable=False,
            refusals=[Refusal(rule="soak", message="soak: promotable at ...")],
            changelog="harbor aaaaaaaa -> bbbbbbbb: 3 commits added",
        ),
        rollback=RollbackFacts(
            target_build="1" * 40,
            target_digest="sha256:" + "1" * 64,
            explanation=plan,
            scopes="What each scope changes:\n  image: ...\n  runtime: ...",
        ),
        lanes=lanes,
        warnings=mismatch_warnings(tpu, consumer, lanes),
    )
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        instance.report_runless_asset_event(status_observation(status))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_webserver(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    import requests

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(WEBSERVER),
                "-w",
                str(ROOT / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"dagster-webserver exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/server_info", timeout=2).ok:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    stop(proc)
    sys.exit(f"dagster-webserver did not answer within 300 s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the webserver's process group (it started its code servers), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 25), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=120, check=False)
    wall = time.perf_counter() - start
    # 1: the status holds a warning, which this one does on purpose
    if done.returncode not in (0, 1):
        sys.exit(
            f"{' '.join(argv)} exited "
            f"{done.returncode}:\n{done.stderr.decode(errors='replace')[-2000:]}"
        )
    return wall


def importtime(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, tuple[int, int]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            self_us, cum_us, name = line.removeprefix("import time:").split("|")
            found[name.strip()] = (int(self_us), int(cum_us))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command (alternating)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lockstep-cli-read-bench-"))
    proc = None
    try:
        env = clean_env(work)
        record_status(work / "dagster_home")
        proc, url = start_webserver(env, work / "webserver.log")
        cwd = work / "cwd"
        commands = {
            "lockstep status --json": [str(LOCKSTEP), "status", "--url", url, "--json"],
            "lockstep status": [str(LOCKSTEP), "status", "--url", url],
            "lockstep promote --plan": [str(LOCKSTEP), "promote", "--plan", "--url", url],
            "lockstep rollback --plan": [str(LOCKSTEP), "rollback", "--plan", "--url", url],
            "python -c 'import dagster'": [sys.executable, "-c", "import dagster"],
        }
        # warm-up: the bytecode cache, the webserver's first GraphQL answer
        for argv in commands.values():
            timed(argv, env, cwd)
        runs: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.repeat):
            for name, argv in commands.items():
                runs[name].append(timed(argv, env, cwd))

        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} cores; medians of {args.repeat} "
            "fresh processes "
            "each, alternating, against a local dagster-webserver"
        )
        ref = statistics.median(runs["python -c 'import dagster'"])
        print(f"{'':30}{'wall s':>8}{'min':>7}{'max':>7}{'/ import dagster':>18}")
        for name, walls in runs.items():
            med = statistics.median(walls)
            print(f"{name:30}{med:>8.2f}{min(walls):>7.2f}{max(walls):>7.2f}{med / ref:>17.2f}x")

        table = importtime([str(LOCKSTEP), "status", "--url", url, "--json"], env, cwd)
        dagster = sorted(m for m in table if m == "dagster" or m.startswith("dagster."))
        print(
            f"\n-X importtime of `lockstep status --json`: {len(table)} modules, "
            f"{sum(s for s, _ in table.values()) / 1000:.0f} ms self time; dagster modules "
            f"imported: {len(dagster)}" + (f" ({', '.join(dagster[:5])})" if dagster else "")
        )
        top: dict[str, float] = defaultdict(float)
        for name, (self_us, _) in table.items():
            top[name.split(".")[0]] += self_us / 1000
        print(
            "  dearest packages (self ms): "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:8])
        )
        # The slowest read command decides: each must answer within the goal.
        name, status_s = max(
            ((n, statistics.median(w)) for n, w in runs.items() if n.startswith("lockstep")),
            key=lambda kv: kv[1],
        )
        print(
            f"RATIO slowest read command ({name}) / import dagster: {status_s / ref:.2f} "
            f"({status_s:.2f} s vs "
            f"{ref:.2f} s; goal <= {GOAL_S} s)"
        )
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
