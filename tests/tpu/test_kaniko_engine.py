"""The sandbox's kaniko on a real Docker engine: its command line, its pushes, and the runbook's
stale-wheel trap happening for real in the engine's layer cache (runbook §2, "Historical footnote").
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

from resources.registry import ImageRef, registry_for
from resources.site.load import load_site
from resources.uv import UvCli
from sandbox.engines import Engine, engine_dirs
from sandbox.fake_kaniko import SKIP_UNUSED_STAGES_WARNING
from sandbox.kaniko_build import ENGINE_STATE
from sandbox.world import CONSUMER_BRANCH, Sandbox, advance_harbor, up
from tests.conftest import stop_sandbox
from tpu_assets.build import pins_at
from tpu_assets.dockerfile import find_pin, set_pin
from tpu_assets.inspection import read_installed
from tpu_assets.verify import installed_matches_lock

pytestmark = pytest.mark.heavy(60)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "docker/Dockerfile.tpu"
USER, TOKEN = "sandbox", "kaniko-test-push-token-4242"


@dataclass
class Executor:
    sb: Sandbox
    app: Path  # the job's /app: a checkout of the consumer
    docker_config: Path

    @property
    def image(self) -> str:
        return load_site(self.sb.site_file).tpu.image

    def run(self, *flags: str) -> subprocess.CompletedProcess[str]:
        """`/kaniko/executor FLAGS` as the consumer's script runs it in an iris job."""
        env = {
            **os.environ,
            "DOCKER_CONFIG": str(self.docker_config),
            "APP_DIR": str(self.app),
            "PYTHONPATH": str(PROJECT_ROOT),
        }
        return subprocess.run(
            [sys.executable, "-m", "sandbox.fake_kaniko", "--site", str(self.sb.site_file), *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    def build(self, tag: str, *extra: str) -> subprocess.CompletedProcess[str]:
        """The script's own flags (docker/build_tpu_kaniko.sh), pushing `:<tag>`."""
        return self.run(
            "--context",
            "dir:///app",
            "--dockerfile",
            DOCKERFILE,
            "--skip-unused-stages",
            "--compressed-caching=false",
            "--cache=true",
            f"--cache-repo={self.image}/cache-tpu",
            "--destination",
            f"{self.image}:{tag}",
            *extra,
        )

    def commit(self, message: str, *paths: str) -> None:
        repo = git.Repo(self.app)
        repo.index.add(list(paths))
        repo.index.commit(message)


def pushed_digest(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("INFO Pushed ")]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    return lines[0].rsplit("@", 1)[1]


def ran_pinned_install(build_output: str) -> str | None:
    """The commit the Dockerfile's pinned install
    printed while it ran (BuildKit's `#N <secs> <line>`);
    None when the step was not run (cached). The step's
    own header line echoes the command, not this."""
    found = re.search(
        r"^#\d+ \d+\.\d+ baked harbor commit: ([0-9a-f]{40})$", build_output, re.MULTILINE
    )
    return found.group(1) if found else None


def login(path: Path, host: str, user: str = USER, token: str = TOKEN) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{token}".encode()).decode()
    (path / "config.json").write_text(
        json.dumps({"auths": {host: {"auth": auth}}}), encoding="utf-8"
    )
    return path


def make_executor(sb: Sandbox, tmp_path: Path) -> Executor:
    app = tmp_path / "app"
    repo = git.Repo.clone_from(sb.consumer.resolve().as_uri(), app, branch=CONSUMER_BRANCH)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "teammate")
        cw.set_value("user", "email", "teammate@sandbox.invalid")
    host = ImageRef.parse(load_site(sb.site_file).tpu.image).registry
    return Executor(sb=sb, app=app, docker_config=login(tmp_path / "docker-config", host))


@pytest.fixture
def kaniko(sb: Sandbox, tmp_path: Path) -> Executor:
    return make_executor(sb, tmp_path)


# -- the command line: refused before anything is built --------------------------------------------


def test_skip_unused_stages_prints_the_forks_deprecation_warning(kaniko: Executor) -> None:
    proc = kaniko.run("--context", "dir:///app", "--dockerfile", DOCKERFILE, "--skip-unused-stages")
    assert proc.returncode == 1
    assert f"WARN[0000] {SKIP_UNUSED_STAGES_WARNING}" in proc.stderr
    assert "you must provide --destination" in proc.stderr
    quiet = kaniko.run("--context", "dir:///app", "--dockerfile", DOCKERFILE)
    assert "deprecated" not in quiet.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--destination", "ghcr.io/open-thoughts/openthoughts-agent:tpu-abc1234"], "no such host"),
        (["--dockerfile", "../../etc/passwd"], "not a file in the context"),
        (["--dockerfile", "/etc/passwd"], "not a file in the context"),
        (
            ["--cache-repo=ghcr.io/open-thoughts/openthoughts-agent/cache-tpu"],
            "cache flags invalid",
        ),
        (["--cache-repo=@IMAGE@/cache-tpu:latest"], "cache flags invalid"),
        (["--cache=maybe"], "invalid syntax"),
        (["--context", "dir:///etc"], "the task's files are under /app"),
        (["--context", "dir:///app/../etc"], "is not a directory"),
    ],
)
def test_flags_kaniko_refuses(kaniko: Executor, flags: list[str], message: str) -> None:
    flags = [f.replace("@IMAGE@", kaniko.image) for f in flags]
    base = ["--context", "dir:///app", "--dockerfile", DOCKERFILE]
    if not any(f.startswith("--destination") for f in flags):
        base += ["--destination", f"{kaniko.image}:tpu-abc1234"]
    proc = kaniko.run(*base, *flags)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (kaniko.sb.root / ENGINE_STATE).exists()  # refused before an engine was started


