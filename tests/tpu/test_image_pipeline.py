"""The TPU image pipeline on the sandbox, end to end: re-lock -> build -> checks -> smoke ->
verified -> promote -> rollback. Real git, real uv, real OCI images (layout directory, and a real
docker-registry server), the fake iris speaking the
real CLI contract. Each test reads the runbook's scars.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import git
import pytest
from click.testing import CliRunner

from lockstep.cli import main as lockstep_cli
from resources.iris.cli import iris_for
from resources.registry import HttpRegistry
from resources.site.load import SITE_ENV, load_site
from resources.uv import UvCli
from sandbox.world import (
    SANDBOX_TOKEN_ENV,
    SANDBOX_TOKEN_VALUE,
    advance_harbor,
    up,
    use_iris_contract,
)
from tests.conftest import remote_head, sandbox_resources, stop_sandbox
from tests.support.registry_server import RegistryServer
from tests.support.report import queue_fault
from tests.support.runs import (
    Pipeline,
    checks,
    failure_message,
    failure_metadata,
    materialized,
    metadata,
)
from tpu_assets.changelog import baked_harbor
from tpu_assets.history import VERIFIED_IMAGE
from tpu_assets.keys import IMAGE

pytestmark = pytest.mark.heavy(150)  # seconds, about: the order parallel workers take modules in


@pytest.fixture(params=["layout", "docker-registry"])
def any_registry_pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pipeline]:
    """The sandbox with its images in an image layout,
    or on a real docker-registry server over HTTP."""
    host = (
        request.getfixturevalue("registry_server").host
        if request.param == "docker-registry"
        else None
    )
    sb = up(tmp_path / "sandbox", registry=host)
    resources = sandbox_resources(sb, tmp_path / "cache")
    with dg.instance_for_test() as instance:
        yield Pipeline(sb, resources, instance)
    stop_sandbox(sb)


def test_relock_build_verify_promote_fix_and_lineage_aware_rollback(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = pipeline
    guard_fix = advance_harbor(p.sb.root, fix=True)
    b1 = p.relock()
    first = p.build(b1)
    assert first.success, failure_message(first)
    assert materialized(first) == {"tpu/image", "tpu/smoke", "tpu/verified_image"}
    assert all(e.passed for e in checks(first).values()) and len(checks(first)) == 3
    built = metadata(first, IMAGE)
    assert built["digest"] == p.pinned(b1) and built["image"].endswith(f":tpu-{p.gitsha(b1)}")  # type: ignore[union-attr]
    assert built["harbor_commit_locked"] == guard_fix and int(built["layers"]) >= 3  # type: ignore[arg-type]
    assert "DOCKER_TOKEN" not in str(built["job_command"]) or "***" in str(built["job_command"])
    provenance = metadata(first, VERIFIED_IMAGE)["provenance"]
    assert provenance["subject"][0]["digest"]["sha256"] == str(built["digest"]).removeprefix(
        "sha256:"
    )  # type: ignore[index]
    assert p.floating() is None  # a build never touches the floating tag

    first_move = p.tag("promote")
    assert first_move.success and p.floating() == p.pinned(b1)
    assert changelog(first_move) == [] and "nothing before" in str(
        metadata(first_move)["changelog_summary"]
    )
    # A digest with no verified record (a hand move onto
    # :tpu) is compared by the harbor its layers installed.
    assert baked_harbor(p.site, p.registry, digest=p.pinned(b1), verified=[]) == guard_fix

    export_fix = advance_harbor(p.sb.root)  # the fix a later rollback must keep
    b2 = p.relock()
    assert p.build(b2).success
    promoted = p.tag("promote", must_contain=export_fix[:8])
    assert p.floating() == p.pinned(b2)
    assert metadata(promoted)["from_digest"] == p.pinned(b1)  # the pre-promote digest is recorded
    # the harbor commits it adds, the fix marked
    assert changelog(promoted) == [("added", export_fix, True)]

    later = advance_harbor(p.sb.root)
    b3 = p.relock()
    assert p.build(b3).success and p.tag("promote").success
    assert p.floating() == p.pinned(b3)

    # The plan, from the instance's history, before
    # anything moves: b2 is the target, b1 predates the fix.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("LOCKSTEP_SITE", str(p.sb.site_file))
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cli-cache"))
    cli = CliRunner().invoke(lockstep_cli, ["rollback", "plan", "--must-contain", export_fix[:8]])
    assert cli.exit_code == 0, cli.output
    lines = {
        line.split()[1]: line for line in cli.output.splitlines() if line.startswith("  build")
    }
    assert "-> TARGET" in lines[b2[:8]]
    assert "predates" in lines[b1[:8]] and "no-op" in lines[b1[:8]]
    assert "points at now" in lines[b3[:8]]
    cli = CliRunner().invoke(
        lockstep_cli, ["changelog", b1[:8], b3[:8], "--must-contain", export_fix[:8]]
    )
    assert cli.exit_code == 0, cli.output
    assert (
        cli.output.splitlines()[0] == f"build {b1[:8]} -> build {b3[:8]}"
        and "2 commits added" in cli.output
    )
    rows = [line.split() for line in cli.output.splitlines()[3:]]
    assert [r[1:3] for r in rows] == [["added", later[:12]], ["added", export_fix[:12]]] and rows[
        1
    ][-1] == "must_contain"
    as_json = CliRunner().invoke(
        lockstep_cli, ["changelog", b1[:8], b3[:8], "--must-contain", export_fix[:8], "--json"]
    )
    found = json.loads(as_json.output)
    assert (
        as_json.exit_code == 0
        and found["from"]["label"] == f"build {b1[:8]}"
        and found["fix"].startswith(export_fix[:8])
    )
    assert [c["sha"][:12] for c in found["range"]["added"]] == [
        later[:12],
        export_fix[:12],
    ] and not found["range"]["removed"]
    # harbor commits, backwards
    cli = CliRunner().invoke(lockstep_cli, ["changelog", later[:10], guard_fix[:10]])
    assert cli.exit_code == 0 and cli.output.splitlines()[:2] == [
        f"harbor {later[:8]} -> harbor {guard_fix[:8]}",
        f"harbor {later[:8]} -> {guard_fix[:8]}: 2 commits removed",
    ]
    cli = CliRunner().invoke(lockstep_cli, ["changelog", "deadbeef", b3[:8]])
    assert cli.exit_code != 0 and "'deadbeef' is neither a build" in cli.output

    # The tempting rollback to the pre-fix build is refused and moves nothing.
    tempting = p.tag("rollback", build=b1[:8], must_contain=export_fix[:8])
    assert not tempting.success and "predates" in failure_message(tempting)
    assert p.floating() == p.pinned(b3)

    rolled = p.tag("rollback", must_contain=export_fix[:8])
    assert rolled.success, failure_message(rolled)
    assert p.floating() == p.pinned(b2)
    meta = metadata(rolled)
    assert (
        meta["action"] == "rollback"
        and meta["hold"] is True
        and meta["from_digest"] == p.pinned(b3)
    )
    # what the rollback takes away
    assert changelog(rolled) == [("removed", later, False)] and meta["commits_removed"] == 1

    # While the hold is set nothing promotes; releasing it lets promotion resume.
    held = p.tag("promote", build=b3[:8])
    assert not held.success and "on hold" in failure_message(held)
    assert p.floating() == p.pinned(b2)
    assert p.tag("release_hold").success
    assert p.tag("promote", build=b3[:8]).success and p.floating() == p.pinned(b3)
    assert p.tag("rollback", build=b3[:8]).success is False  # the current digest is never a target


def changelog(result: dg.ExecuteInProcessResult) -> list[tuple[str, str, bool]]:
    """The move's changelog rows: (added|removed, harbor sha, is the must_contain commit)."""
    table = metadata(result)["changelog"]
    return [(r.data["change"], r.data["sha"], r.data["fix"]) for r in table.records]  # type: ignore[attr-defined]


