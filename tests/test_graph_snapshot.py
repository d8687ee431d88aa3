"""The asset graph of both code locations as a committed JSON snapshot
(tests/snapshots/asset_graph.json).

Any change to the graph — an asset, a dependency, a partitioning, a kind, a code version, a check, a
job's selection or config, a sensor's target — changes the snapshot, so it shows up as a diff in
review instead of only in the UI after deploy. When the change is intended, regenerate and commit:

    LOCKSTEP_UPDATE_SNAPSHOT=1 uv run pytest tests/test_graph_snapshot.py

Only the definitions are read (nothing runs, nothing touches the network). Sensors' default status
is left out on purpose: `lockstep demo` starts them running through an environment variable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dagster as dg

from jovian_assets.definitions import build_defs as jovian_defs
from sandbox.world import Sandbox, site_config
from tpu_assets.definitions import build_defs as tpu_defs

SNAPSHOT = Path(__file__).resolve().parent / "snapshots" / "asset_graph.json"
# Owners and the build node's pool come from the site file when a location loads; the snapshot pins
# the sandbox's (built in memory, nothing on disk), so it does not depend on which site file (if
# any) the machine running the test has.
_SITE = site_config(Sandbox(root=Path("/sandbox")))
LOCATIONS = {"tpu": tpu_defs(_SITE), "jovian": jovian_defs(_SITE)}


def _partitions(partitions_def: dg.PartitionsDefinition | None) -> str | None:
    if partitions_def is None:
        return None
    name = getattr(partitions_def, "name", None)
    return f"{type(partitions_def).__name__}:{name}" if name else type(partitions_def).__name__


def location_snapshot(defs: dg.Definitions) -> dict[str, Any]:
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    assets = []
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets.append(
            {
                "key": key.to_user_string(),
                "group": node.group_name,
                "kinds": sorted(node.kinds),
                "deps": sorted(p.to_user_string() for p in node.parent_keys),
                "partitions": _partitions(node.partitions_def),
                "code_version": node.code_version,
                "type": "materializable"
                if node.is_materializable
                else "observable"
                if node.is_observable
                else "external",
                "owners": sorted(node.owners),
                "pools": sorted(node.pools or []),
                "has_description": bool((node.description or "").strip()),
            }
        )
    checks = []
    for check_key in sorted(
        graph.asset_check_keys, key=lambda c: (c.asset_key.to_user_string(), c.name)
    ):
        spec = graph.get_check_spec(check_key)
        entry: dict[str, Any] = {
            "asset": check_key.asset_key.to_user_string(),
            "name": check_key.name,
            "blocking": spec.blocking,
            "has_description": bool((spec.description or "").strip()),
        }
        # a check's severity is decided when it runs;
        severity = (spec.metadata or {}).get("severity")
        # recorded here only if the spec declares it
        if severity is not None:
            entry["severity"] = str(getattr(severity, "value", severity))
        checks.append(entry)
    jobs = []
    for job in sorted(repo.get_all_jobs(), key=lambda j: j.name):
        if job.name.startswith("__"):  # Dagster's implicit asset job
            continue
        layer = job.asset_layer
        jobs.append(
            {
                "name": job.name,
                "assets": sorted(k.to_user_string() for k in layer.selected_asset_keys),
                "checks": sorted(
                    f"{c.asset_key.to_user_string()}:{c.name}"
                    for c in layer.asset_graph.asset_check_keys
                ),
                "partitions": _partitions(job.partitions_def),
                "config": job.run_config if isinstance(job.run_config, dict) else None,
                "tags": dict(sorted((job.tags or {}).items())),
                "has_description": bool((job.description or "").strip()),
            }
        )
    sensors = [
        {
            "name": sensor.name,
            "jobs": sorted(target.job_name for target in sensor.targets),
            "minimum_interval_seconds": sensor.minimum_interval_seconds,
            "has_description": bool((sensor.description or "").strip()),
        }
        for sensor in sorted(repo.sensor_defs, key=lambda s: s.name)
    ]
    schedules = sorted(s.name for s in repo.schedule_defs)
    return {
        "assets": assets,
        "checks": checks,
        "jobs": jobs,
        "sensors": sensors,
        "schedules": schedules,
    }


def graph_snapshot() -> dict[str, Any]:
    return {name: location_snapshot(defs) for name, defs in LOCATIONS.items()}


def render(snapshot: dict[str, Any]) -> str:
    return json.dumps(snapshot, indent=2, sort_keys=False) + "\n"


def test_asset_graph_matches_snapshot() -> None:
    current = render(graph_snapshot())
    if os.environ.get("LOCKSTEP_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(current, encoding="utf-8")
        print(f"\nwrote {SNAPSHOT}")
        return
    assert SNAPSHOT.exists(), (
        f"{SNAPSHOT} is missing: generate it with LOCKSTEP_UPDATE_SNAPSHOT=1 uv run pytest "
        "tests/test_graph_snapshot.py"
    )
    committed = SNAPSHOT.read_text(encoding="utf-8")
    if committed != current:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                current.splitlines(keepends=True),
                fromfile="tests/snapshots/asset_graph.json (committed)",
                tofile="the graph as defined now",
                n=2,
            )
        )
        raise AssertionError(
            "the asset graph changed. If that is intended, regenerate the snapshot and commit it "
            "with the change:\n"
            "  LOCKSTEP_UPDATE_SNAPSHOT=1 uv run pytest tests/test_graph_snapshot.py\n\n" + diff
        )


def test_snapshot_covers_every_asset_and_check() -> None:
    """The snapshot is about the graph, not a subset of
    it: every key and check of both locations is in it."""
    snap = graph_snapshot()
    for name, defs in LOCATIONS.items():
        graph = defs.get_repository_def().asset_graph
        assert {a["key"] for a in snap[name]["assets"]} == {
            k.to_user_string() for k in graph.get_all_asset_keys()
        }
        assert len(snap[name]["checks"]) == len(graph.asset_check_keys)
        assert all(a["group"] == name for a in snap[name]["assets"]), (
            "each location's assets are in its own group"
        )
