"""A promotion's reads and a rollback plan at 100 and at 10,000 records, vs one
fetch_materializations(limit=1).

    python bench/history_bench.py [--records 10000] [--rounds 15] [--backends sqlite,postgres]

For each backend (SQLite: a local instance; Postgres: a private server this bench starts on a free
port and stops by PID, tests/support/postgres_server.py) and each size, an instance is filled with N
`tpu/verified_image` records (builds 0..N-1) and N-1 `tpu/floating_tag` promotions (each build over
the one before; the newest build is verified, not promoted yet), batched
(tests/support/tpu/history_fill.py). Then, alternating in one
loop (the order rotates every round, so all see the same load):

- base: one `fetch_materializations(tpu/floating_tag, limit=1)`;
- promote: what promote_tpu reads before its registry write, the registry agreeing with the log:
  the newest move, the newest verified builds and their rejections (`log_state`, `policy_gate`,
  `decide_move`; on Postgres the policy's reads in flight while the log is read, `read_ahead`), then
  the verified records the attestation and the changelog look up (the target, the build on the tag);
  also as promote_tpu read it before (`before`: one verified record first, every read in turn);
- rollback: the rollback plan (`rollback_plan` over
  `tag_history`/`verified_history`), current digest
  as the log has it (the registry read is not part of the plan).

Medians. Once per backend, at 100, the old readers' cost is shown for scale (reading both histories
whole, as every promotion and plan did; at 10,000 that alone outruns the bench's budget). Prints
promote/base and rollback/base at each size; the last line is the worst of those ratios at N (goal
<= 3). Asserts nothing about timings; checks that every plan
decides what it must (the right target, the right build), or stops.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Run as a script: the repo root is not on sys.path, and
# the fill and the Postgres launcher live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg

from resources.git import GitRemotes
from resources.site.promotion import PromotionSection
from tests.support.postgres_server import start_postgres, stop_postgres
from tests.support.tpu import history_fill as hf
from tpu_assets.history import (
    FLOATING_TAG,
    PROMOTE_FIRST,
    VERIFIED_IMAGE,
    log_state,
    read_ahead,
    tag_history,
    verified_history,
)
from tpu_assets.promotion import decide_move, rollback_plan
from tpu_assets.rejection import now_utc, policy_gate


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def old_full_read(instance: dg.DagsterInstance) -> None:
    """What history.py's readers did before: every record of both assets, 500 at a time."""
    for key in (FLOATING_TAG, VERIFIED_IMAGE):
        cursor = None
        while True:
            page = instance.fetch_materializations(key, limit=500, cursor=cursor)
            if not page.has_more:
                break
            cursor = page.cursor


def measure(
    instance: dg.DagsterInstance, filled: hf.Filled, git: GitRemotes, rounds: int
) -> dict[str, float]:
    cfg = hf.site()

    def base() -> None:
        (record,) = instance.fetch_materializations(FLOATING_TAG, limit=1).records
        assert record is not None

    def promote(first: int = PROMOTE_FIRST, ahead: bool = True) -> None:
        verified = verified_history(instance, first=first)  # as floating_tag reads for a promote

        def gate() -> tuple[str, object]:
            return policy_gate(
                instance, PromotionSection(), verified=verified, build="", now=now_utc()
            )

        # before: judged after the log was read
        judged = read_ahead(instance, gate) if ahead else None
        logged = tag_history(instance, first=1)
        # the registry agrees with the log
        state = log_state(instance, logged, registry_at=filled.digests[-2])
        build, _ = judged.result() if judged is not None else gate()
        move, _ = decide_move(
            "promote",
            site=cfg,
            git=git,
            verified=verified,
            logged=logged,
            found=[],
            current=state.current,
            build=build,
        )
        assert (
            move is not None
            and move.build == filled.builds[-1]
            and move.from_digest == filled.digests[-2]
        )
        # The attestation's and the changelog's lookups (the
        # target's record, the baked harbor at both ends).
        assert verified.with_digest(move.to_digest or "", build=move.build) is not None
        came_from = verified.with_digest(move.from_digest)
        assert came_from is not None and came_from.build == filled.builds[-2]
        assert verified.with_digest(move.to_digest or "") is not None

    def rollback() -> None:
        plan = rollback_plan(
            cfg,
            git,
            verified=verified_history(instance),
            moves=tag_history(instance),
            current=filled.digests[-2],
        )
        assert plan.target is not None and plan.target.digest == filled.digests[-3]

    # `before`: the same as promote_tpu read it before:
    # one verified record first, every read in turn.
    work = {
        "base": base,
        "promote": promote,
        "before": lambda: promote(1, ahead=False),
        "rollback": rollback,
    }
    for fn in work.values():  # warm: imports, connections, the first page of every statement
        fn()
    times: dict[str, list[float]] = {name: [] for name in work}
    names = list(work)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(work[name]))
    return {name: statistics.median(ts) for name, ts in times.items()}