def test_unfixed_guard_is_built_but_never_verified_or_promoted(
    any_registry_pipeline: Pipeline,
) -> None:
    """The runbook's bug: a raise after `existing_config
    != self.config`. The image exists; it is not good."""
    pipeline = any_registry_pipeline
    head = remote_head(pipeline.sb.consumer)
    result = pipeline.build(head)
    assert not result.success
    probe = checks(result)["file_probes"]
    assert not probe.passed and "harbor/job.py:274" in (probe.description or "")
    assert checks(result)["installed_harbor_matches_lock"].passed  # the right harbor, just unfixed
    assert materialized(result) == {"tpu/image"}  # blocking: no smoke, no verified_image
    refused = pipeline.tag("promote")
    assert not refused.success and "no tpu/verified_image" in failure_message(refused)
    assert pipeline.floating() is None


def test_image_that_bakes_a_stale_harbor_fails_the_installed_check(
    any_registry_pipeline: Pipeline, push_consumer
) -> None:
    """The cached-wheel scar: the lock moved but the
    Dockerfile pin did not, so the bake lags the lock."""
    pipeline = any_registry_pipeline
    advance_harbor(pipeline.sb.root, fix=True)

    def relock_lock_only(wt: Path) -> None:
        UvCli(offline=True).lock_upgrade(project_dir=wt, package="harbor")

    stale = push_consumer(pipeline.sb, relock_lock_only, "chore(deps): bump uv.lock only")
    result = pipeline.build(stale)
    assert not result.success
    installed = checks(result)["installed_harbor_matches_lock"]
    assert not installed.passed and "stale bake" in (installed.description or "")
    assert "tpu/verified_image" not in materialized(result)


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("fail", "ended failed"),
        ("unschedulable", "ended unschedulable"),
        ("oom", "ended failed (exit 137, OOMKilled"),
        ("vanish", "vanished"),
    ],
)
def test_failed_build_job_pushes_nothing_and_leaves_the_floating_tag(
    pipeline: Pipeline, fault: str, says: str
) -> None:
    head = remote_head(pipeline.sb.consumer)
    queue_fault(pipeline.sb.iris_home, fault)
    result = pipeline.build(head)
    assert not result.success and says in failure_message(result)
    assert pipeline.pinned(head) is None and pipeline.floating() is None
    assert materialized(result) == set()