def test_a_destination_without_credentials_is_refused(kaniko: Executor, tmp_path: Path) -> None:
    kaniko.docker_config = login(tmp_path / "other-config", "registry.other.invalid")
    proc = kaniko.build("tpu-abc1234")
    assert proc.returncode == 1
    assert "UNAUTHORIZED: no credentials for" in proc.stderr
    assert not (kaniko.sb.root / ENGINE_STATE).exists()


# -- building on the engine ------------------------------------------------------------------------


def test_the_trap_a_harbor_move_without_a_pin_bump_bakes_the_cached_stale_harbor(
    kaniko: Executor,
) -> None:
    """Runbook §2: harbor moved without a version bump (c49064a8); the lock follows it,
    HARBOR_COMMIT does not; the engine reuses the cached install layers (same instruction, same
    inputs), the pushed image holds the old harbor, and installed_harbor_matches_lock
    fails on the pushed layers. Bumping
    HARBOR_COMMIT busts that layer and the same check passes."""
    sb, site = kaniko.sb, load_site(kaniko.sb.site_file)
    registry, repository = registry_for(site), ImageRef.parse(site.tpu.image).repository

    def installed_check(digest: str):
        pin, _ = pins_at(kaniko.app, site)
        installed = read_installed(
            registry,
            repository=repository,
            reference=digest,
            site_packages=site.tpu.site_packages,
            package=site.tpu.harbor_package,
        )
        return installed, installed_matches_lock(installed, pin, site.tpu.harbor_package)

    first = kaniko.build("tpu-first")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    d1 = pushed_digest(first)
    # what the job says = what is served
    assert registry.resolve(repository=repository, reference="tpu-first") == d1
    h1 = pins_at(kaniko.app, site)[0].commit
    installed, finding = installed_check(d1)
    assert finding.passed, finding.description
    assert installed is not None and installed.commit == h1

    h2 = advance_harbor(sb.root, fix=True, version_bump=False)  # the same 0.8.0, a new commit
    UvCli(offline=True).lock_upgrade(project_dir=kaniko.app, package="harbor")
    kaniko.commit("re-lock harbor (HARBOR_COMMIT forgotten)", "uv.lock")
    lock_pin, docker_pin = pins_at(kaniko.app, site)
    assert (lock_pin.commit, docker_pin) == (h2, h1)

    stale = kaniko.build("tpu-stale")
    assert stale.returncode == 0, stale.stdout[-3000:] + stale.stderr[-2000:]
    d2 = pushed_digest(stale)
    # the install steps did not run
    assert "CACHED" in stale.stdout and not ran_pinned_install(stale.stdout)
    layers1 = [x.digest for x in registry.manifest(repository=repository, reference=d1).layers]
    layers2 = [x.digest for x in registry.manifest(repository=repository, reference=d2).layers]
    # every layer reused but `COPY . /app`
    assert layers2[:-1] == layers1[:-1] and layers2 != layers1
    installed, finding = installed_check(d2)
    assert not finding.passed
    assert installed is not None and installed.commit == h1
    assert "stale bake" in finding.description

    docker = kaniko.app / DOCKERFILE
    text = docker.read_text(encoding="utf-8")
    docker.write_text(set_pin(text, DOCKERFILE, "HARBOR_COMMIT", h2), encoding="utf-8")
    kaniko.commit("bump HARBOR_COMMIT", DOCKERFILE)
    assert find_pin(docker.read_text(encoding="utf-8"), DOCKERFILE, "HARBOR_COMMIT").commit == h2
    fresh = kaniko.build("tpu-fresh")
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-2000:]
    assert ran_pinned_install(fresh.stdout) == h2  # the pinned install ran again
    d3 = pushed_digest(fresh)
    installed, finding = installed_check(d3)
    assert finding.passed, finding.description
    assert installed is not None and installed.commit == h2


