"""Both code locations load, and the issue's CLI path
works: validate, then materialize on a sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from jovian_assets.definitions import defs as jovian_defs
from sandbox.world import Sandbox, advance_harbor
from tests.conftest import remote_file, remote_head
from tpu_assets.definitions import defs as tpu_defs

pytestmark = pytest.mark.heavy(50)  # seconds, about: the order parallel workers take modules in

ROOT = Path(__file__).resolve().parent.parent


def dagster_cli(
    *args: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dagster", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_tpu_graph_shape() -> None:
    repo = tpu_defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {
        "tpu/harbor_head",
        "tpu/harbor_lock",
        "tpu/image",
        "tpu/smoke",
        "tpu/verified_image",
        "tpu/floating_tag",
        "lockstep/status",
    }
    assert {c.name for c in repo.asset_graph.asset_check_keys} == {
        "lock_and_dockerfile_agree",
        "harbor_version_moved",
        "uv_lock_check",
        "installed_harbor_matches_lock",
        "file_probes",
        "layers_pullable",
        "floating_tag_bakes_locked_harbor",
    }
    graph = repo.asset_graph
    assert graph.get(dg.AssetKey(["tpu", "harbor_lock"])).parent_keys == {
        dg.AssetKey(["tpu", "harbor_head"])
    }
    assert graph.get(dg.AssetKey(["tpu", "verified_image"])).parent_keys == {
        dg.AssetKey(["tpu", "image"]),
        dg.AssetKey(["tpu", "smoke"]),
    }
    # observed by status_sensor, never materialized
    assert graph.get(dg.AssetKey(["lockstep", "status"])).is_external
    for name in (
        "relock_harbor",
        "release_harbor_hold",
        "build_tpu",
        "promote_tpu",
        "rollback_tpu",
        "release_tpu_hold",
        "refresh_status",
    ):
        assert tpu_defs.resolve_job_def(name) is not None
    assert sorted(s.name for s in repo.sensor_defs) == [
        "alert_sensor",
        "auto_promote_sensor",
        "consumer_rebuild_sensor",
        "floating_tag_watch",
        "harbor_branch_sensor",
        "status_sensor",
    ]
    jovian = jovian_defs.get_repository_def()
    assert {k.to_user_string() for k in jovian.asset_graph.get_all_asset_keys()} == {
        "jovian/source_lock",
        "jovian/fork_cut",
        "jovian/build_profile",
        "jovian/dep_table",
        "jovian/dep_trees",
        "jovian/image",
        "jovian/distributed_image",
        "jovian/lane_serving",
        "jovian/lane",
        "jovian/bench_report",
    }
    assert {c.name for c in jovian.asset_graph.asset_check_keys} == {
        "pins_reachable",
        "trees_match",
        "one_cut",
        "newer_cut_available",
        "profile_keys_known",
        "recipes_build_profile_top_level",
        "recipes_no_scattered_pins",
        "gb10_deviations_current",
        "cuda_pins_gated",
        "cmake_pins_resolved",
        "gitlinks_populated",
        "boot_gates",
        "image_labeled",
        "quality_not_below_baseline",
    }
    assert (
        jovian_defs.resolve_job_def("adopt_lab_rev") is not None
        and jovian_defs.resolve_job_def("build_jovian_rev") is not None
    )
    assert [s.name for s in jovian.sensor_defs] == ["lab_rev_sensor", "lane_watch_sensor"]


def test_workspace_validates_and_cli_materialize_relocks_once(sb: Sandbox, tmp_path: Path) -> None:
    env = {
        "LOCKSTEP_SITE": str(sb.site_file),
        "LOCKSTEP_CACHE": str(tmp_path / "cache"),
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    (tmp_path / "home").mkdir()
    validated = dagster_cli("definitions", "validate", "-w", "workspace.yaml", env=env)
    assert validated.returncode == 0, validated.stderr[-3000:]
    said = validated.stdout + validated.stderr
    assert "Validation successful for code location tpu" in said
    assert "Validation successful for code location jovian" in said

    sha = advance_harbor(sb.root)
    before = remote_head(sb.consumer)
    done = dagster_cli(
        "asset",
        "materialize",
        "-m",
        "tpu_assets.definitions",
        "--select",
        "tpu/harbor_lock",
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    head = remote_head(sb.consumer)
    assert head != before and f"#{sha}" in remote_file(sb.consumer, "uv.lock")
    assert f"ENV HARBOR_COMMIT={sha}" in remote_file(sb.consumer, "docker/Dockerfile.tpu")
    instance = dg.DagsterInstance.from_config(str(tmp_path / "home"))
    evaluations = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [
            dg.AssetCheckKey(dg.AssetKey(["tpu", "harbor_lock"]), n)
            for n in ("lock_and_dockerfile_agree", "harbor_version_moved", "uv_lock_check")
        ]
    )
    assert len(evaluations) == 3 and all(
        e.status.value == "SUCCEEDED" for e in evaluations.values()
    )


OWNERS_OF_EVERY_ASSET = """
import json
from jovian_assets.definitions import defs as j
from tpu_assets.definitions import defs as t

