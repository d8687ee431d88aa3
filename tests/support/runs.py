"""Running the tpu location's assets in-process, and reading what a run said."""

from __future__ import annotations

from typing import Any

import dagster as dg
import git

from resources.registry import ImageRef, registry_for
from resources.site.load import load_site
from sandbox.world import Sandbox, advance_harbor
from tpu_assets.definitions import defs
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE
from tpu_assets.keys import HARBOR_LOCK, IMAGE, SMOKE

TPU_ASSETS = [*(defs.assets or []), *(defs.asset_checks or [])]


def materialize(
    resources: dict[str, object],
    selection: Any,
    instance: dg.DagsterInstance | None = None,
    **kwargs: Any,
) -> dg.ExecuteInProcessResult:
    if not isinstance(selection, dg.AssetSelection):
        selection = dg.AssetSelection.assets(*selection)
    return dg.materialize(
        TPU_ASSETS,
        selection=selection,
        resources=resources,
        instance=instance,
        raise_on_error=False,
        **kwargs,
    )


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def metadata(
    result: dg.ExecuteInProcessResult, key: dg.AssetKey | None = None
) -> dict[str, object]:
    if (
        key is None
        and any(e.asset_key == HARBOR_LOCK for e in result.get_asset_materialization_events())
        and any(e.asset_key == FLOATING_TAG for e in result.get_asset_materialization_events())
    ):
        key = FLOATING_TAG  # a rollback that also pinned the runtime: the move is what callers mean
    events = [
        e for e in result.get_asset_materialization_events() if key is None or e.asset_key == key
    ]
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


def failure_metadata(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    """The metadata of the first step failure (a
    dg.Failure's): what the UI shows beside the error."""
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failures, "expected the run to fail"
    data = failures[0].step_failure_data.user_failure_data  # type: ignore[union-attr]
    assert data is not None, "the step failed without a dg.Failure's metadata"
    return {k: str(getattr(v, "md_str", getattr(v, "value", v))) for k, v in data.metadata.items()}


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


BUILD = [IMAGE, SMOKE, VERIFIED_IMAGE]


class Pipeline:
    """The sandbox plus one Dagster instance, driven the way a person would in the UI."""

    def __init__(
        self, sb: Sandbox, resources: dict[str, object], instance: dg.DagsterInstance
    ) -> None:
        self.sb, self.resources, self.instance = sb, resources, instance
        self.site = load_site(sb.site_file)
        self.registry = registry_for(self.site)
        self.repository = ImageRef.parse(self.site.tpu.image).repository

    def relock(self) -> str:
        result = materialize(self.resources, [HARBOR_LOCK], self.instance)
        assert result.success, failure_message(result)
        return result.asset_value(HARBOR_LOCK).consumer_commit

    def build(self, commit: str) -> dg.ExecuteInProcessResult:
        if not self.instance.has_dynamic_partition("tpu_builds", commit):
            self.instance.add_dynamic_partitions("tpu_builds", [commit])
        return materialize(self.resources, BUILD, self.instance, partition_key=commit)

    def tag(self, action: str, **config: str) -> dg.ExecuteInProcessResult:
        run_config = {"ops": {"tpu__floating_tag": {"config": {"action": action, **config}}}}
        return materialize(self.resources, [FLOATING_TAG], self.instance, run_config=run_config)

    def floating(self) -> str | None:
        return self.registry.resolve(
            repository=self.repository, reference=self.site.tpu.floating_tag
        )

    def gitsha(self, commit: str) -> str:
        """The tag's sha as a person's clone of the consumer prints it (`git rev-parse --short`)."""
        return git.Repo(self.sb.consumer).git.rev_parse("--short", commit, kill_after_timeout=60)

    def pinned(self, commit: str) -> str | None:
        return self.registry.resolve(
            repository=self.repository, reference=f"tpu-{self.gitsha(commit)}"
        )


def two_verified_builds(p: Pipeline) -> tuple[list[str], list[dg.AssetMaterialization]]:
    """relock -> build -> checks -> smoke -> verified,
    twice: the harbor fix, then a later commit that keeps
    it. Returns the two builds and the verified_image records, oldest first."""
    builds = []
    for fix in (True, False):
        advance_harbor(p.sb.root, fix=fix)
        commit = p.relock()
        result = p.build(commit)
        assert result.success, failure_message(result)
        builds.append(commit)
    records = [
        r.asset_materialization
        for r in p.instance.fetch_materializations(VERIFIED_IMAGE, limit=10, ascending=True).records
    ]
    return builds, [r for r in records if r is not None]
