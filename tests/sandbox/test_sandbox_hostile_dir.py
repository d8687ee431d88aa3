"""A sandbox whose directory name is shell syntax runs
nothing of it, and a job's secrets end with the job.

The directory is named ``sb;touch${IFS}<marker>;y...``: pasted bare into a script, it would create
the marker. The sandbox iris runs the consumer's real build_tpu_kaniko.sh with its /tmp and /kaniko
moved under that directory (sandbox/fake_iris_jobs.py, sandbox/shell_place.py); `lockstep sandbox
up` writes its node wrappers there. After a finished and a failed kaniko job, the task's own disk
(the push login in $DOCKER_CONFIG/config.json) is gone, and the canary scan covered those job dirs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from lockstep.cli import main
from resources.iris.cli import IrisCli
from resources.iris.output import JobState
from resources.kaniko import KanikoSettings, kaniko_job
from resources.site.load import load_site
from sandbox.consumer_source import build_script
from sandbox.engines import ENGINE_DIR, Engine
from sandbox.fake_iris import install_fake_iris, job_dir, stop_all
from sandbox.fake_iris_jobs import _in_task_root
from sandbox.shell_place import ShellPlaceError, replace_paths
from sandbox.teardown import stop_sandbox as stop_sandbox_dir
from sandbox.world import advance_harbor, up
from tests.conftest import sandbox_resources, stop_sandbox
from tests.support.canary_scan import Canary, scan
from tests.support.registry_server import running_registry
from tests.support.report import count
from tests.support.runs import Pipeline, failure_message

SECRET = "ghp_hostileDirTokenValue0123456789abcd"
IMAGE = "sandbox.local/open-thoughts/openthoughts-agent"
# Reads the login the script wrote, as kaniko does, and fails the build whose sha starts 0bad.
EXECUTOR = (
    "import base64, json, os, sys\n"
    "auths = json.load(open(os.path.join(os.environ['DOCKER_CONFIG'], 'config.json')))['auths']\n"
    "user = base64.b64decode(auths['sandbox.local']['auth']).decode().split(':')[0]\n"
    "print('executor login for', user, 'destination', sys.argv[-1])\n"
    "sys.stdout.flush()\n"
    "if ':tpu-5eeb' in sys.argv[-1]: import time; time.sleep(120)  # until cancelled\n"
    "sys.exit(1 if ':tpu-0bad' in sys.argv[-1] else 0)\n"
)


def hostile_dir(base: Path) -> tuple[Path, Path]:
    """A directory whose name runs `touch <marker>` in every shell context it could land in bare."""
    marker = base / "pwned"
    t = f"touch{'${IFS}'}{marker}"
    return base / f"sb;{t};y$({t})`{t}`\"'x", marker


@pytest.mark.parametrize(
    "where",
    [
        "bare",
        "double",
        "single",
        "heredoc",
        "heredoc-dash",
        "subshell",
        "double-subshell",
        "escaped-quote",
        "after-comment",
    ],
)
def test_a_path_placed_in_a_script_reads_back_as_itself_and_runs_nothing(
    where: str, tmp_path: Path
) -> None:
    d, marker = hostile_dir(tmp_path)
    script = {
        "bare": "printf '%s\\n' /tmp/a",
        "double": 'printf "%s\\n" "/tmp/a"',
        "single": "printf '%s\\n' 'x /tmp/a'",
        "heredoc": "cat <<EOF\n/tmp/a\nEOF",
        "heredoc-dash": "cat <<-EOF\n\t/tmp/a\n\tEOF",
        "escaped-quote": "printf '%s\\n' \\' /tmp/a",  # \' is a plain quote character, not a quote
        "after-comment": "# it's a comment\nprintf '%s\\n' /tmp/a",
        "subshell": "printf '%s\\n' $(printf '%s' /tmp/a)",
        "double-subshell": 'printf "%s\\n" "$(printf "%s" "/tmp/a")"',
    }[where]
    placed = replace_paths(script, re.compile(r"/tmp(?=/)"), lambda _m: str(d))
    out = subprocess.run(
        ["bash", "-c", placed], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    expected = {"single": f"x {d}/a", "escaped-quote": f"'\n{d}/a"}.get(where, f"{d}/a")
    # the name holds no blank, so even an unquoted $( ) gives it whole
    assert out.rstrip("\n") == expected
    assert not marker.exists()


def test_a_comment_is_left_alone_and_a_quoted_heredoc_refuses_a_path_it_cannot_hold(
    tmp_path: Path,
) -> None:
    d, _ = hostile_dir(tmp_path)
    assert _in_task_root("# cd /tmp first\n", d) == "# cd /tmp first\n"
    for quoted in ("'EOF'", '"EOF"', "\\EOF"):
        with pytest.raises(ShellPlaceError, match="quoted here-doc"):
            _in_task_root(f"cat <<{quoted}\n/tmp/x\nEOF\n", d)
    # A plain path is written as it is, anywhere (the script is unchanged but for the path).
    assert (
        _in_task_root("cat <<'EOF'\n/tmp/x\nEOF\n", tmp_path / "plain")
        == f"cat <<'EOF'\n{tmp_path}/plain/tmp/x\nEOF\n"
    )


@pytest.fixture
def iris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, Path, Path, Path]]:
    """The sandbox iris installed under the hostile
    directory, with a kaniko stand-in that reads its login."""
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    d, marker = hostile_dir(tmp_path)
    (tmp_path / "sb").mkdir()  # so that a bare `cd <name>` would get as far as the injected `touch`
    workspace = d / "workspace"
    (workspace / "docker").mkdir(parents=True)
    (workspace / "docker" / "Dockerfile.tpu").write_text("FROM python:3.12-slim\n")
    binary = install_fake_iris(
        d / "world", contract="2026-08", kaniko=[sys.executable, "-c", EXECUTOR], state_delay_s=0.02
    )
    home = d / "world" / "iris"
    yield binary, home, workspace, marker
    stop_all(home)


def _cli(binary: Path) -> IrisCli:
    return IrisCli(
        binary=str(binary),
        cluster="sandbox",
        user="sandbox",
        timeout_s=20,
        poll_min_s=0.02,
        poll_max_s=0.1,
        vanish_after=3,
        redact_env=["GHCR_TOKEN"],
        docker_token_env="GHCR_TOKEN",
    )


def test_kaniko_jobs_under_a_hostile_dir_run_nothing_injected_and_leave_no_login(
    iris: tuple[Path, Path, Path, Path],
) -> None:
    binary, home, workspace, marker = iris
    cli = _cli(binary)
    jobs = {}
    for gitsha, want in (("abd6dc8", JobState.SUCCEEDED), ("0badbad", JobState.FAILED)):
        spec = kaniko_job(
            KanikoSettings(
                gitsha=gitsha, image=IMAGE, docker_user="penfever", docker_token_env="GHCR_TOKEN"
            ),
            build_script(IMAGE).encode(),
        )
        sub = cli.submit(spec=spec, cwd=workspace)
        done = cli.wait(job_id=sub.job_id, timeout_s=30, submission=sub)
        text = (job_dir(home, sub.job_id) / "log").read_text()
        assert done.state is want, text
        # The script ran to kaniko: the login it wrote under the hostile path was there to read.
        assert f"executor login for penfever destination {IMAGE}:tpu-{gitsha}" in text, text
        jobs[gitsha] = job_dir(home, sub.job_id)
    assert not marker.exists(), "the sandbox directory's name ran as a command"

    for jd in jobs.values():  # the task's container is gone; the job's record stays
        assert (jd / "state.json").is_file() and (jd / "log").is_file()
        assert not (jd / "root").exists() and not (jd / "home").exists(), sorted(
            p.name for p in jd.iterdir()
        )
    # the docker login; iris/config.json is the fake's own
    assert not list((home / "jobs").rglob("config.json"))

    canary = Canary(env="GHCR_TOKEN", value=SECRET, users=("penfever",))
    report = scan([canary], [home])
    ends = [
        int(json.loads((jd / "state.json").read_text())["finished_at_ms"]) for jd in jobs.values()
    ]
    # Not vacuous: the scan walked both job dirs, read
    # their files, and began after both jobs had ended.
    assert all(jd.resolve() in report.walked for jd in jobs.values())
    assert report.files >= 6 and report.started_ms >= max(ends)
    assert report.findings == [], report.by_canary()
    count("kaniko jobs whose login ended with them", len(jobs))


def test_a_cancelled_kaniko_job_leaves_no_login_either(iris: tuple[Path, Path, Path, Path]) -> None:
    binary, home, workspace, marker = iris
    cli = _cli(binary)
    spec = kaniko_job(
        KanikoSettings(
            gitsha="5eeb5ee", image=IMAGE, docker_user="penfever", docker_token_env="GHCR_TOKEN"
        ),
        build_script(IMAGE).encode(),
    )
    sub = cli.submit(spec=spec, cwd=workspace)
    jd = job_dir(home, sub.job_id)
    deadline = time.monotonic() + 60  # a bound on waiting, not an assertion on time
    while "executor login for" not in (jd / "log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    # the login is there...
    assert list((jd / "root").rglob("config.json")), "the job never got as far as its login"
    cli.cancel(job_id=sub.job_id)
    assert json.loads((jd / "state.json").read_text())["state"] == "killed"
    # ...and gone with the job
    assert not (jd / "root").exists() and not list(jd.rglob("config.json"))
    assert not marker.exists()


def test_sandbox_up_under_a_hostile_dir_writes_wrappers_that_run_nothing_of_its_name(
    tmp_path: Path,
) -> None:
    d, marker = hostile_dir(tmp_path)
    try:
        result = CliRunner().invoke(
            main, ["sandbox", "up", "--dir", str(d)], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        site = load_site(d / "site.toml")
        # the site's URLs carry the name
        assert site.tpu.harbor_repo == (d / "repos/harbor.git").as_uri()
        wrappers = sorted(d.glob("nodes/*/bin/docker"))
        assert wrappers
        for wrapper in wrappers:
            # Everything up to the engine check, run: DOCKER_HOST holds the path, and nothing ran.
            head = wrapper.read_text().split("if ! ", 1)[0]
            out = subprocess.run(
                ["sh", "-c", head + 'printf %s "$DOCKER_HOST"'],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            assert out == f"unix://{Engine(wrapper.parents[1] / ENGINE_DIR).socket}"
        iris_wrapper = d / "bin" / "iris"
        if iris_wrapper.exists():
            subprocess.run(
                [str(iris_wrapper), "--help"], capture_output=True, timeout=60, check=False
            )
        assert not marker.exists()
    finally:
        stop_sandbox_dir(d)


@pytest.mark.heavy(90)
def test_a_sandbox_under_a_hostile_dir_relocks_and_builds_and_runs_nothing_of_its_name(
    tmp_path: Path,
) -> None:
    """The whole first build (the issue's repro): relock,
    the kaniko job through the sandbox iris with the
    real executor stand-in and build engine, checks,
    smoke, verified, with every path under that name."""
    d, marker = hostile_dir(tmp_path)
    (tmp_path / "sb").mkdir()  # so that a bare `cd <name>` would get as far as the injected `touch`
    with running_registry(tmp_path / "registry") as registry:
        sb = up(d, registry=registry.host)
        try:
            assert str(d) in sb.site_file.read_text() or d.as_uri() in sb.site_file.read_text()
            with dg.instance_for_test() as instance:
                p = Pipeline(sb, sandbox_resources(sb, tmp_path / "cache"), instance)
                advance_harbor(sb.root, fix=True)
                commit = p.relock()
                result = p.build(commit)
                assert result.success, failure_message(result)
                assert p.pinned(commit)
        finally:
            stop_sandbox(sb)
    assert not marker.exists(), "the sandbox directory's name ran as a command"
    jobs = [s.parent for s in (sb.iris_home / "jobs").glob("*/*/state.json")]
    assert any(json.loads((jd / "state.json").read_text())["kind"] == "kaniko" for jd in jobs), jobs
    assert all(not (jd / "root").exists() and not (jd / "home").exists() for jd in jobs)
