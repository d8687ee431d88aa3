"""Sensor ticks (harbor and lab) vs a bare `git
ls-remote` of the same remote, side by side in one run.

    uv run python bench/sensor_tick_bench.py [--repeat 61] [--commits 10 10000] [--locks 1 50]

Generates, under a temporary directory: a harbor fork (a bare repo) with each of `--commits` commits
on its branch, a lab repo with each of `--locks` source locks under the sandbox's lock glob, and one
site file per (commits, locks) pair, written from the sandbox's own site (sandbox/world.py) with the
repos pointed at the generated ones. Then per case, ALTERNATING so both see the same load:

- the steady tick (the tip did not move: what nearly every tick is): `harbor_branch_sensor` /
  `lab_rev_sensor` evaluated in-process exactly as the code server does it for the daemon's
  `ExternalSensorExecution` call (`dagster._grpc.impl.get_external_sensor_execution` over the
  location's repository, with the instance's REF, the stored cursor and a log key: each tick gets a
  fresh context and whatever Dagster opens or builds for it), vs
  `subprocess.run(["git", "ls-remote", url, "refs/heads/<branch>"])` of the same remote;
- "declared" (what-if, the wiring before): the same tick from a sensor that declares the `site` and
  `git` resources as parameters, so Dagster opens
  the instance from its ref and builds both per tick;
- the moved tick (cursor at the tip's parent, an empty mirror cache each time), vs plain git doing
  the same work: ls-remote, a shallow fetch of what
  the tick needs, and (lab) the listing and lock reads.

Python's bytecode cache is on (in a directory of the run's own), as in the deployed image, which
compiles bytecode at install: opening an instance loads alembic's migration scripts.
Medians over `--repeat` rounds. Each tick's result is checked (a steady tick requests nothing and
names the sha; a moved tick requests its run). Asserts nothing about timings. The last line is the
worst steady-tick ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

# Run as a script: the repo root is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg
import tomli_w
from cryptography.hazmat.primitives import serialization
from dagster._grpc.impl import get_external_sensor_execution

from resources.git import GitRemotes
from resources.site.cache import SiteCache
from resources.site.load import load_site
from resources.site.resource import SiteResource
from sandbox.layout import Sandbox
from sandbox.world import (
    HARBOR_BRANCH,
    SANDBOX_ATTEST_PUB,
    sandbox_attest_key,
    site_config,
)

LAB_BRANCH = "master"
# under the sandbox's lock glob, models/glm-5.3-flash/**/*.source.lock
LOCK_DIR = "models/glm-5.3-flash/build"
GOAL = 1.25
_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}


def git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, input=stdin, capture_output=True, check=True, env=_ENV
    )
    return out.stdout.decode().strip()


def fast_import(bare: Path, branch: str, commits: list[dict[str, str]]) -> list[str]:
    """One commit per entry (path -> text, added or
    changed on top of the previous); returns the shas."""
    git("init", "--quiet", "--bare", f"--initial-branch={branch}", str(bare))
    stream = []
    for i, files in enumerate(commits):
        stream.append(
            f"commit refs/heads/{branch}\nmark :{i + 1}\n"
            f"committer bench <bench@bench.invalid> {1_700_000_000 + i * 60} +0000\n"
        )
        message = f"commit {i}\n".encode()
        stream.append(f"data {len(message)}\n{message.decode()}")
        if i:
            stream.append(f"from :{i}\n")
        for path, text in files.items():
            data = text.encode()
            stream.append(f"M 100644 inline {path}\ndata {len(data)}\n{text}\n")
    git("fast-import", "--quiet", cwd=bare, stdin="".join(stream).encode())
    return git("rev-list", "--reverse", branch, cwd=bare).split()


def harbor_repo(root: Path, commits: int) -> Path:
    bare = root / f"harbor-{commits}.git"
    fast_import(
        bare,
        HARBOR_BRANCH,
        [
            {
                "pyproject.toml": f'[project]\nname = "harbor"\nversion = "0.4.{i}"\n',
                "harbor/job.py": f"STEP = {i}\n",
            }
            for i in range(commits)
        ],
    )
    return bare


def lock_text(rev: str) -> str:
    sha = hashlib.sha1(rev.encode()).hexdigest()
    return (
        f"format=local-inference-source-lock/v1\nrelease.name=bench-{rev}\nrelease.version={rev}\n"
        f"vllm.repository=https://github.com/local-inference-lab/vllm.git\nvllm.commit={sha}\nvllm.tree={sha}\n"
    )


def lab_repo(root: Path, locks: int) -> Path:
    """The lab's master: a README, then one commit per
    published lock (the last one is the moved tick's)."""
    bare = root / f"lab-{locks}.git"
    commits = [{"README.md": "lab\n"}] + [
        {f"{LOCK_DIR}/r{i}.source.lock": lock_text(f"r{i}")} for i in range(locks)
    ]
    fast_import(bare, LAB_BRANCH, commits)
    return bare


def write_site(root: Path, name: str, harbor: Path, lab: Path) -> Path:
    """The sandbox's site file with its harbor and lab repos pointed at the generated ones."""
    sb = Sandbox(root=root / name)
    sb.root.mkdir(parents=True)
    data = site_config(sb).model_dump(mode="json", exclude_none=True, exclude={"links"})
    data["tpu"]["harbor_repo"] = harbor.as_uri()
    data["jovian"] |= {"lab_repo": lab.as_uri(), "lab_branch": LAB_BRANCH}
    sb.site_file.write_text(tomli_w.dumps(data), encoding="utf-8")
    private = serialization.load_pem_private_key(sandbox_attest_key().encode(), password=None)
    pub = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (sb.root / SANDBOX_ATTEST_PUB).parent.mkdir(parents=True)
    (sb.root / SANDBOX_ATTEST_PUB).write_bytes(pub)
    load_site(sb.site_file)  # what we wrote must be a valid site
    return sb.site_file


class Case(NamedTuple):
    label: str
    sensor: str
    site: Path
    url: str
    branch: str
    bare: Path


def ls_remote(url: str, branch: str) -> str:
    out = subprocess.run(
        ["git", "ls-remote", url, f"refs/heads/{branch}"], capture_output=True, check=True
    )
    return out.stdout.decode().split("\t", 1)[0]


def plain_moved(case: Case, tip: str, parent: str, cache: Path) -> None:
    """What a moved tick needs, done by plain git: ls-remote,
    a shallow fetch, and (lab) listing + reading the locks."""
    assert ls_remote(case.url, case.branch) == tip
    git("init", "--quiet", "--bare", str(cache))
    wanted = [tip] if case.sensor == "harbor_branch_sensor" else [tip, parent]
    git(
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--depth=1",
        "--",
        case.url,
        *[f"{s}:refs/keep/{s}" for s in wanted],
        cwd=cache,
    )
    if case.sensor == "harbor_branch_sensor":
        git("show", "-s", "--format=%H%x00%T%x00%an <%ae>%x00%ct%x00%s%x00%P", tip, cwd=cache)
        return
    blobs = []
    for sha in (tip, parent):
        listing = git("ls-tree", "-r", "--full-tree", sha, cwd=cache)
        blobs += [line.split()[2] for line in listing.splitlines() if line.endswith(".source.lock")]
    git("cat-file", "--batch", cwd=cache, stdin="".join(f"{b}\n" for b in blobs).encode())


def declared_twin(sensor: dg.SensorDefinition) -> dg.SensorDefinition:
    """The same tick from a sensor that takes `site` and
    `git` as resource parameters (the wiring before)."""

    @dg.sensor(name=f"{sensor.name}_declared")
    def twin(
        context: dg.SensorEvaluationContext, site: SiteResource, git: GitRemotes
    ) -> dg.SensorResult:
        return sensor(context)  # type: ignore[return-value]

    return twin


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=61,
        help="rounds per case (steady ticks); moved ticks: a third",
    )
    parser.add_argument(
        "--commits", type=int, nargs="+", default=[10, 10_000], help="harbor branch lengths"
    )
    parser.add_argument(
        "--locks", type=int, nargs="+", default=[1, 50], help="source locks in the lab repo"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lockstep-sensor-bench-"))
    sys.dont_write_bytecode, sys.pycache_prefix = False, str(work / "pycache")
    try:
        t0 = time.perf_counter()
        harbors = {n: harbor_repo(work / "repos", n) for n in args.commits}
        labs = {n: lab_repo(work / "repos", n) for n in args.locks}
        pairs = (
            list(zip(args.commits, args.locks, strict=False))
            if len(args.commits) == len(args.locks)
            else [(c, loc) for c in args.commits for loc in args.locks]
        )
        sites = {
            (c, loc): write_site(work, f"site-{c}-{loc}", harbors[c], labs[loc]) for c, loc in pairs
        }
        cases = []
        for (c, loc), site in sites.items():
            cases.append(
                Case(
                    f"harbor, {c:,} commits",
                    "harbor_branch_sensor",
                    site,
                    harbors[c].as_uri(),
                    HARBOR_BRANCH,
                    harbors[c],
                )
            )
            cases.append(
                Case(
                    f"lab, {loc} source lock{'s' if loc > 1 else ''}",
                    "lab_rev_sensor",
                    site,
                    labs[loc].as_uri(),
                    LAB_BRANCH,
                    labs[loc],
                )
            )
        # a site file is read as it is on a real site: not just written
        time.sleep(SiteCache.SETTLED_NS / 1e9)
        print(
            f"generated {len(harbors)} harbor forks, {len(labs)} lab repos and {len(sites)} site "
            "files "
            f"in {time.perf_counter() - t0:.1f} s ({work})"
        )

        # A code location reads its site as it loads and wires its resources from it.
        os.environ["LOCKSTEP_SITE"] = str(next(iter(sites.values())))
        os.environ["LOCKSTEP_CACHE"] = str(work / "cache")
        from jovian_assets.definitions import build_defs as jovian_defs
        from tpu_assets.definitions import build_defs as tpu_defs

        (work / "dagster_home").mkdir()
        instance = dg.DagsterInstance.local_temp(str(work / "dagster_home"))
        ref = instance.get_ref()
        rows = []

        # One case's medians, in a function of its own: the tick closures below read this case's
        # locals, which no later case rebinds.
        def measure(case: Case) -> tuple[str, float, float, float, float, float]:
            build = tpu_defs if case.sensor == "harbor_branch_sensor" else jovian_defs
            defs = build(load_site(case.site))
            sensor = defs.resolve_sensor_def(case.sensor)
            repo = defs.get_repository_def()
            twin = declared_twin(sensor)
            twin_repo = dg.Definitions(
                sensors=[twin], resources=defs.resources
            ).get_repository_def()
            tip, parent = git("rev-parse", case.branch, f"{case.branch}~1", cwd=case.bare).split()
            ticks = [0]

            def tick(
                cursor: str, on: dg.RepositoryDefinition = repo, name: str = case.sensor
            ) -> object:
                ticks[0] += 1  # the daemon's log key: repository, sensor, tick id
                data = get_external_sensor_execution(
                    on, None, ref, name, None, None, cursor, [on.name, name, str(ticks[0])], None
                )
                assert not hasattr(data, "error"), data
                return data

            def steady(on: dg.RepositoryDefinition = repo, name: str = case.sensor) -> None:
                result = tick(tip, on, name)
                assert not result.run_requests and tip in (result.skip_message or ""), result

            moved_n = [0]

            def moved() -> None:
                moved_n[0] += 1  # an empty mirror cache: the fetch is a real one every time
                os.environ["LOCKSTEP_CACHE"] = str(work / "moved" / f"lockstep-{moved_n[0]}")
                result = tick(parent)
                os.environ["LOCKSTEP_CACHE"] = str(work / "cache")
                assert result.cursor == tip and result.run_requests, result

            def plain_ref() -> None:
                moved_n[0] += 1
                plain_moved(case, tip, parent, work / "moved" / f"plain-{moved_n[0]}")

            for _ in range(3):  # warm-up: imports, the first mirror, the bytecode and page caches
                steady()
                steady(twin_repo, twin.name)
                ls_remote(case.url, case.branch)
            sensor_s, git_s, declared_s = [], [], []
            for _ in range(args.repeat):
                sensor_s.append(timed(steady))
                git_s.append(timed(lambda: ls_remote(case.url, case.branch)))
                declared_s.append(timed(lambda: steady(twin_repo, twin.name)))
            moved_s, plain_s = [], []
            for _ in range(max(3, args.repeat // 3)):
                moved_s.append(timed(moved))
                plain_s.append(timed(plain_ref))
            shutil.rmtree(work / "moved", ignore_errors=True)
            return (
                case.label,
                statistics.median(sensor_s),
                statistics.median(git_s),
                statistics.median(declared_s),
                statistics.median(moved_s),
                statistics.median(plain_s),
            )

        for case in cases:
            rows.append(measure(case))

        print(
            f"\nmedians, {args.repeat} steady rounds and {max(3, args.repeat // 3)} moved rounds "
            "per case, "
            f"alternating (contended if other work shares the machine)\n"
        )
        print(
            f"{'case':24} {'steady tick':>12} {'ls-remote':>10} {'ratio':>6} {'declared':>10} "
            f"{'ratio':>6}   "
            f"{'moved tick':>11} {'plain git':>10} {'ratio':>6}"
        )
        for label, s, g, d, m, p in rows:
            print(
                f"{label:24} {s * 1e3:>9.1f} ms {g * 1e3:>7.1f} ms {s / g:>6.2f} {d * 1e3:>7.1f} "
                f"ms {d / g:>6.2f}   "
                f"{m * 1e3:>8.1f} ms {p * 1e3:>7.1f} ms {m / p:>6.2f}"
            )
        print(
            "\nsteady and moved tick: get_external_sensor_execution, what the code server runs "
            "for the daemon's "
            "tick;\ndeclared: the steady tick from a twin sensor taking `site` and `git` as "
            "resource parameters "
            "(what-if: Dagster opens the instance from its ref and builds both, every tick)"
        )
        worst = max(rows, key=lambda r: r[1] / r[2])
        print(f"\nworst steady tick: {worst[0]}")
        print(
            f"RATIO sensor tick, tip unchanged / bare git ls-remote: {worst[1] / worst[2]:.2f} "
            f"(goal <= {GOAL})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