def test_hung_build_ends_on_the_iris_timeout_state_not_on_logs(pipeline: Pipeline) -> None:
    """A hung build prints nothing; iris ends it at its --timeout and its STATE says so."""
    text = pipeline.sb.site_file.read_text().replace(
        "build_timeout_s = 10800", "build_timeout_s = 3"
    )
    pipeline.sb.site_file.write_text(text)
    queue_fault(pipeline.sb.iris_home, "hang")
    result = pipeline.build(remote_head(pipeline.sb.consumer))
    message = failure_message(result)
    assert (
        not result.success and "ended failed" in message and "exceeded its timeout of 3s" in message
    )


def test_smoke_failure_blocks_verification(pipeline: Pipeline) -> None:
    advance_harbor(pipeline.sb.root, fix=True)
    commit = pipeline.relock()
    queue_fault(pipeline.sb.iris_home, "ok")  # the build
    queue_fault(pipeline.sb.iris_home, "fail")  # the smoke
    result = pipeline.build(commit)
    assert not result.success and "smoke job" in failure_message(result)
    assert materialized(result) == {"tpu/image"}


def test_pinned_tag_is_reused_never_rebuilt(pipeline: Pipeline) -> None:
    advance_harbor(pipeline.sb.root, fix=True)
    commit = pipeline.relock()
    assert pipeline.build(commit).success
    digest = pipeline.pinned(commit)
    (kaniko,) = (pipeline.sb.iris_home / "jobs").rglob(
        f"tpu-kaniko-{pipeline.gitsha(commit)}/state.json"
    )
    first_job = kaniko.read_text()
    again = pipeline.build(commit)
    assert again.success and pipeline.pinned(commit) == digest
    assert metadata(again, IMAGE)["job_state"] == "reused"
    assert kaniko.read_text() == first_job  # no second kaniko job for an existing :tpu-<gitsha>


def test_pipeline_against_a_real_registry_server(
    tmp_path: Path, registry_server: RegistryServer
) -> None:
    """The same flow against docker-registry over HTTP:
    digests and the floating tag as the server sees them."""
    server = registry_server
    with dg.instance_for_test() as instance:
        sb = up(tmp_path / "sandbox", registry=server.host)
        try:
            resources = sandbox_resources(sb, tmp_path / "cache")
            p = Pipeline(sb, resources, instance)
            assert isinstance(p.registry, HttpRegistry)
            advance_harbor(sb.root, fix=True)
            commit = p.relock()
            result = p.build(commit)
            assert result.success, failure_message(result)
            assert p.tag("promote").success
            http = HttpRegistry(host=server.host)
            assert (
                http.resolve(repository=p.repository, reference="tpu")
                == metadata(result, IMAGE)["digest"]
            )

            # People's CLI against the same server.
            ref = f"{server.host}/{p.repository}:tpu"
            runner = CliRunner()
            digest = runner.invoke(lockstep_cli, ["image", "digest", ref])
            assert (
                digest.exit_code == 0 and digest.output.strip() == metadata(result, IMAGE)["digest"]
            )
            # The probes read where the site says the image
            # installs harbor (the sandbox image's python is 3.11).
            probes = runner.invoke(
                lockstep_cli, ["image", "probes", ref], env={SITE_ENV: str(sb.site_file)}
            )
            assert (
                probes.exit_code == 0
                and "HOLDS" in probes.output
                and "logger.warning" in probes.output
            )
            probes = runner.invoke(
                lockstep_cli, ["image", "probes", ref, "--json"], env={SITE_ENV: str(sb.site_file)}
            )
            assert probes.exit_code == 0 and json.loads(probes.output)["passed"] is True
            site_packages = load_site(sb.site_file).tpu.site_packages
            cat = runner.invoke(
                lockstep_cli, ["image", "cat", ref, f"{site_packages}/harbor/job.py"]
            )
            assert cat.exit_code == 0 and "existing_config != self.config" in cat.output
        finally:
            stop_sandbox(sb)


