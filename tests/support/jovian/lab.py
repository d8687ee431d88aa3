"""Adopting (and building) lab revs in-process on one Dagster instance, as the UI would."""

from __future__ import annotations

import dagster as dg

from jovian_assets.definitions import defs, lab_sensor
from jovian_assets.keys import (
    BENCH,
    BUILD_PROFILE,
    DEP_TABLE,
    DEP_TREES,
    FORK_CUT,
    IMAGE,
    SOURCE_LOCK,
)
from sandbox.world import Sandbox

ASSETS = list(defs.assets or [])


class Lab:
    def __init__(
        self, sb: Sandbox, resources: dict[str, object], instance: dg.DagsterInstance
    ) -> None:
        self.sb, self.resources, self.instance = sb, resources, instance
        self.build_repo = sb.repos / "docker-images.git"
        self.lab_repo = sb.repos / "rtx6kpro.git"

    def tick(self, cursor: str | None) -> dg.SensorResult:
        sensor = lab_sensor(self.resources)
        with dg.build_sensor_context(cursor=cursor, instance=self.instance) as context:
            result = sensor(context)
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions("lab_revs", list(request.partition_keys))
        return result

    def adopt(
        self, rev: str, tags: dict[str, str] | None = None, *, build: bool = False
    ) -> dg.ExecuteInProcessResult:
        """adopt_lab_rev's five assets for `rev`; with build=True also build_jovian_rev's four."""
        if not self.instance.has_dynamic_partition("lab_revs", rev):
            self.instance.add_dynamic_partitions("lab_revs", [rev])
        selection = (
            None
            if build
            else dg.AssetSelection.assets(
                SOURCE_LOCK, FORK_CUT, BUILD_PROFILE, DEP_TABLE, DEP_TREES
            )
        )
        return dg.materialize(
            ASSETS,
            selection=selection,
            partition_key=rev,
            resources=self.resources,
            instance=self.instance,
            tags=tags,
            raise_on_error=False,
        )

    def build(self, rev: str) -> dg.ExecuteInProcessResult:
        """jovian/image alone, from what the adoption assets last recorded for `rev`."""
        return dg.materialize(
            ASSETS,
            selection=dg.AssetSelection.assets(IMAGE),
            partition_key=rev,
            resources=self.resources,
            instance=self.instance,
            raise_on_error=False,
        )

    def bench(self, rev: str) -> dg.ExecuteInProcessResult:
        """jovian/bench_report alone, against what jovian/lane_serving last recorded for `rev`."""
        return dg.materialize(
            ASSETS,
            selection=dg.AssetSelection.assets(BENCH),
            partition_key=rev,
            resources=self.resources,
            instance=self.instance,
            raise_on_error=False,
        )


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def done(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def meta(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict[str, object]:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {
        k: getattr(v, "value", getattr(v, "md_str", v))
        for k, v in event.materialization.metadata.items()
    }
