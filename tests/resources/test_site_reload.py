"""The "site changed" error names what to do on the
deployment it runs in, and a code server whose site
is a Kubernetes ConfigMap mounted as a directory
sees the edit as a change (not as a missing file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resources.site.cache import SiteCache
from resources.site.load import load_site
from resources.site.reload import COMPOSE_RESTART, reload_advice
from resources.site.resource import SiteChanged, site_resource
from tests.support.site_example import EXAMPLE_KEY, example_site


def _changed_error(tmp_path: Path) -> str:
    site = example_site(tmp_path)
    resource = site_resource(load_site(site))
    site.write_text(
        site.read_text(encoding="utf-8").replace("cpu = 16 ", "cpu = 8 "), encoding="utf-8"
    )
    with pytest.raises(SiteChanged) as caught:
        resource.config()
    return str(caught.value)


def test_compose_says_restart_the_code_server_containers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKSTEP_DEPLOYMENT", "compose")
    message = _changed_error(tmp_path)
    assert f"`{COMPOSE_RESTART}`" in message
    assert (
        COMPOSE_RESTART
        == "docker compose -p lockstep -f deploy/docker/docker-compose.yml restart tpu jovian"
    )
    assert "which keep the file they loaded" in message and "Reload" not in message


def test_kubernetes_says_rollout_restart_of_both_user_deployments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKSTEP_DEPLOYMENT", "kubernetes")
    # the chart sets it in code servers
    monkeypatch.setenv("DAGSTER_K8S_PIPELINE_RUN_NAMESPACE", "lockstep-prod")
    message = _changed_error(tmp_path)
    assert (
        "`kubectl -n lockstep-prod rollout restart deployment -l "
        "'component=user-deployments,deployment in (tpu,jovian)'`"
    ) in message
    assert "Reload the code location" not in message


def test_kubernetes_without_the_charts_env_reads_the_pods_namespace(tmp_path: Path) -> None:
    namespace = tmp_path / "namespace"
    namespace.write_text("team-a\n")
    assert "kubectl -n team-a rollout restart" in reload_advice(
        {"LOCKSTEP_DEPLOYMENT": "kubernetes"}, namespace
    )
    # Neither: a placeholder the person fills in, never a guess.
    assert "kubectl -n <namespace> rollout restart" in reload_advice(
        {"LOCKSTEP_DEPLOYMENT": "kubernetes"}, tmp_path / "absent"
    )


def test_unset_keeps_the_reload_of_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCKSTEP_DEPLOYMENT", raising=False)
    message = _changed_error(tmp_path)
    assert (
        "Reload the code location (UI: Deployment -> Reload, or restart `lockstep demo`)" in message
    )
    assert "docker compose" not in message and "kubectl" not in message


def test_an_unknown_deployment_says_so_and_falls_back_to_the_reload() -> None:
    advice = reload_advice({"LOCKSTEP_DEPLOYMENT": "nomad"})
    assert advice.startswith("Reload the code location") and "LOCKSTEP_DEPLOYMENT='nomad'" in advice


def _configmap_version(mount: Path, name: str, site_text: str, key: bytes) -> None:
    """What the kubelet writes for a ConfigMap volume:
    the files in a timestamped directory, `..data`
    swapped to it with a rename, and each key a symlink
    through `..data`; the old directory is removed."""
    version = mount / name
    (version / "keys").mkdir(parents=True)
    (version / "site.toml").write_text(site_text, encoding="utf-8")
    (version / EXAMPLE_KEY).write_bytes(key)
    (mount / "..data_tmp").symlink_to(name)
    os.replace(mount / "..data_tmp", mount / "..data")
    for entry in ("site.toml", "keys"):
        if not (mount / entry).is_symlink():
            (mount / entry).symlink_to(f"..data/{entry}")


def test_a_configmap_directory_mount_edit_is_a_site_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SiteCache, "SETTLED_NS", 0)
    monkeypatch.setenv("LOCKSTEP_DEPLOYMENT", "kubernetes")
    source = example_site(tmp_path / "source")
    text, key = source.read_text(encoding="utf-8"), (source.parent / EXAMPLE_KEY).read_bytes()
    mount = tmp_path / "etc-lockstep-site"
    mount.mkdir()
    _configmap_version(mount, "..2026_01_01_00_00_00.1", text, key)
    site = load_site(mount / "site.toml")
    # The path as the deployment names it, and the trusted key beside it read through the mount.
    assert site.path == mount / "site.toml" and site.attest is not None
    resource = site_resource(site)
    assert resource.config().iris is not None

    _configmap_version(mount, "..2026_01_01_00_05_00.2", text.replace("cpu = 16 ", "cpu = 8 "), key)
    for old in (mount / "..2026_01_01_00_00_00.1").rglob("*"):
        if old.is_file():
            old.unlink()
    (mount / "..2026_01_01_00_00_00.1" / "keys").rmdir()
    (mount / "..2026_01_01_00_00_00.1").rmdir()
    with pytest.raises(SiteChanged, match=r"etc-lockstep-site/site\.toml changed since .*kubectl"):
        resource.config()
    assert load_site(mount / "site.toml").iris.cpu == 8  # type: ignore[union-attr]