@pytest.mark.parametrize("contract", ["2026-07", "2026-06"])
def test_the_pipeline_against_the_older_iris_contracts(pipeline: Pipeline, contract: str) -> None:
    """Today's iris is the fixture's (2026-08,
    describe/cancel); the same flow on mid-2026 binaries."""
    p = pipeline
    use_iris_contract(p.sb.root, contract)
    assert (
        iris_for(load_site(p.sb.site_file))
        .capabilities()
        .contract.startswith(contract[:7] if contract == "2026-07" else "2026-04")
    )
    fix = advance_harbor(p.sb.root, fix=True)
    b1 = p.relock()
    first = p.build(b1)
    assert first.success, failure_message(first)
    assert p.tag("promote").success and p.floating() == p.pinned(b1)
    advance_harbor(p.sb.root)
    b2 = p.relock()
    assert p.build(b2).success and p.tag("promote").success and p.floating() == p.pinned(b2)
    rolled = p.tag("rollback", must_contain=fix[:8])
    assert rolled.success, failure_message(rolled)
    assert p.floating() == p.pinned(b1) and metadata(rolled)["hold"] is True


def test_a_failed_build_shows_its_state_error_and_masked_log_tail(
    pipeline: Pipeline, push_consumer
) -> None:
    def fail_in_kaniko(wt: Path) -> None:
        script = wt / "docker" / "build_tpu_kaniko.sh"
        text = script.read_text().replace(
            "exec /kaniko/executor",
            'echo "error building image: RUN uv pip install: exit status 1" >&2\n'
            'echo "token is $DOCKER_USER_ID"\nexit 3\nexec /kaniko/executor',
            1,
        )
        script.write_text(text)

    head = push_consumer(pipeline.sb, fail_in_kaniko, "build fails in kaniko")
    result = pipeline.build(head)
    assert not result.success and "ended failed (exit 3, Exit code 3)" in failure_message(result)
    meta = failure_metadata(result)
    assert meta["state"].strip("`\n") == "failed" and meta["exit_code"].strip("`\n") == "3"
    assert "error building image: RUN uv pip install: exit status 1" in meta["log_tail"]
    assert "exit 3" in meta["log_tail"]  # the traced script, as iris kept it
    assert SANDBOX_TOKEN_VALUE not in meta["log_tail"] and pipeline.pinned(head) is None


