"""Preflight's areas one at a time, each against the failure a real site brings on day one.

One sandbox for the module: a case that needs other repo content pushes it to a branch of its own
and points a variant of the site file (written beside the sandbox's, so its relative paths still
hold) at it; nothing a case does is seen by another.
"""

from __future__ import annotations

import json
import re
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import git
import pytest
import tomli_w

from lockstep.preflight.build_repo import check_build_repo, gate_markers
from lockstep.preflight.consumer import check_consumer
from lockstep.preflight.findings import Finding, Section, build_report, ok
from lockstep.preflight.iris import check_iris
from lockstep.preflight.registry import check_registry
from lockstep.preflight.run import run_concurrently
from resources.git import git_for
from resources.site.jovian import DEFAULT_BOOT_GATES, BootGate
from resources.site.load import load_site
from resources.site.schema import SiteConfig
from resources.uv import UvCli
from sandbox.fake_iris import install_fake_iris
from sandbox.teardown import stop_sandbox
from sandbox.world import AUTHOR, HARBOR_BRANCH, Sandbox, up
from tests.support.registry_proxy import RegistryProxy
from tests.support.registry_server import RegistryServer

ROOT = Path(__file__).resolve().parents[2]
# marin-iris 0.2.20 (2026-06-18): no --no-sync yet
REAL_IRIS = ROOT / ".tools" / "iris" / "bin" / "iris"
BUILD_REPO = "docker-images.git"
RECIPE = "recipes/glm53-2x/recipe.toml"
REPOSITORY = "open-thoughts/openthoughts-agent"
TOKEN_ENV = "LOCKSTEP_TEST_PREFLIGHT_TOKEN"
SECRET = "ghp_PreflightNeverShowThis0123456789"


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    world = up(tmp_path_factory.mktemp("preflight") / "sandbox")
    yield world
    # a node check's `docker version` starts that node's engine: stopped by PID
    stop_sandbox(world.root)


def variant(sb: Sandbox, name: str, edit: Callable[[dict[str, Any]], object]) -> SiteConfig:
    """The sandbox's site file with `edit` applied,
    written beside it (relative paths resolve the same)."""
    data = tomllib.loads(sb.site_file.read_text())
    edit(data)
    path = sb.root / f"site-{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return load_site(path)


def push_branch(
    bare: Path, branch: str, edit: Callable[[Path], None], tmp_path: Path, base: str = "main"
) -> str:
    """A new branch of `bare` with `edit` committed on top of `base`."""
    repo = git.Repo.clone_from(bare.as_uri(), tmp_path / f"clone-{branch}", branch=base)
    edit(Path(repo.working_dir))
    repo.git.add("-A")
    repo.index.commit(f"preflight case {branch}", author=AUTHOR, committer=AUTHOR)
    repo.git.push("origin", f"HEAD:refs/heads/{branch}")
    return repo.head.commit.hexsha


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def only(sections: list[Section], status: str = "fail") -> list[Finding]:
    return [f for s in sections for f in s.findings if f.status == status]


def build_repo_sections(site: SiteConfig) -> list[Section]:
    return check_build_repo(site, git_for(site, timeout_s=60))


# -- the consumer repo -----------------------------------------------------------------------------

CONSUMER_BRANCH = "penfever/working"


def consumer_sections(
    sb: Sandbox, branch: str, edit: Callable[[Path], None], tmp_path: Path
) -> list[Section]:
    push_branch(sb.consumer, branch, edit, tmp_path, base=CONSUMER_BRANCH)
    site = variant(sb, branch, lambda d: d["tpu"].update(consumer_branch=branch))
    return check_consumer(site, git_for(site, timeout_s=60))


def test_an_unpinned_executor_of_the_archived_kaniko_is_a_warning_not_a_failure(
    sb: Sandbox, tmp_path: Path
) -> None:
    def latest(wt: Path) -> None:
        script = wt / "docker/build_tpu_kaniko.sh"
        script.write_text(
            script.read_text().replace(
                "executor:v1.23.2 - | tar -xf - -C /", "executor:latest - | tar -xf - -C / || true"
            )
        )

    sections = consumer_sections(sb, "latest-executor", latest, tmp_path)
    assert not only(sections)
    warned = {f.check: f for f in only(sections, "warn")}
    assert sorted(warned) == [
        "consumer.build_script.executor_unpinned",
        "consumer.build_script.export_hidden",
    ]
    unpinned = warned["consumer.build_script.executor_unpinned"]
    assert (
        unpinned.where == "docker/build_tpu_kaniko.sh:36"
        and "archived on 2025-06-03" in unpinned.what
    )
    assert unpinned.fix.startswith("Pin a digest of a maintained fork")
    assert build_report(tmp_path / "site.toml", sections).exit_code == 0  # warnings allowed