@contextmanager
def sqlite_instance() -> Iterator[dg.DagsterInstance]:
    with (
        tempfile.TemporaryDirectory(prefix="history-bench-") as home,
        dg.instance_for_test(temp_dir=home) as instance,
    ):
        yield instance


def postgres_instances() -> Iterator[Callable[[], object]]:
    """A factory of instances, each on a fresh database
    of one private server (stopped by PID at the end)."""
    server = start_postgres()
    try:

        @contextmanager
        def make() -> Iterator[dg.DagsterInstance]:
            db = server.fresh_database("history_bench")
            with (
                tempfile.TemporaryDirectory(prefix="history-bench-") as home,
                dg.instance_for_test(
                    temp_dir=home, overrides={"storage": {"postgres": {"postgres_url": db.url}}}
                ) as instance,
            ):
                yield instance

        yield make
    finally:
        stop_postgres(server)


def run_backend(
    name: str, make: Callable[[], object], sizes: list[int], rounds: int, git: GitRemotes
) -> list[float]:
    ratios = []
    for n in sizes:
        with make() as instance:  # type: ignore[attr-defined]
            start = time.perf_counter()
            filled = hf.fill(instance, hf.site(), n, promotions=n - 1)
            fill_s = time.perf_counter() - start
            m = measure(instance, filled, git, rounds)
            # At 100 only: the old readers grow with the
            # history (76 s at 10,000 on SQLite, contended).
            old = (
                (
                    ", old readers (both histories whole) "
                    f"{timed(lambda: old_full_read(instance)) * 1e3:.0f} ms"
                )
                if n == sizes[0]
                else ""
            )
        promote, rollback = m["promote"] / m["base"], m["rollback"] / m["base"]
        print(
            f"{name:8} {n:>6} builds + {n - 1:>6} promotions (fill {fill_s:.1f} s): limit=1 "
            f"{m['base'] * 1e3:.1f} ms, "
            f"promote {m['promote'] * 1e3:.1f} ms ({promote:.2f}x; as before: "
            f"{m['before'] * 1e3:.1f} ms, "
            f"{m['before'] / m['base']:.2f}x), rollback plan {m['rollback'] * 1e3:.1f} ms "
            f"({rollback:.2f}x){old}",
            flush=True,
        )
        ratios = [promote, rollback]
    return ratios


def main() -> None:
    # A SIGTERM ends the bench through its `finally`s, so the Postgres it started is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--records", type=int, default=10_000, help="builds (and promotions) at the large size"
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    sizes = [100, args.records]
    worst: list[float] = []
    print(f"base, promote and rollback measured alternating; medians of {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="history-bench-git-") as cache:
        git = GitRemotes(cache_dir=cache)  # a plan without must_contain asks git nothing
        for backend in args.backends.split(","):
            if backend == "sqlite":
                worst += run_backend("sqlite", sqlite_instance, sizes, args.rounds, git)
            elif backend == "postgres":
                for make in postgres_instances():
                    worst += run_backend("postgres", make, sizes, args.rounds, git)
            else:
                raise SystemExit(f"--backends: {backend!r} is not sqlite or postgres")
    print(
        f"RATIO promotion / rollback plan at {args.records:,} records: seconds / one "
        "fetch_materializations(limit=1): "
        f"{max(worst):.2f} (goal <= 3)"
    )


if __name__ == "__main__":
    main()
