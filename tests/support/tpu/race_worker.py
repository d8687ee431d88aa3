"""One lockstep writer in its own process: the promote job in-process (`dg.materialize` on
`tpu/floating_tag`) on a shared instance (DAGSTER_HOME) against the shared docker-registry.

    python -m tests.support.tpu.race_worker '<json WorkerArgs>'

Prints one JSON line: whether the run succeeded and, if not, its error. Used by
tests/tpu/test_floating_tag_log.py; `lock: false` swaps the floating-tag lock for nothing, to show
the race it prevents.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
from pydantic import BaseModel

from resources.site.resource import SiteResource
from sandbox.world import Sandbox
from tests.conftest import sandbox_resources
from tests.support.runs import failure_message, materialize
from tests.support.tpu import registries
from tpu_assets import promotion_assets
from tpu_assets.history import FLOATING_TAG

# The move alone: the WARN check on the image at the
# tag reads layers and has nothing to do with the race.
ONLY_THE_MOVE = dg.AssetSelection.assets(FLOATING_TAG).without_checks()


class WorkerArgs(BaseModel):
    home: str
    sandbox: str
    site_file: str
    cache: str
    host: str
    build: str
    registry: str = "RaceWindow"  # a class in tests.support.tpu.registries
    registry_fields: dict[str, object] = {}
    lock: bool = True
    barrier_dir: str = ""
    name: str = ""


def main(args: WorkerArgs) -> dict[str, object]:
    real_lock = promotion_assets.floating_tag_lock

    @contextlib.contextmanager
    def lock(instance: dg.DagsterInstance, **kwargs: object) -> Iterator[str]:
        # this writer has reached the lock (taken or not): the other may wait for it
        if args.barrier_dir:
            (Path(args.barrier_dir) / f"{args.name}.locking").touch()
        if not args.lock:
            yield "no lock (test: the race without it)"
            return
        with real_lock(instance, **kwargs) as where:  # type: ignore[arg-type]
            yield where

    promotion_assets.floating_tag_lock = lock  # type: ignore[assignment]
    registry = getattr(registries, args.registry)(host=args.host, **args.registry_fields)
    resources = {
        **sandbox_resources(Sandbox(root=Path(args.sandbox)), Path(args.cache)),
        "site": SiteResource(path=args.site_file),
        "registry": registry,
    }
    with dg.DagsterInstance.from_config(args.home) as instance:
        run_config = {
            "ops": {"tpu__floating_tag": {"config": {"action": "promote", "build": args.build}}}
        }
        result = materialize(resources, ONLY_THE_MOVE, instance, run_config=run_config)
        return {
            "success": result.success,
            "run_id": result.run_id,
            "error": "" if result.success else failure_message(result),
        }


if __name__ == "__main__":
    os.environ.setdefault("DAGSTER_HOME", json.loads(sys.argv[1])["home"])
    print(json.dumps(main(WorkerArgs.model_validate_json(sys.argv[1]))), flush=True)
