"""Loading a code location vs `import dagster`, side by side, in fresh interpreters.

    uv run python bench/location_load_bench.py [--repeat 15]

A code server (`dagster api grpc -m tpu_assets.definitions`), `dagster dev` and every run worker
start a fresh interpreter, import the location's module and take its `defs`. Each round runs, one
after the other, `import dagster` (the reference), the tpu location, `import dagster` again and the
jovian location, each as `python -c` in a new process:

    import tpu_assets.definitions as m; m.defs.get_repository_def()

so both sides see the same load, and a location's ratio is the median of its runs over the median of
the reference's. The environment is clean: no site file (LOCKSTEP_SITE unset, an empty working
directory, so no `.sandbox/site.toml`), HOME, DAGSTER_HOME and LOCKSTEP_CACHE in a temp dir, and a
bytecode cache of its own (PYTHONPYCACHEPREFIX, written by one warm-up run of each command), as in
the deployed image, which compiles bytecode at install (UV_COMPILE_BYTECODE=1). Then `-X importtime`
shows what each location imports beyond dagster's own import set, by top-level package.

Asserts nothing about timings. Its last line is the worse location's ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.15
REFERENCE = "import dagster"
LOCATIONS = {
    "tpu": "import tpu_assets.definitions as m; m.defs.get_repository_def()",
    "jovian": "import jovian_assets.definitions as m; m.defs.get_repository_def()",
}
# Said by the child once loaded: a code server stays up, so the interpreter's exit (a final
# collection and the teardown of every module) is not
# part of loading, and is not timed on either side.
_LOADED = "; import time; print('loaded', time.process_time(), flush=True)"
OWN = ("resources", "tpu_assets", "jovian_assets", "sensors", "lockstep")
_IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


class Run(NamedTuple):
    wall_s: float
    cpu_s: float


def clean_env(work: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOCKSTEP_", "DAGSTER_"))
        and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")
    }
    for name in ("home", "dagster_home", "cache", "pycache", "cwd"):
        (work / name).mkdir()
    env.update(
        PYTHONPATH=str(ROOT),
        HOME=str(work / "home"),
        DAGSTER_HOME=str(work / "dagster_home"),
        LOCKSTEP_CACHE=str(work / "cache"),
        PYTHONPYCACHEPREFIX=str(work / "pycache"),
    )
    return env


def run(code: str, env: dict[str, str], cwd: Path, *flags: str) -> tuple[Run, str]:
    """Wall seconds from the start of a fresh interpreter until `code` has run, and the CPU seconds
    it used by then (its own count); then `-X importtime`'s report, if asked for."""
    # stderr to a file: `-X importtime` writes more
    # than a pipe holds before the child says it loaded.
    with tempfile.TemporaryFile("w+") as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *flags, "-c", code + _LOADED],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        try:
            said = proc.stdout.readline() if proc.stdout else ""
            wall = time.perf_counter() - start
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errors.seek(0)
        stderr = errors.read()
    if proc.returncode != 0 or not said.startswith("loaded "):
        sys.exit(f"`{code}` failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    return Run(wall, float(said.split()[1])), stderr


def imports(stderr: str) -> dict[str, tuple[int, int, int]]:
    """`-X importtime` as module -> (self us, cumulative
    us, depth), in the order Python printed them."""
    found: dict[str, tuple[int, int, int]] = {}
    for line in stderr.splitlines():
        if m := _IMPORTTIME.match(line):
            found[m.group(4)] = (int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2)
    return found


def first_importer(table: dict[str, tuple[int, int, int]], module: str) -> str:
    """Who imported `module` first: the next entry one
    level up (importtime prints children first)."""
    names = list(table)
    depth = table[module][2]
    for name in names[names.index(module) + 1 :]:
        if table[name][2] == depth - 1:
            return name
    return "-c"


def top_costs(
    reference: dict[str, tuple[int, int, int]],
    location: dict[str, tuple[int, int, int]],
    n: int = 10,
) -> list[tuple[str, float, float, str]]:
    """The `n` dearest packages a location imports beyond `import dagster`: (package, self ms summed
    over its new modules, cumulative ms of its outermost import, who imported that)."""
    own: dict[str, float] = defaultdict(float)
    outer: dict[str, str] = {}
    for name, (self_us, _, depth) in location.items():
        if name in reference:
            continue
        top = name.split(".")[0]
        own[top] += self_us / 1000
        if top not in outer or depth <= location[outer[top]][2]:
            outer[top] = name
    rows = [
        (top, ms, location[outer[top]][1] / 1000, first_importer(location, outer[top]))
        for top, ms in own.items()
    ]
    return sorted(rows, key=lambda r: -r[1])[:n]


def kind_of(package: str) -> str:
    if package in OWN:
        return "lockstep"
    if package == "dagster":
        return "dagster, beyond its import"
    return "stdlib" if package in sys.stdlib_module_names else "third-party"


def median(runs: list[Run], field: str) -> float:
    return statistics.median(getattr(r, field) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=15,
        help=(
            "runs of each location (the reference runs twice as often); single rounds here "
            "vary by +-20%%, so 15"
        ),
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lockstep-load-bench-"))
    try:
        env = clean_env(work)
        cwd = work / "cwd"
        for code in (REFERENCE, *LOCATIONS.values()):  # warm-up: writes the bytecode cache
            run(code, env, cwd)
        ref: list[Run] = []
        loc: dict[str, list[Run]] = {name: [] for name in LOCATIONS}
        for _ in range(args.repeat):
            for name, code in LOCATIONS.items():
                ref.append(run(REFERENCE, env, cwd)[0])
                loc[name].append(run(code, env, cwd)[0])

        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} cores; medians of {args.repeat} "
            "runs per location, "
            f"{len(ref)} of the reference, alternating"
        )
        print(
            f"{'':34}{'wall s':>8}{'CPU s':>8}{'wall / ref':>12}{'CPU / ref':>11}   all wall ratios"
        )
        ref_wall, ref_cpu = median(ref, "wall_s"), median(ref, "cpu_s")
        print(f"{'reference: ' + REFERENCE:34}{ref_wall:>8.2f}{ref_cpu:>8.2f}")
        ratios: dict[str, float] = {}
        for name, runs in loc.items():
            ratios[name] = median(runs, "wall_s") / ref_wall
            paired = ref[list(LOCATIONS).index(name) :: len(LOCATIONS)]
            each = ", ".join(
                f"{r.wall_s / p.wall_s:.2f}" for r, p in zip(runs, paired, strict=True)
            )
            print(
                f"{name + ' location (defs loaded)':34}{median(runs, 'wall_s'):>8.2f}"
                f"{median(runs, 'cpu_s'):>8.2f}"
                f"{ratios[name]:>11.2f}x{median(runs, 'cpu_s') / ref_cpu:>10.2f}x   {each}"
            )

        reference = imports(run(REFERENCE, env, cwd, "-X", "importtime")[1])
        for name, code in LOCATIONS.items():
            location = imports(run(code, env, cwd, "-X", "importtime")[1])
            extra = sum(s for m, (s, _, _) in location.items() if m not in reference) / 1000
            print(
                f"\n{name}: -X importtime beyond `import dagster`: {extra:.0f} ms self time in "
                f"{sum(m not in reference for m in location)} modules; top 10 by package:"
            )
            print(f"  {'package':26}{'self ms':>9}{'cum ms':>9}   first imported by")
            for top, ms, cum, importer in top_costs(reference, location):
                print(f"  {top:26}{ms:>9.1f}{cum:>9.1f}   {importer} ({kind_of(top)})")
            dearest = sorted(
                (m for m in location if m not in reference), key=lambda m: -location[m][0]
            )[:10]
            print(
                "  dearest modules (self ms): "
                + ", ".join(f"{m} {location[m][0] / 1000:.1f}" for m in dearest)
            )
        worse = max(ratios, key=lambda k: ratios[k])
        print(
            ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            + " of `import dagster` (wall, medians)"
        )
        print(
            f"RATIO code-location load ({worse}) / import dagster: {ratios[worse]:.2f} (goal <= "
            f"{GOAL})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
