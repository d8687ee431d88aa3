"""Running the tpu location's assets in-process, and reading what a run said."""

from __future__ import annotations

from typing import Any

import dagster as dg

from tpu_assets.definitions import defs

TPU_ASSETS = [*(defs.assets or []), *(defs.asset_checks or [])]


def materialize(resources: dict[str, object], selection: Any, instance: dg.DagsterInstance | None = None,
                **kwargs: Any) -> dg.ExecuteInProcessResult:
    if not isinstance(selection, dg.AssetSelection):
        selection = dg.AssetSelection.assets(*selection)
    return dg.materialize(TPU_ASSETS, selection=selection, resources=resources, instance=instance,
                          raise_on_error=False, **kwargs)


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def metadata(result: dg.ExecuteInProcessResult, key: dg.AssetKey | None = None) -> dict[str, object]:
    events = [e for e in result.get_asset_materialization_events() if key is None or e.asset_key == key]
    (event,) = events
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failures, "expected the run to fail"
    error, parts = failures[0].step_failure_data.error, []  # type: ignore[union-attr]
    while error is not None:  # the user's exception is the cause of Dagster's step error
        parts.append(error.message)
        error = error.cause
    return "\n".join(parts)


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
