"""`lockstep preflight` end to end on the sandbox: green on a fresh one (both registry kinds),
changing nothing; and the day-one acceptance case, a site with the three mistakes a real site is
likely to bring (the real build script's xtrace order, a lane with no baseline, a node whose host
key is not the one on record), reported as exactly
those three failures, each with where and the fix.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import git
import pytest
import requests
import tomli_w
from click.testing import CliRunner

from lockstep.cli import main
from lockstep.preflight.findings import EXIT_CANNOT_RUN
from sandbox.teardown import stop_sandbox
from sandbox.world import SANDBOX_TOKEN_VALUE, Sandbox, up
from tests.conftest import remote_head
from tests.support.registry_server import RegistryServer
from tests.support.sshd_server import PASSPHRASE, PASSPHRASE_ENV, known_hosts_line, running_sshd

SCRIPT = "docker/build_tpu_kaniko.sh"
BUILD_REPO = "docker-images.git"
REPOSITORY = "open-thoughts/openthoughts-agent"
# What a fresh sandbox must show: every area ran (a skipped area would leave its checks out).
EVERY_AREA = {
    "consumer.harbor_branch",
    "consumer.lock",
    "consumer.dockerfile_pin",
    "consumer.build_script",
    "build_repo.versions_env",
    "build_repo.profiles",
    "build_repo.fetch_deps",
    "build_repo.recipes",
    "build_repo.baseline",
    "build_repo.boot_gates",
    "iris.binary",
    "iris.contract",
    "iris.controller",
    "iris.push_token",
    "nodes.docker",
    "nodes.bench_tools",
    "registry.push",
}


@pytest.fixture(autouse=True)
def stopped_sandbox(tmp_path: Path) -> Iterator[None]:
    """Preflight's `docker version` on each node starts
    that node's engine: the test's sandbox (always
    `tmp_path / "sandbox"` here) is stopped by PID after it."""
    yield
    stop_sandbox(tmp_path / "sandbox")


def preflight(site: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["preflight", "--site", str(site), *args], catch_exceptions=False
    )
    return result.exit_code, result.output


def findings(site: Path) -> tuple[int, list[dict[str, str]]]:
    code, out = preflight(site, "--json")
    return code, json.loads(out)["findings"]


def heads(sb: Sandbox) -> tuple[str, str]:
    return remote_head(sb.consumer), remote_head(sb.repos / BUILD_REPO, "main")


@pytest.mark.parametrize("kind", ["layout", "http"])
def test_a_fresh_sandbox_is_all_green_and_preflight_changes_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: RegistryServer | None = (
        request.getfixturevalue("registry_server") if kind == "http" else None
    )
    sb = up(tmp_path / "sandbox", registry=server.host if server else None)
    request.addfinalizer(lambda: stop_sandbox(sb.root))  # the nodes' engines the pre-flight started
    before = heads(sb)

    code, out = preflight(sb.site_file)
    assert code == 0, out
    assert out.rstrip().endswith("0 failed, 0 warnings, 20 ok: ready (no check fails) (exit 0)")
    # the push token's variable is named, its value never shown
    assert SANDBOX_TOKEN_VALUE not in out
    code, found = findings(sb.site_file)
    assert (
        code == 0
        and {f["status"] for f in found} == {"ok"}
        and EVERY_AREA <= {f["check"] for f in found}
    )
    push = next(f for f in found if f["check"] == "registry.push")
    assert (
        "blob upload, opened and then cancelled" if kind == "http" else "can be created"
    ) in push["what"]

    # Read-only: no commit anywhere, no iris job, no repository in the registry.
    assert heads(sb) == before
    assert not any((sb.iris_home / "jobs").iterdir())
    if server is None:
        assert not (sb.root / "registry" / REPOSITORY).exists()
    else:
        assert (
            requests.get(f"http://{server.host}/v2/{REPOSITORY}/tags/list", timeout=10).status_code
            == 404
        )


def real_xtrace_order(wt: Path) -> None:
    """The consumer's script as OpenThoughts-Agent's
    own is (7951edcd): `set -euxo pipefail` before the
    `${VAR:?}` guards, and the auth line traced too (no `set +x` around it)."""
    path = wt / SCRIPT
    text = path.read_text()
    assert "set -euo pipefail\n" in text and "{ set +x; } 2>/dev/null\n" in text
    path.write_text(
        text.replace("set -euo pipefail\n", "set -euxo pipefail\n", 1).replace(
            "{ set +x; } 2>/dev/null\n", "", 1
        )
    )


def test_a_real_sites_three_day_one_mistakes_are_exactly_what_fails(
    tmp_path: Path,
    push_consumer: Callable[..., str],
    push_repo: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    sb = up(tmp_path / "sandbox")
    request.addfinalizer(lambda: stop_sandbox(sb.root))  # the nodes' engines the pre-flight started
    push_consumer(sb, real_xtrace_order, "build script as upstream has it")
    push_repo(
        sb.repos / BUILD_REPO,
        "main",
        lambda wt: (wt / "recipes/glm53-2x/baseline.json").unlink(),
        "lose the lane's baseline",
    )
    script = git.Repo(sb.consumer).git.show(f"penfever/working:{SCRIPT}").splitlines()
    guard = script.index(': "${DOCKER_TOKEN:?}"') + 1
    auth = next(n for n, line in enumerate(script, 1) if line.startswith("AUTH=$(printf"))
    xtrace = script.index("set -euxo pipefail") + 1

    monkeypatch.setenv(PASSPHRASE_ENV, PASSPHRASE)
    node_bin = sb.nodes / "spark-b"
    with running_sshd(
        tmp_path / "sshd",
        extra_config=f"SetEnv PATH={node_bin / 'bin'}:/usr/local/bin:/usr/bin:/bin "
        f"HOME={node_bin / 'home'}\n",
    ) as sshd:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "imposter")],
            check=True,
        )
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(known_hosts_line("127.0.0.1", sshd.port, tmp_path / "imposter.pub"))
        data = tomllib.loads(sb.site_file.read_text())
        data["spark"].update(
            known_hosts=str(known_hosts),
            key_path=str(sshd.client_key),
            passphrase_env=PASSPHRASE_ENV,
        )
        data["spark"]["nodes"] = [
            sshd.node("spark-b", roles=["lane"]) if n["name"] == "spark-b" else n
            for n in data["spark"]["nodes"]
        ]
        sb.site_file.write_text(tomli_w.dumps(data))

        code, out = preflight(sb.site_file)
        json_code, found = findings(sb.site_file)

    assert code == 1 and json_code == 1, out
    failed = {f["check"]: f for f in found if f["status"] == "fail"}
    assert sorted(failed) == [
        "build_repo.baseline",
        "consumer.build_script.xtrace",
        "nodes.host_key",
    ], out
    assert not [f for f in found if f["status"] == "warn"]

    traced = failed["consumer.build_script.xtrace"]
    assert traced["where"] == f"{SCRIPT}:{guard}" and guard == 16
    assert traced["what"].startswith(
        f"`set -x` (line {xtrace}) is on when $DOCKER_TOKEN is expanded"
    )
    assert f"(also at line {auth})" in traced["what"]
    assert traced["fix"].startswith("Put `set +x` before this line")

    baseline = failed["build_repo.baseline"]
    assert baseline["where"] == "recipes/glm53-2x/baseline.json"
    assert "lockstep lane rebaseline recipes/glm53-2x/reports/" in baseline["fix"]

    host = failed["nodes.host_key"]
    assert (
        host["where"]
        == f"node spark-b ({sshd.user}@127.0.0.1:{sshd.port}); known_hosts {known_hosts}"
    )
    assert "HOST KEY MISMATCH" in host["what"] and str(known_hosts) in host["what"]
    assert f"ssh-keyscan -p {sshd.port} -t ed25519 127.0.0.1 >> {known_hosts}" in host["fix"]
    assert "out of band" in host["fix"]

    # The text report says the same, grouped by area, each failure with its where and fix.
    for f in failed.values():
        assert f"where: {f['where']}" in out and f"fix:   {f['fix']}" in out
    assert out.rstrip().endswith("(exit 1)") and PASSPHRASE not in out
    # untouched
    assert known_hosts.read_text() == known_hosts_line(
        "127.0.0.1", sshd.port, tmp_path / "imposter.pub"
    )


def test_no_site_file_means_preflight_could_not_run(tmp_path: Path) -> None:
    code, out = preflight(tmp_path / "missing.toml")
    assert code == EXIT_CANNOT_RUN and "no site file here" in out
    code, out = preflight(tmp_path / "missing.toml", "--json")
    assert code == EXIT_CANNOT_RUN and json.loads(out)["exit_code"] == EXIT_CANNOT_RUN