print(json.dumps({k.to_user_string(): d.get_repository_def().asset_graph.get(k).owners
                  for d in (t, j) for k in d.get_repository_def().asset_graph.get_all_asset_keys()}))
"""  # noqa: E501


def load_locations(site: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Import both definitions modules in a fresh process,
    as `dagster dev` would, with LOCKSTEP_SITE set."""
    return subprocess.run(
        [sys.executable, "-c", OWNERS_OF_EVERY_ASSET],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "LOCKSTEP_SITE": str(site), "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )


def test_owners_come_from_the_site_file_when_the_locations_load(
    sb: Sandbox, tmp_path: Path
) -> None:
    text = sb.site_file.read_text()
    assert '"team:ml-infra"' in text
    sb.site_file.write_text(
        text.replace("[jovian]\n", '[jovian]\nowners = ["serving-oncall@example.com"]\n', 1)
    )
    loaded = load_locations(sb.site_file, tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    owners = json.loads(loaded.stdout)
    # the tpu location's status asset
    assert len(owners) == 17 and owners["lockstep/status"] == ["team:ml-infra"]
    assert {k: v for k, v in owners.items() if k.startswith("tpu/")} == {
        k: ["team:ml-infra"] for k in owners if k.startswith("tpu/")
    }
    assert {k: v for k, v in owners.items() if k.startswith("jovian/")} == {
        k: ["serving-oncall@example.com"] for k in owners if k.startswith("jovian/")
    }


def test_a_broken_site_file_fails_the_location_load_naming_file_and_line(
    sb: Sandbox, tmp_path: Path
) -> None:
    text = sb.site_file.read_text()
    sb.site_file.write_text(text.replace('"team:ml-infra"', '"ML infra"', 1))
    line = sb.site_file.read_text().splitlines().index("owners = [") + 1
    loaded = load_locations(sb.site_file, tmp_path)
    assert loaded.returncode != 0
    assert (
        f"{sb.site_file}:{line}: [site] owners: owner 'ML infra' must be an email address"
        in loaded.stderr
    )


def test_resources_are_built_from_the_site_at_load_with_secrets_as_env_vars(sb: Sandbox) -> None:
    from resources.iris.cli import IrisCli
    from resources.registry import HttpRegistry
    from resources.site.load import load_site
    from tpu_assets.definitions import tpu_resources

    text = sb.site_file.read_text()
    text = text.replace(
        '[registry]\nkind = "layout"', '[registry]\nkind = "http"\ntoken_env = "GHCR_READ_TOKEN"', 1
    )
    text = text.replace(
        'docker_token_env = "LOCKSTEP_SANDBOX_PUSH_TOKEN"',
        'docker_token_env = "GHCR_PUSH_TOKEN"',
        1,
    )
    sb.site_file.write_text(text)
    site = load_site(sb.site_file)
    wired = tpu_resources(site)
    registry, iris = wired["registry"], wired["iris"]
    assert isinstance(registry, HttpRegistry) and isinstance(iris, IrisCli)
    # The UI's Resources tab and run config show the
    # variable's NAME; Dagster resolves the value per run.
    assert isinstance(registry.token, dg.EnvVar) and registry.token == "GHCR_READ_TOKEN"
    assert isinstance(iris.docker_token, dg.EnvVar) and iris.docker_token == "GHCR_PUSH_TOKEN"
    assert wired["site"].loaded_digest == site.digest  # type: ignore[attr-defined]


def test_a_run_refuses_a_site_file_that_changed_since_the_location_loaded(sb: Sandbox) -> None:
    from resources.site.load import load_site
    from resources.site.resource import SiteChanged, site_resource

    resource = site_resource(load_site(sb.site_file))
    assert resource.config().tpu.floating_tag == "tpu"
    sb.site_file.write_text(
        sb.site_file.read_text().replace('cluster = "sandbox"', 'cluster = "elsewhere"')
    )
    with pytest.raises(
        SiteChanged, match=r"changed since this code location loaded it.*Reload the code location"
    ):
        resource.config()


def test_without_a_site_file_at_load_a_run_says_what_to_do(tmp_path: Path) -> None:
    from tpu_assets.definitions import build_defs
    from tpu_assets.keys import IMAGE

    defs = build_defs(None)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("tpu_builds", ["0" * 40])
        result = dg.materialize(
            [*(defs.assets or [])],
            selection=[IMAGE],
            partition_key="0" * 40,
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
        )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_failure)
    text = str(failure.event_specific_data)
    assert (
        "built from the site file when the code location loads" in text
        and "lockstep sandbox up" in text
    )