def test_a_token_printed_into_the_job_log_fails_the_run_naming_the_variable(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    advance_harbor(pipeline.sb.root, fix=True)
    commit = pipeline.relock()
    queue_fault(pipeline.sb.iris_home, "leak")
    result = pipeline.build(commit)
    message = failure_message(result)
    assert (
        not result.success
        and f"contains the value of ${SANDBOX_TOKEN_ENV} (passed as -e DOCKER_TOKEN" in message
    )
    assert "Revoke that token now" in message and SANDBOX_TOKEN_VALUE not in message
    assert SANDBOX_TOKEN_VALUE not in json.dumps(failure_metadata(result))
    written = [
        p
        for p in (tmp_path / "dagster_home").rglob("*")
        if p.is_file() and SANDBOX_TOKEN_VALUE.encode() in p.read_bytes()
    ]
    assert written == []  # not in the event log, the run storage or the IO manager's files


def test_the_real_scripts_xtrace_order_is_refused_before_anything_reaches_iris(
    pipeline: Pipeline, push_consumer
) -> None:
    def real_order(wt: Path) -> None:
        script = wt / "docker" / "build_tpu_kaniko.sh"
        text = script.read_text().replace("set -euo pipefail\n", "set -euxo pipefail\n", 1)
        script.write_text(text.replace("{ set +x; } 2>/dev/null\n", "", 1))

    head = push_consumer(pipeline.sb, real_order, "build script: trace everything")
    result = pipeline.build(head)
    message = failure_message(result)
    lines = (
        git.Repo(pipeline.sb.consumer).git.show(f"{head}:docker/build_tpu_kaniko.sh").splitlines()
    )
    xtrace = lines.index("set -euxo pipefail") + 1
    guard = lines.index(': "${DOCKER_TOKEN:?}"') + 1
    assert (
        f"docker/build_tpu_kaniko.sh:{guard}: `set -x` (line {xtrace}) is on when $DOCKER_TOKEN "
        "is expanded: the "
        "token would be printed into the iris job log"
    ) in message
    assert "nothing was submitted to iris" in message
    assert not (pipeline.sb.iris_home / "jobs" / "sandbox").exists()  # nothing reached iris


def test_a_script_that_pushes_elsewhere_is_refused_naming_both(
    pipeline: Pipeline, push_consumer
) -> None:
    def hard_coded(wt: Path) -> None:
        script = wt / "docker" / "build_tpu_kaniko.sh"
        script.write_text(
            script.read_text().replace(
                pipeline.site.tpu.image, "ghcr.io/open-thoughts/openthoughts-agent"
            )
        )

    head = push_consumer(pipeline.sb, hard_coded, "build script: push to ghcr")
    message = failure_message(pipeline.build(head))
    assert (
        "the script pushes to ghcr.io/open-thoughts/openthoughts-agent:tpu-${GITSHA}, but the "
        "site's [tpu].image is "
        f"{pipeline.site.tpu.image}"
    ) in message
    assert not (pipeline.sb.iris_home / "jobs" / "sandbox").exists()


def test_a_docker_hub_token_for_ghcr_is_refused_without_echoing_it(
    pipeline: Pipeline, push_consumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ghcr = "ghcr.io/open-thoughts/openthoughts-agent"
    site = pipeline.sb.site_file
    site.write_text(
        site.read_text().replace(f'image = "{pipeline.site.tpu.image}"', f'image = "{ghcr}"')
    )

    def to_ghcr(wt: Path) -> None:
        script = wt / "docker" / "build_tpu_kaniko.sh"
        script.write_text(
            script.read_text()
            .replace(pipeline.site.tpu.image, ghcr)
            .replace('"sandbox.local"', '"ghcr.io"')
        )

    head = push_consumer(pipeline.sb, to_ghcr, "build script: ghcr")
    hub = "dckr_pat_" + "A1b2C3d4E5f6G7h8I9j0" * 2
    monkeypatch.setenv(SANDBOX_TOKEN_ENV, hub)
    pipeline.resources["iris"] = iris_for(load_site(site))
    message = failure_message(pipeline.build(head))
    assert (
        f"${SANDBOX_TOKEN_ENV} holds a Docker Hub personal access token" in message
        and hub not in message
    )
    assert not (pipeline.sb.iris_home / "jobs" / "sandbox").exists()


def test_tags_follow_gits_short_length_rule(pipeline: Pipeline) -> None:
    advance_harbor(pipeline.sb.root, fix=True)
    commit = pipeline.relock()
    result = pipeline.build(commit)
    assert result.success, failure_message(result)
    short = git.Repo(pipeline.sb.consumer).git.rev_parse("--short", commit)
    assert (
        metadata(result, IMAGE)["image"] == f"{pipeline.site.tpu.image}:tpu-{short}"
        and len(short) >= 7
    )


def test_a_job_that_succeeds_without_pushing_is_not_an_image(
    pipeline: Pipeline, push_consumer
) -> None:
    def never_push(wt: Path) -> None:
        script = wt / "docker" / "build_tpu_kaniko.sh"
        script.write_text(
            script.read_text().replace(
                "exec /kaniko/executor",
                'echo "skipping the push"\nexit 0\nexec /kaniko/executor',
                1,
            )
        )

    head = push_consumer(pipeline.sb, never_push, "build script: no push")
    message = failure_message(pipeline.build(head))
    assert (
        "says succeeded, but the registry has no "
        f"{pipeline.site.tpu.image}:tpu-{pipeline.gitsha(head)} (absent"
    ) in message
    assert "a state is not an image" in message