def remote_dockerfile(sb: Sandbox) -> str:
    return git.Repo(sb.consumer).git.show(f"{CONSUMER_BRANCH}:docker/Dockerfile.tpu")


def test_a_dockerfile_pin_that_is_not_the_locks_fails_naming_both(
    sb: Sandbox, tmp_path: Path
) -> None:
    other = "ab" * 20

    def drift(wt: Path) -> None:
        dockerfile = wt / "docker/Dockerfile.tpu"
        dockerfile.write_text(
            re.sub(
                r"^ENV HARBOR_COMMIT=\S+",
                f"ENV HARBOR_COMMIT={other}",
                dockerfile.read_text(),
                flags=re.MULTILINE,
            )
        )

    [pin] = only(consumer_sections(sb, "pin-drift", drift, tmp_path))
    locked = git.Repo(sb.harbor).commit(HARBOR_BRANCH).hexsha  # what the consumer's uv.lock pins
    line = next(
        n
        for n, text in enumerate(remote_dockerfile(sb).splitlines(), 1)
        if text.startswith("ENV HARBOR_COMMIT=")
    )
    assert (pin.check, pin.where) == ("consumer.dockerfile_pin", f"docker/Dockerfile.tpu:{line}")
    assert pin.what.startswith(f"HARBOR_COMMIT={other[:12]} but uv.lock pins harbor {locked[:12]}")
    assert f"`ENV HARBOR_COMMIT={locked}`" in pin.fix


def test_a_consumer_that_pins_harbor_to_a_commit_fails_at_its_pyproject_line_with_the_fix(
    sb: Sandbox, tmp_path: Path
) -> None:
    locked = git.Repo(sb.harbor).commit(HARBOR_BRANCH).hexsha

    # the real consumer's shape, its @branch turned into a commit, re-locked
    def pinned(wt: Path) -> None:
        pyproject = wt / "pyproject.toml"
        pyproject.write_text(pyproject.read_text().replace(f'@{HARBOR_BRANCH}"', f'@{locked}"'))
        UvCli(offline=True).lock(project_dir=wt)

    [lock] = only(consumer_sections(sb, "pinned-to-a-commit", pinned, tmp_path))
    assert lock.check == "consumer.lock" and re.fullmatch(r"pyproject\.toml:\d+", lock.where), lock
    assert f"is pinned to commit {locked[:12]}, which never moves" in lock.what
    assert f'write "harbor[daytona] @ git+{sb.url(sb.harbor)}@{HARBOR_BRANCH}"' in lock.what


# -- iris ------------------------------------------------------------------------------------------


def test_an_iris_binary_that_is_not_there_names_the_path_and_how_to_install(sb: Sandbox) -> None:
    site = variant(sb, "no-iris", lambda d: d["iris"].update(binary="bin/no-such-iris"))
    [binary] = only(check_iris(site, timeout_s=30))
    assert binary.check == "iris.binary"
    assert binary.what == f"no executable iris CLI at {sb.root / 'bin/no-such-iris'}"
    assert binary.where == f"{site.path}:{line_of(site.path, 'no-such-iris')}"
    assert "`pip install marin-iris`" in binary.fix


@pytest.fixture
def not_a_controller() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that answers every
    request 501: the real iris CLI's RPC fails at once
    there (at a closed port it would retry for minutes)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_iris_without_an_option_lockstep_uses_fails_its_contract_naming_it(
    sb: Sandbox, not_a_controller: str
) -> None:
    if not REAL_IRIS.exists():
        pytest.fail(
            f"{REAL_IRIS} is missing: run ./dev setup (it installs the real marin-iris CLI there)"
        )

    def real_iris(d: dict[str, Any]) -> None:
        del d["iris"]["cluster"]  # the real CLI refuses even --help for a cluster it does not know
        d["iris"].update(binary=str(REAL_IRIS), controller_url=not_a_controller)

    site = variant(sb, "iris-2026-06", real_iris)
    found = {f.check: f for f in only(check_iris(site, timeout_s=60))}
    # its own help says so: the real 2026-06-18 wheel predates --no-sync
    contract = found["iris.contract"]
    assert (
        "has no --no-sync for `job run`" in contract.what
        and "--no-sync arrived in iris on 2026-06-24" in contract.what
    )
    assert contract.where == f"{site.path}:{line_of(site.path, 'binary =')}"
    assert contract.fix.startswith("Upgrade marin-iris")
    # the controller was asked too, and this one answers nothing iris knows
    assert "iris.controller" in found


