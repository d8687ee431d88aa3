"""The shipped compose deployment (deploy/docker/) brought up on a real, private Docker engine.

What differs from a team's host, and why, is all here:
- the images are built offline: deploy/Dockerfile from bases made of this machine's files
  (sandbox/deploy_images.py), Postgres from Debian's server with the official image's contract;
- the site is a sandbox's, whose files live at absolute
  paths (git remotes, its iris stand-in, the image
  layout registry): the sandbox, this checkout (the iris stand-in runs from it) and the iris
  engine's socket are mounted at their own paths into the code servers and, through the code
  servers' ``--container-context`` (the location-level config Dagster merges into the run
  launcher's), into every run container; those containers
  run as root because the sandbox's files are root's;
- the compose file, dagster.yaml and workspace.yaml
  are copied unchanged into a project directory with
  the `.env` a team writes (deploy/docker/.env.example's
  names) and one override file with the above.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandbox.deploy_images import POSTGRES_IMAGE, build_lockstep_image
from sandbox.engines import DOCKER, Engine
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "deploy" / "docker"
PROJECT = "lockstep"
IMAGE = "lockstep:live-test"
CODE_SERVICES = ("tpu", "jovian")
UP_TIMEOUT_S = 300


def compose_binary() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        raise RuntimeError(
            "docker-compose not found: install Debian's docker-compose (./dev setup does)"
        )
    return found


@dataclass
class Stack:
    engine: Engine
    project: Path
    env: dict[str, str]
    ui_port: int

    def compose(
        self, *args: str, timeout: float = UP_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [
            compose_binary(),
            "-p",
            PROJECT,
            "-f",
            "docker-compose.yml",
            "-f",
            "override.yml",
            *args,
        ]
        proc = subprocess.run(
            argv,
            cwd=self.project,
            env=self.engine.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)}: exit "
                f"{proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return proc

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        proc = subprocess.run(
            [str(DOCKER), *args],
            env=self.engine.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {proc.stderr[-2000:]}")
        return proc.stdout

    def write_env(self) -> None:
        (self.project / ".env").write_text(
            "".join(f"{k}={v}\n" for k, v in self.env.items()), encoding="utf-8"
        )
        (self.project / ".env").chmod(0o600)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(self.docker("inspect", container))[0]

    def run_containers(self) -> dict[str, dict[str, Any]]:
        """The containers the run launcher started, by run id."""
        ids = self.docker("ps", "-a", "-q", "--filter", "label=dagster/run_id").split()
        return {c["Config"]["Labels"]["dagster/run_id"]: c for c in (self.inspect(i) for i in ids)}

    def ip(self, service: str) -> str:
        networks = self.inspect(self.container(service))["NetworkSettings"]["Networks"]
        return next(iter(networks.values()))["IPAddress"]

    def postgres_url(self) -> str:
        e = self.env
        return (
            f"postgresql://{e['DAGSTER_POSTGRES_USER']}:{e['DAGSTER_POSTGRES_PASSWORD']}@{self.ip('postgres')}:5432/"
            f"{e['DAGSTER_POSTGRES_DB']}"
        )


def _launcher(project: Path) -> dict[str, Any]:
    return yaml.safe_load((project / "dagster.yaml").read_text(encoding="utf-8"))["run_launcher"][
        "config"
    ]


def override(project: Path, *, extra_mounts: list[str]) -> dict[str, Any]:
    """The test's one override: the sandbox's paths in
    code servers and runs, and root for their files."""
    compose = yaml.safe_load((project / "docker-compose.yml").read_text(encoding="utf-8"))
    volumes = _launcher(project)["container_kwargs"]["volumes"]
    context = {
        "docker": {"container_kwargs": {"user": "0:0", "volumes": [*volumes, *extra_mounts]}}
    }
    services: dict[str, Any] = {}
    for name in CODE_SERVICES:
        services[name] = {
            "user": "0:0",
            "volumes": extra_mounts,
            "command": [
                *compose["services"][name]["command"],
                "--container-context",
                json.dumps(context),
            ],
        }
    return {"services": services}


def copy_project(project: Path, site_file: Path) -> None:
    """What a team does first (docs/operations.md):
    the shipped files, then the run launcher's env_vars
    and the .env template made for THEIR site by `lockstep deploy env --update`."""
    project.mkdir(parents=True)
    for name in ("docker-compose.yml", "dagster.yaml", "workspace.yaml", ".env.example"):
        shutil.copyfile(SHIPPED / name, project / name)
    subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "lockstep"),
            "deploy",
            "env",
            "--site",
            str(site_file),
            "--update",
            str(project),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def write_override(project: Path, extra_mounts: list[str]) -> None:
    (project / "override.yml").write_text(
        yaml.safe_dump(override(project, extra_mounts=extra_mounts)), encoding="utf-8"
    )


def stack_env(
    project: Path,
    *,
    site_file: Path,
    site_dir: Path,
    host_dirs: Path,
    engine: Engine,
    ui_port: int,
    secrets_env: Mapping[str, str],
) -> dict[str, str]:
    """The `.env` a team writes, for this engine and
    sandbox: every name the run launcher forwards is set."""
    env = {name: "" for name in _launcher(project)["env_vars"]}
    for d in ("ssh", "kube"):
        (host_dirs / d).mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "DAGSTER_POSTGRES_USER": "lockstep",
            "DAGSTER_POSTGRES_PASSWORD": secrets.token_hex(16),
            "DAGSTER_POSTGRES_DB": "lockstep",
            "DAGSTER_POSTGRES_HOST": "postgres",
            "DAGSTER_POSTGRES_PORT": "5432",
            "LOCKSTEP_SITE": str(site_file),
            "LOCKSTEP_CACHE": "/var/cache/lockstep",
            "LOCKSTEP_SITE_DIR": str(site_dir),
            "LOCKSTEP_SSH_DIR": str(host_dirs / "ssh"),
            "LOCKSTEP_KUBE_DIR": str(host_dirs / "kube"),
            "LOCKSTEP_IMAGE": IMAGE,
            "LOCKSTEP_POSTGRES_IMAGE": POSTGRES_IMAGE,
            "DOCKER_SOCKET": str(engine.socket),
            "DOCKER_GID": str(engine.socket.stat().st_gid),
            "LOCKSTEP_UI_BIND": "127.0.0.1",
            "LOCKSTEP_UI_PORT": str(ui_port),
            **secrets_env,
        }
    )
    # the sandbox's remotes are file:// and git://; the launcher forwards every name
    env["GIT_SSH_COMMAND"] = ""
    return env


def wait_for_webserver(
    stack: Stack, locations: tuple[str, ...] = CODE_SERVICES, timeout_s: float = UP_TIMEOUT_S
) -> None:
    import requests

    query = (
        "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
        "locationOrLoadError { __typename } } } } }"
    )
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = requests.post(
                f"http://127.0.0.1:{stack.ui_port}/graphql", json={"query": query}, timeout=10
            ).json()
            entries = answer["data"]["workspaceOrError"]["locationEntries"]
            last = entries
            loaded = {
                e["name"]
                for e in entries
                if e["locationOrLoadError"]
                and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            }
            if set(locations) <= loaded:
                return
        except (requests.RequestException, KeyError, TypeError, ValueError) as exc:
            last = exc
        time.sleep(2)
    logs = stack.compose("logs", "--tail", "40", check=False).stdout
    raise AssertionError(
        f"the webserver did not serve {locations} in {timeout_s:.0f} s: {last}\n{logs[-6000:]}"
    )


def start_stack(
    *,
    root: Path,
    site_file: Path,
    site_dir: Path,
    extra_mounts: list[str],
    secrets_env: Mapping[str, str],
) -> Stack:
    engine = Engine(root / "engine")
    engine.state.mkdir(parents=True, exist_ok=True)
    engine.start()
    engine.ensure_bases(["postgres"])
    build_lockstep_image(engine, repo=REPO, tag=IMAGE)
    port = free_port()
    project = root / "project"
    copy_project(project, site_file)
    env = stack_env(
        project,
        site_file=site_file,
        site_dir=site_dir,
        host_dirs=root / "host",
        engine=engine,
        ui_port=port,
        secrets_env=secrets_env,
    )
    stack = Stack(engine=engine, project=project, env=env, ui_port=port)
    stack.write_env()
    write_override(project, extra_mounts)
    up = stack.compose("up", "-d", "--no-build", check=False)
    if up.returncode != 0:
        logs = stack.compose("logs", "--tail", "60", check=False).stdout
        stop_stack(stack)
        raise AssertionError(
            f"compose up: exit {up.returncode}\n{up.stderr[-3000:]}\n{logs[-12000:]}"
        )
    wait_for_webserver(stack)
    return stack


def stop_stack(stack: Stack) -> dict[str, list[str]]:
    """The run containers (the launcher's, not compose's),
    then `down -v`; what is left on the engine after
    that is returned (it must be nothing), then the engine is stopped by its PID."""
    try:
        # Run containers first: the launcher leaves them (exited) behind, and they hold the volumes.
        runs = stack.docker(
            "ps", "-a", "-q", "--filter", "label=dagster/run_id", check=False
        ).split()
        if runs:
            stack.docker("rm", "-f", *runs, check=False)
        stack.compose("down", "-v", "--remove-orphans", check=False)
        left = {
            "containers": stack.docker("ps", "-a", "-q", check=False).split(),
            "volumes": stack.docker("volume", "ls", "-q", check=False).split(),
            "networks": [
                n
                for n in stack.docker("network", "ls", "--format", "{{.Name}}", check=False).split()
                if n not in {"host", "none", "bridge"}
            ],
        }
    finally:
        stack.engine.stop()
    return left


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in container["Config"]["Env"])