def test_single_snapshot_pushes_one_layer_and_keeps_the_config(kaniko: Executor) -> None:
    site = load_site(kaniko.sb.site_file)
    registry, repository = registry_for(site), ImageRef.parse(site.tpu.image).repository
    proc = kaniko.build("tpu-single", "--single-snapshot")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    digest = pushed_digest(proc)
    manifest = registry.manifest(repository=repository, reference=digest)
    assert manifest is not None and len(manifest.layers) == 1
    with registry.open_blob(repository=repository, digest=manifest.config.digest) as blob:
        config = json.load(blob)
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env["HARBOR_COMMIT"] == pins_at(kaniko.app, site)[1]
    assert config["config"]["WorkingDir"] == "/opt/openthoughts"
    installed = read_installed(
        registry,
        repository=repository,
        reference=digest,
        site_packages=site.tpu.site_packages,
        package=site.tpu.harbor_package,
    )
    assert installed is not None and installed.commit == pins_at(kaniko.app, site)[1]


def test_the_build_engine_is_one_teardown_stops(tmp_path: Path) -> None:
    sb = up(tmp_path / "sandbox")
    try:
        kaniko = make_executor(sb, tmp_path)
        proc = kaniko.build("tpu-engine", "--cache=false")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        engine = Engine(sb.root / ENGINE_STATE)
        pid = engine.pid()
        assert pid is not None
        assert engine.state in engine_dirs(sb.root)
    finally:
        stop_sandbox(sb)
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"dockerd" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )


@pytest.fixture
def http_sandbox(registry_server, tmp_path: Path) -> Iterator[Sandbox]:
    sb = up(tmp_path / "sandbox", registry=registry_server.host)
    yield sb
    stop_sandbox(sb)


def test_http_registry_gets_a_docker_push_with_the_config_json_login(
    http_sandbox: Sandbox, tmp_path: Path
) -> None:
    kaniko = make_executor(http_sandbox, tmp_path)
    site = load_site(http_sandbox.site_file)
    registry, repository = registry_for(site), ImageRef.parse(site.tpu.image).repository
    proc = kaniko.build("tpu-http")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    digest = pushed_digest(proc)
    assert registry.resolve(repository=repository, reference="tpu-http") == digest
    assert TOKEN not in proc.stdout + proc.stderr
    # only destinations
    assert registry.resolve(repository=f"{repository}/cache-tpu", reference="latest") is None
    manifest = registry.manifest(repository=repository, reference=digest)
    assert manifest is not None and len(manifest.layers) >= 4
