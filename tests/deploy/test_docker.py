"""The single-host Docker deployment (deploy/docker/) holds together without Docker: the instance
config passes Dagster's own schema, the run launcher's config passes DockerRunLauncher's, the
workspace serves both code locations from the containers that load them, the compose services agree
with each other and with dagster.yaml, and no committed
file carries a secret value. Offline and fast.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.workspace.config_schema import ensure_workspace_config
from dagster_docker import DockerRunLauncher

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
INSTANCE = DOCKER / "dagster.yaml"
COMPOSE = DOCKER / "docker-compose.yml"
WORKSPACE = DOCKER / "workspace.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DAGSTER_HOME = "/opt/dagster/dagster_home"
SITE_DIR = "/etc/lockstep/site"
KUBE_DIR = "/etc/lockstep/kube"
# Names that hold a credential: their value must come from the environment, never from a file.
SECRETISH = re.compile(r"(PASSWORD|PASSPHRASE|TOKEN|SECRET|PRIVATE|API_KEY)", re.IGNORECASE)
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::?[-?+][^}]*)?\}")
SECRET_LOOKING = {
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "GitHub token": re.compile(r"\b(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}"),
    "credentials in a URL": re.compile(r"://[^/\s:@]+:[^/\s@]+@"),
}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _env_example() -> dict[str, str]:
    pairs = {}
    for number, line in enumerate(ENV_EXAMPLE.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{ENV_EXAMPLE}:{number}: not KEY=VALUE: {line!r}"
            pairs[key.strip()] = value
    return pairs


def _env_names(node: object) -> Iterator[str]:
    """Every `{env: NAME}` in a Dagster config tree."""
    if isinstance(node, dict):
        if set(node) == {"env"}:
            yield node["env"]
        for value in node.values():
            yield from _env_names(value)
    elif isinstance(node, list):
        for value in node:
            yield from _env_names(value)


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _mounts(volumes: list[str]) -> dict[str, tuple[str, str]]:
    """target -> (source, mode) for `source:target[:mode]` volume strings."""
    out = {}
    for spec in volumes:
        # A source may be a ${NAME:-default} interpolation, whose ':-' is not a separator.
        source = INTERPOLATION.match(spec)
        head = source.group(0) if source else ""
        _, target, *mode = ("x" + spec[len(head) :]).split(":") if head else spec.split(":")
        out[target] = (head or spec.split(":")[0], mode[0] if mode else "rw")
    return out


@pytest.fixture(scope="module")
def instance() -> dict[str, Any]:
    return _yaml(INSTANCE)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(COMPOSE)


@pytest.fixture(scope="module")
def launcher(instance: dict[str, Any]) -> dict[str, Any]:
    return instance["run_launcher"]["config"]


def test_instance_config_passes_dagsters_own_schema(
    instance: dict[str, Any], tmp_path: Path
) -> None:
    shutil.copy(INSTANCE, tmp_path / "dagster.yaml")
    # raises DagsterInvalidConfigError
    validated, custom_class = dagster_instance_config(str(tmp_path))
    assert custom_class is None
    assert set(validated["storage"]) == {"postgres"}
    assert instance["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert (instance["run_launcher"]["module"], instance["run_launcher"]["class"]) == (
        "dagster_docker",
        "DockerRunLauncher",
    )
    assert validated["run_monitoring"]["enabled"] is True
    retries = validated["run_retries"]
    assert retries["enabled"] and retries["max_retries"] >= 1
    # a failed check is a finding, not a flake
    assert retries["retry_on_asset_or_op_failure"] is False
    assert validated["retention"]["sensor"]["purge_after_days"]["skipped"] > 0
    assert validated["concurrency"]["pools"] == {"granularity": "run", "default_limit": 1}


def test_run_launcher_config_passes_docker_run_launchers_schema(launcher: dict[str, Any]) -> None:
    result = validate_config(DockerRunLauncher.config_type(), launcher)
    assert result.success, [e.message for e in result.errors or []]
    # its own checks: no image/environment/network inside container_kwargs
    DockerRunLauncher(**launcher)
    names = launcher["env_vars"]
    assert all("=" not in name for name in names), (
        "env_vars name variables; a KEY=VALUE would bake the value into the file"
    )
    assert {"LOCKSTEP_SITE", "GHCR_TOKEN", "SPARK_SSH_PASSPHRASE"} <= set(names)
    assert {n for n in names if n.startswith("DAGSTER_POSTGRES_")} == {
        "DAGSTER_POSTGRES_USER",
        "DAGSTER_POSTGRES_PASSWORD",
        "DAGSTER_POSTGRES_HOST",
        "DAGSTER_POSTGRES_DB",
        "DAGSTER_POSTGRES_PORT",
    }
    # The site's DIRECTORY (an edited file is seen), the SSH material and the kubeconfig, read-only,
    # by the names of the compose file's bind volumes: the launcher's config holds no host path.
    mounts = _mounts(launcher["container_kwargs"]["volumes"])
    example = _env_example()
    assert Path(example["LOCKSTEP_SITE"]).parent == Path(SITE_DIR)
    assert Path(example["KUBECONFIG"]).parent == Path(KUBE_DIR)
    assert mounts[SITE_DIR] == ("lockstep_site", "ro")
    assert mounts["/etc/lockstep/ssh"] == ("lockstep_ssh", "ro")
    assert mounts[KUBE_DIR] == ("lockstep_kube", "ro")


def _locations() -> tuple[Any, Any]:
    from jovian_assets.definitions import defs as jovian
    from tpu_assets.definitions import defs as tpu

    return tpu, jovian


def test_every_pool_in_code_is_described_with_its_limit() -> None:
    pools = {
        a.node_def.pool
        for defs in _locations()
        for a in defs.assets or []
        if getattr(a, "node_def", None)
    }
    pools.discard(None)
    assert {"iris_builds", "tag_moves"} <= pools
    text = INSTANCE.read_text()
    for pool in pools:
        assert str(pool).split("/")[0] in text, (
            f"pool {pool} is used in code but dagster.yaml does not say how it is limited"
        )
    assert (
        "lockstep pools --apply" in text and "dagster instance concurrency set iris_builds" in text
    )


def test_run_retries_are_safe_because_the_jobs_that_must_not_repeat_opt_out(
    instance: dict[str, Any],
) -> None:
    """The instance retries crashed runs; a retried rollback would walk one build further back."""
    assert instance["run_retries"]["enabled"]
    opted_out = {
        job.name
        for defs in _locations()
        for job in defs.jobs or []
        if job.tags.get("dagster/max_retries") == "0"
    }
    assert {"promote_tpu", "rollback_tpu", "release_tpu_hold", "build_jovian_rev"} <= opted_out
    for job in opted_out:
        assert job in INSTANCE.read_text(), f"dagster.yaml's run_retries comment should name {job}"


def test_workspace_serves_both_locations_from_the_containers_that_load_their_modules(
    compose: dict[str, Any],
) -> None:
    workspace = _yaml(WORKSPACE)
    ensure_workspace_config(workspace, str(WORKSPACE))
    local = _yaml(REPO / "workspace.yaml")["load_from"]  # what `lockstep demo` loads
    modules = {
        e["python_module"]["location_name"]: e["python_module"]["module_name"] for e in local
    }
    assert modules == {"tpu": "tpu_assets.definitions", "jovian": "jovian_assets.definitions"}
    servers = {e["grpc_server"]["location_name"]: e["grpc_server"] for e in workspace["load_from"]}
    assert set(servers) == set(modules)
    for name, server in servers.items():
        service = compose["services"][server["host"]]
        command = service["command"]
        assert command[:3] == ["dagster", "code-server", "start"]
        assert _arg(command, "-m") == modules[name]
        assert _arg(command, "--location-name") == name
        assert int(_arg(command, "-p")) == server["port"]
        # reachable from the webserver and daemon containers
        assert _arg(command, "-h") == "0.0.0.0"
        # Runs are launched in the image the code server says it runs in.
        assert service["environment"]["DAGSTER_CURRENT_IMAGE"] == service["image"]
        assert set(service["networks"]) & set(compose["services"]["webserver"]["networks"])


def test_compose_services_agree_with_each_other_and_with_dagster_yaml(
    compose: dict[str, Any], instance: dict[str, Any], launcher: dict[str, Any]
) -> None:
    services, volumes, networks = compose["services"], compose["volumes"], compose["networks"]
    assert {"postgres", "tpu", "jovian", "webserver", "daemon"} <= set(services)
    # Production's images by default; a site without Docker Hub names its own in .env.
    assert services["postgres"]["image"] == "${LOCKSTEP_POSTGRES_IMAGE:-postgres:15}"
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on {dep}, which is not a service"
        for network in service.get("networks", []):
            assert network in networks, f"{name} is on network {network}, which is not defined"
        for source, _ in _mounts(service.get("volumes", [])).values():
            if source.startswith("${"):
                continue  # a host path from .env (the docker socket)
            if not source.startswith(("/", ".")):
                assert source in volumes, f"{name} mounts volume {source}, which is not defined"
            elif source.startswith("."):
                assert (DOCKER / source).exists(), (
                    f"{name} mounts {source}, which is not in deploy/docker"
                )

    # The images: built from deploy/Dockerfile with the repo root as context, one image for all.
    for name in ("tpu", "jovian", "webserver", "daemon"):
        build = services[name]["build"]
        assert (DOCKER / build["context"]).resolve() == REPO and build[
            "dockerfile"
        ] == "deploy/Dockerfile"
        assert services[name]["image"] == services["tpu"]["image"]
    dockerfile = REPO / "deploy" / "Dockerfile"
    assert dockerfile.exists(), (
        "deploy/Dockerfile (the image every lockstep container runs) is missing"
    )
    image_user = re.findall(r"^USER\s+(\d+)", dockerfile.read_text(), re.MULTILINE)[-1]
    assert re.search(rf"DAGSTER_HOME={re.escape(DAGSTER_HOME)}\b", dockerfile.read_text())

    # The launcher's network and named volumes are the compose file's, by their fixed names.
    assert launcher["network"] in {n.get("name") for n in networks.values()}
    named = {v["name"] for v in volumes.values()}
    run_mounts = _mounts(launcher["container_kwargs"]["volumes"])
    for source, _ in run_mounts.values():
        if not source.startswith("/"):
            assert source in named, f"runs mount volume {source}, but compose names no volume so"

    # Webserver and daemon: the instance and workspace from this directory, in DAGSTER_HOME.
    storage_target = f"{DAGSTER_HOME}/storage"
    assert instance["local_artifact_storage"]["config"]["base_dir"] == DAGSTER_HOME
    assert instance["compute_logs"]["config"]["base_dir"] == storage_target
    for name in ("webserver", "daemon"):
        service = services[name]
        mounts = _mounts(service["volumes"])
        assert service["environment"]["DAGSTER_HOME"] == DAGSTER_HOME
        assert mounts[f"{DAGSTER_HOME}/dagster.yaml"] == ("./dagster.yaml", "ro")
        assert mounts[f"{DAGSTER_HOME}/workspace.yaml"] == ("./workspace.yaml", "ro")
        assert _arg(service["command"], "-w") == f"{DAGSTER_HOME}/workspace.yaml"
        assert "/var/run/docker.sock" in mounts  # launching and stopping run containers
        # Asset values and step logs: the same volume as every run container.
        source = mounts[storage_target][0]
        assert source in named and run_mounts[storage_target][0] == source
        assert set(service["depends_on"]) == {"postgres", "tpu", "jovian"}
    # The image runs unprivileged: new named volumes are handed to its user before anything writes
    # them, and the webserver and daemon reach the docker socket through the host's docker group.
    owner = services["volume-owner"]
    assert owner["user"] == "0:0" and owner["command"][:2] == [
        "chown",
        f"{image_user}:{image_user}",
    ]
    assert set(owner["command"][2:]) == {
        t for t, (src, mode) in run_mounts.items() if not src.startswith("/") and mode != "ro"
    }
    for name in ("tpu", "jovian"):
        # The volumes are owned and the instance's tables exist before a code server opens either.
        assert services[name]["depends_on"] == {
            "volume-owner": {"condition": "service_completed_successfully"},
            "instance-schema": {"condition": "service_completed_successfully"},
        }
    assert services["instance-schema"]["command"] == ["dagster", "instance", "migrate"]
    assert services["instance-schema"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"}
    }
    for name in ("webserver", "daemon"):
        assert INTERPOLATION.fullmatch(services[name]["group_add"][0]).group(1) == "DOCKER_GID"  # type: ignore[union-attr]
    # Code servers evaluate sensors: exactly the volumes runs get (the site's directory, git's SSH
    # material, the kubeconfig read-only; storage and the git cache shared).
    for name in ("tpu", "jovian"):
        mounts = _mounts(services[name]["volumes"])
        assert {t: m for t, m in mounts.items() if not t.endswith("dagster.yaml")} == run_mounts, (
            name
        )
    # The host directories behind the bind volumes come from .env, with production's defaults.
    for volume, var, default in (
        ("lockstep_site", "LOCKSTEP_SITE_DIR", SITE_DIR),
        ("lockstep_ssh", "LOCKSTEP_SSH_DIR", "/etc/lockstep/ssh"),
        ("lockstep_kube", "LOCKSTEP_KUBE_DIR", KUBE_DIR),
    ):
        opts = volumes[volume]["driver_opts"]
        assert (
            opts["type"] == "none"
            and opts["o"] == "bind"
            and opts["device"] == f"${{{var}:-{default}}}"
        )
        assert _env_example()[var] == default
    assert services["webserver"]["ports"] == [
        "${LOCKSTEP_UI_BIND:-127.0.0.1}:${LOCKSTEP_UI_PORT:-3000}:3000"
    ]


def test_postgres_env_names_match_between_compose_and_dagster_yaml(
    compose: dict[str, Any], instance: dict[str, Any], launcher: dict[str, Any]
) -> None:
    storage_env = set(_env_names(instance["storage"]))
    assert storage_env == {
        "DAGSTER_POSTGRES_USER",
        "DAGSTER_POSTGRES_PASSWORD",
        "DAGSTER_POSTGRES_HOST",
        "DAGSTER_POSTGRES_DB",
        "DAGSTER_POSTGRES_PORT",
    }
    services = compose["services"]
    for name in ("tpu", "jovian", "webserver", "daemon"):
        env = services[name]["environment"]
        for var in storage_env:
            match = INTERPOLATION.fullmatch(str(env[var]))
            assert match and match.group(1) == var, (
                f"{name}: {var} must come from .env as ${{{var}}}"
            )
    # The server creates exactly the user and database dagster.yaml logs in as.
    server = services["postgres"]["environment"]
    for pg_var, dagster_var in (
        ("POSTGRES_USER", "DAGSTER_POSTGRES_USER"),
        ("POSTGRES_PASSWORD", "DAGSTER_POSTGRES_PASSWORD"),
        ("POSTGRES_DB", "DAGSTER_POSTGRES_DB"),
    ):
        match = INTERPOLATION.fullmatch(str(server[pg_var]))
        assert match and match.group(1) == dagster_var
    example = _env_example()
    assert example["DAGSTER_POSTGRES_HOST"] == "postgres" and "postgres" in services
    assert example["DAGSTER_POSTGRES_PORT"] == "5432"
    # Runs get the same names; the daemon must have every
    # name it forwards (an unset one fails the launch).
    assert storage_env <= set(launcher["env_vars"])
    daemon_env = set(services["daemon"]["environment"]) | (
        set(example) if ".env" in services["daemon"]["env_file"] else set()
    )
    assert set(launcher["env_vars"]) <= daemon_env
    # Every variable compose interpolates is named in .env.example.
    assert set(INTERPOLATION.findall(COMPOSE.read_text())) <= set(example)


def test_no_secret_value_is_committed(instance: dict[str, Any], compose: dict[str, Any]) -> None:
    example = _env_example()
    for key, value in example.items():
        if SECRETISH.search(key):
            assert value == "", f"{ENV_EXAMPLE.name}: {key} must be left empty in the example"

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if SECRETISH.search(str(key)) and not isinstance(value, (dict, list)):
                    raise AssertionError(
                        f"{INSTANCE.name}: {path}{key} is a literal; use {{env: NAME}}"
                    )
                walk(value, f"{path}{key}.")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}{i}.")

    walk(instance, "")
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if SECRETISH.search(key):
                assert INTERPOLATION.fullmatch(str(value)), (
                    f"compose {name}: {key} must be ${{NAME}} from .env, not a value"
                )

    committed = [p for p in DOCKER.rglob("*") if p.is_file() and p.name != ".env"]
    assert {p.name for p in committed} >= {
        "dagster.yaml",
        "docker-compose.yml",
        "workspace.yaml",
        ".env.example",
    }
    for path in committed:
        text = path.read_text()
        for what, pattern in SECRET_LOOKING.items():
            assert not pattern.search(text), f"{path.relative_to(REPO)}: looks like a {what}"
    # The filled-in .env never gets committed by accident.
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/docker/.env"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    assert ignored.returncode == 0, "deploy/docker/.env is not git-ignored"