def test_a_controller_that_refuses_an_old_client_says_upgrade(sb: Sandbox, tmp_path: Path) -> None:
    old = install_fake_iris(tmp_path / "iris-old", too_old=True)
    site = variant(sb, "too-old", lambda d: d["iris"].update(binary=str(old)))
    [refused] = only(check_iris(site, timeout_s=30))
    assert refused.check == "iris.client_age" and "marin-iris client is too old" in refused.what
    assert "Upgrade marin-iris" in refused.fix and "14 days" in refused.fix


def test_an_unset_push_token_variable_is_named(
    sb: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCKSTEP_SANDBOX_PUSH_TOKEN")
    [token] = only(check_iris(load_site(sb.site_file), timeout_s=30))
    assert token.check == "iris.push_token" and "$LOCKSTEP_SANDBOX_PUSH_TOKEN" in token.what
    assert token.fix.startswith("Export LOCKSTEP_SANDBOX_PUSH_TOKEN")


# -- registry --------------------------------------------------------------------------------------


def test_an_unset_registry_token_variable_is_named_before_anything_is_asked(
    sb: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    # sandbox.local does not exist: were the registry
    # asked, the finding would say it cannot be reached.
    site = variant(
        sb, "http-no-token", lambda d: d["registry"].update(kind="http", token_env=TOKEN_ENV)
    )
    [[token]] = [s.findings for s in check_registry(site, timeout_s=10)]
    assert (token.check, token.status) == ("registry.token", "fail")
    assert f"names ${TOKEN_ENV}, which is not set" in token.what and token.fix.startswith(
        f"Export {TOKEN_ENV} "
    )
    assert token.where == f"{site.path}:{line_of(site.path, 'token_env')}"


def test_a_token_that_can_only_pull_is_refused_push(
    sb: Sandbox, registry_server: RegistryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    with RegistryProxy(
        upstream=registry_server.host, auth=True, pull_only={REPOSITORY}
    ) as ghcr_like:
        site = variant(
            sb,
            "pull-only",
            lambda d: (
                d["registry"].update(kind="http", username="bot", token_env=TOKEN_ENV),
                d["tpu"].update(image=f"{ghcr_like.host}/{REPOSITORY}"),
            ),
        )
        [[push]] = [s.findings for s in check_registry(site, timeout_s=10)]
        cancelled = ghcr_like.requests("DELETE")
    assert (push.check, push.status) == ("registry.push", "fail")
    assert "HTTP 403" in push.what and f"cannot push to {REPOSITORY}" in push.what
    assert push.where.startswith(f"{ghcr_like.host}/{REPOSITORY} ({site.path}:")
    assert f"${TOKEN_ENV}" in push.fix and "write:packages" in push.fix
    # no session was opened, so none to cancel
    assert SECRET not in push.model_dump_json() and not cancelled


# -- the build repo --------------------------------------------------------------------------------


def test_build_profile_after_extra_mounts_is_reported_at_its_line(
    sb: Sandbox, tmp_path: Path
) -> None:
    def trap(wt: Path) -> None:
        recipe = wt / RECIPE
        lines = [
            line for line in recipe.read_text().splitlines() if not line.startswith("build_profile")
        ]
        at = lines.index('container = "/root/.cache/flashinfer"') + 1
        recipe.write_text("\n".join([*lines[:at], 'build_profile = "r27"', *lines[at:]]) + "\n")

    push_branch(sb.repos / BUILD_REPO, "toml-trap", trap, tmp_path)
    site = variant(sb, "toml-trap", lambda d: d["jovian"].update(build_branch="toml-trap"))
    [recipe] = only(build_repo_sections(site))
    shown = git.Repo(sb.repos / BUILD_REPO).git.show(f"toml-trap:{RECIPE}").splitlines()
    assert recipe.check == "build_repo.recipes"
    assert (
        recipe.where
        == f"{RECIPE}:{shown.index('build_profile = ' + chr(34) + 'r27' + chr(34)) + 1}"
    )
    assert "parses into extra_mounts[0], not the top level" in recipe.what
    assert recipe.fix.startswith("Move `build_profile = ...` above the recipe's first [section]")


def test_a_profile_key_versions_env_lacks_is_named_with_the_close_one(
    sb: Sandbox, tmp_path: Path
) -> None:
    def typo(wt: Path) -> None:
        (wt / "jovian-judgement/profiles/r28.env").write_text("# r28\nVLLM_COMIT=0123abcd\n")

    push_branch(sb.repos / BUILD_REPO, "profile-typo", typo, tmp_path)
    site = variant(sb, "profile-typo", lambda d: d["jovian"].update(build_branch="profile-typo"))
    [profile] = only(build_repo_sections(site))
    assert (profile.check, profile.where) == (
        "build_repo.profiles",
        "jovian-judgement/profiles/r28.env:2",
    )
    assert (
        "VLLM_COMIT is not a key of jovian-judgement/versions.env (did you mean VLLM_COMMIT?)"
        in profile.what
    )


def test_gate_markers_are_the_data_files_a_gate_reads_not_package_sources() -> None:
    # The defaults read what a real build leaves: compiled extensions and the package's own sources.
    markers = {gate.name: gate_markers(gate) for gate in DEFAULT_BOOT_GATES}
    assert markers["nvfp4_ds_mla_present"] == []  # vllm/config/cache.py is the package's own source
    assert markers == {name: [] for name in markers}
    record = BootGate(
        name="r",
        code="import json, pathlib, vllm\njson.loads((pathlib.Path(vllm.__file__).parent / "
        "'_sm12x_patches.json').read_text())\n",
    )
    assert gate_markers(record) == ["_sm12x_patches.json"]


def test_the_default_gates_pass_a_build_dir_that_writes_no_markers(
    sb: Sandbox, tmp_path: Path
) -> None:
    """The real build dir's shape: the patch set runs but
    records nothing; no RUN lists the compiled archs."""

    def real_build(wt: Path) -> None:
        d = wt / "jovian-judgement"
        (d / "patch_cuda_sm12x.py").write_text(
            "# patch_cuda_sm12x.py: the GB10 patch set (applies; records nothing)\n"
        )
        assert "cuobjdump" not in (d / "Dockerfile").read_text()  # no RUN lists the compiled archs

    def real_site(d: dict[str, Any]) -> None:
        d["jovian"].update(build_branch="real-build")
        # a real site's file names no gates: lockstep's defaults apply
        del d["jovian"]["boot_gates"]

    push_branch(sb.repos / BUILD_REPO, "real-build", real_build, tmp_path)
    site = variant(sb, "real-build", real_site)
    assert only(build_repo_sections(site)) == []
    [ok] = [f for f in only(build_repo_sections(site), "ok") if f.check == "build_repo.boot_gates"]
    assert "jovian-judgement" in ok.what


def test_a_site_gate_reading_a_marker_nothing_writes_is_named_at_its_site_line(sb: Sandbox) -> None:
    code = (
        "import json, pathlib, vllm\njson.loads((pathlib.Path(vllm.__file__).parent / "
        "'_flashkda_build.json').read_text())\n"
    )
    site = variant(
        sb,
        "own-gate",
        lambda d: d["jovian"].update(boot_gates=[{"name": "flashkda_record", "code": code}]),
    )
    [gate] = only(build_repo_sections(site))
    assert gate.what.startswith(
        "boot gate 'flashkda_record' reads the marker file _flashkda_build.json"
    )
    assert gate.where == f"{site.path}:{line_of(site.path, 'code = ')}"


# -- the report and the runner ---------------------------------------------------------------------


def test_a_check_that_breaks_or_hangs_becomes_a_finding_not_a_traceback_or_a_wait() -> None:
    def broken() -> list[Section]:
        raise ZeroDivisionError("division by zero")

    def hung() -> list[Section]:
        time.sleep(30)
        return []

    fine = [
        Section(
            area="consumer",
            title="consumer",
            findings=[ok("consumer", "consumer.lock", "fine", "uv.lock")],
        )
    ]
    started = time.monotonic()
    sections = run_concurrently(
        [("registry", broken), ("node spark-a", hung), ("consumer", lambda: fine)], deadline_s=0.5
    )
    assert time.monotonic() - started < 5
    by_check = {f.check: f for s in sections for f in s.findings}
    assert (
        by_check["registry.preflight"].what
        == "the registry check could not run: ZeroDivisionError: division by zero"
    )
    assert by_check["nodes.deadline"].what == "the node spark-a check did not finish within 0.5s"
    assert by_check["consumer.lock"].status == "ok"


def test_no_secret_value_survives_into_the_report(tmp_path: Path) -> None:
    leaky = Finding(
        area="registry",
        check="registry.push",
        status="fail",
        what=f"refused token {SECRET}",
        where=f"https://bot:{SECRET}@ghcr.io",
        fix=f"not {SECRET}",
    )
    report = build_report(
        tmp_path / "site.toml",
        [Section(area="registry", title=f"t {SECRET}", findings=[leaky])],
        secrets=[SECRET],
    )
    shown = report.model_dump_json()
    assert SECRET not in shown and report.exit_code == 1
    assert json.loads(shown)["sections"][0]["findings"][0]["what"] == "refused token ***"
    assert re.search(r"https://\*\*\*@ghcr.io", shown)
