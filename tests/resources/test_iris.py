"""IrisCli against iris as it is in every 2026 version: the real CLI's output shapes, read; the
sandbox's iris in each of its three contracts; state
polling (never logs), cancel, the post-mortem log and its
secret scan. The real marin-iris CLI is driven in tests/resources/test_iris_real.py."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from resources.iris import cli as iris_module
from resources.iris.capabilities import ClientTooOld, MissingCapability
from resources.iris.cli import IrisCli, JobAlreadyRunning, JobReplaced, JobSpec
from resources.iris.output import (
    IrisError,
    JobState,
    help_commands,
    help_options,
    parse_list_text,
    parse_state_json,
    parse_state_text,
)
from resources.kaniko import KanikoSettings, kaniko_job
from sandbox.consumer_source import build_script
from sandbox.fake_iris import CONTRACTS, install_fake_iris, job_dir, stop_all
from tests.support.report import queue_fault

SECRET = "ghp_irisTestTokenValue0123456789abcdef"
IMAGE = "sandbox.local/open-thoughts/openthoughts-agent"

# What marin-iris 0.2.20.dev202606180959's own `iris
# job --help` and `iris job run --help` print (trimmed).
REAL_JOB_HELP_2026_06 = """Usage: iris job [OPTIONS] COMMAND [ARGS]...

  Manage Iris jobs.

Options:
  --help  Show this message and exit.

Commands:
  bug-report  Generate a diagnostic bug report for a job.
  kill        Terminate one or more jobs (alias for stop).
  list        List jobs with optional filtering.
  logs        Stream task logs for a job and its descendants using batch...
  run         Submit jobs to Iris clusters.
  stop        Terminate one or more jobs.
  summary     Print a per-task summary (peak memory, state, exit,...
"""
REAL_RUN_HELP_2026_06 = """Usage: iris job run [OPTIONS] CMD...

Options:
  -e, --env-vars <TEXT TEXT>...   Set environment variables for the job (KEY
                                  VALUE). Can be repeated.
  --enable-extra-resources        Allow accelerators (--tpu/--gpu) and large
                                  resource requests (>= 4 GB RAM or >= 10 GB
                                  disk) on the entrypoint job.
  --cpu FLOAT                     Number of CPUs to request  [default: 0.1]
  --no-wait                       Don't wait for job completion
  --job-name TEXT                 Custom job name (default: auto-generated)
  --user TEXT                     Override the user prefix for the submitted
                                  job.
  --preemptible / --no-preemptible
                                  Force scheduling on preemptible
                                  (--preemptible) or non-preemptible (--no-
                                  preemptible) workers.
  --task-image TEXT               Override the task container image for this
                                  job.
  --help                          Show this message and exit.
"""
# `render_job_description_text` (2026-08) and
# `_render_job_summary_text` (2026-07) as the real ones print.
DESCRIBE_FAILED = """Job: /benjaminfeuer/tpu-kaniko-abd6dc86 (tpu-kaniko-abd6dc86)
State: failed  exit=137  failures=1  preemptions=0
Tasks: 1/1 completed  failed=1
Error: OOMKilled: container exceeded its memory limit

  TASK  STATE    EXIT  DURATION       PEAK MEM    CUR MEM    DIAGNOSTIC
     0  failed    137  8 minutes      255.9 GB    -          OOMKilled
"""
DESCRIBE_PENDING = """Job: /benjaminfeuer/tpu-kaniko-abd6dc86 (tpu-kaniko-abd6dc86)
State: pending  exit=0  failures=0  preemptions=0
Tasks: 0/1 completed  pending=1

  TASK  STATE    EXIT    DURATION    PEAK MEM    CUR MEM    DIAGNOSTIC
     0  pending  -       -           -           -          Pending: insufficient cpu (need 32, max free 16)
"""  # noqa: E501
SUMMARY_RUNNING_2026_07 = """Job: /u/j (/u/j)
State: running  exit=0  failures=0  preemptions=1
Tasks: 0/1 completed  running=1

  TASK  STATE    EXIT    DURATION    PEAK MEM    CUR MEM    ERROR
     0  running  -       2 minutes   1 GB        1 GB
"""


class Fake(BaseModel):
    binary: Path
    home: Path
    workspace: Path
    contract: str

    def cli(self, **overrides: object) -> IrisCli:
        fields: dict[str, object] = {
            "binary": str(self.binary), "cluster": "sandbox", "user": "sandbox", "timeout_s": 20,
            "poll_min_s": 0.02, "poll_max_s": 0.1, "vanish_after": 3, "redact_env": ["GHCR_TOKEN"],
            "docker_token_env": "GHCR_TOKEN",
        }  # fmt: skip
        return IrisCli(**{**fields, **overrides})


def _fake(tmp_path: Path, contract: str, **install: object) -> Fake:
    workspace = tmp_path / "workspace"
    (workspace / "docker").mkdir(parents=True, exist_ok=True)
    (workspace / "docker" / "Dockerfile.tpu").write_text("FROM python:3.12-slim\n")
    kaniko = [sys.executable, "-c", ("import os, sys; print('executor', ' '.join(sys.argv[1:]), "
              "'user', os.environ.get('DOCKER_USER_ID'))")]  # fmt: skip
    binary = install_fake_iris(
        tmp_path / "world", contract=contract, kaniko=kaniko, state_delay_s=0.02, **install
    )  # type: ignore[arg-type]
    return Fake(
        binary=binary, home=tmp_path / "world" / "iris", workspace=workspace, contract=contract
    )


@pytest.fixture(params=sorted(CONTRACTS))
def fake(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fake]:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    f = _fake(tmp_path, request.param)
    yield f
    stop_all(f.home)  # no hung worker outlives its test


@pytest.fixture
def today(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    f = _fake(tmp_path, "2026-08")
    yield f
    stop_all(f.home)


def job(name: str, script: str, **more: object) -> JobSpec:
    return JobSpec(
        name=name,
        task_image="docker.io/library/ubuntu:22.04",
        cpu=1,
        memory="1GB",
        disk="5GB",
        timeout_s=60,
        command=["bash", "-lc", script],
        **more,
    )


def files_under(root: Path) -> Iterator[Path]:
    return (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# ---- pure: what the real CLI prints --------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "state"),
    [
        ("succeeded", JobState.SUCCEEDED),
        ("JOB_STATE_SUCCEEDED", JobState.SUCCEEDED),
        ("worker_failed", JobState.WORKER_FAILED),
        ("worker-failed", JobState.WORKER_FAILED),
        (" running ", JobState.RUNNING),
        ("unspecified", JobState.PENDING),
    ],
)
def test_states_are_read_however_iris_spells_them(spelling: str, state: JobState) -> None:
    assert JobState.parse(spelling) is state


def test_an_unknown_state_is_an_error_that_shows_the_value_not_a_vanished_job() -> None:
    with pytest.raises(IrisError, match="'exploded', which lockstep does not know"):
        JobState.parse("exploded")


def test_describe_text_of_a_failed_job() -> None:
    s = parse_state_text(DESCRIBE_FAILED, job_id="/benjaminfeuer/tpu-kaniko-abd6dc86")
    assert (s.state, s.exit_code, s.failures, s.preemptions) == (JobState.FAILED, 137, 1, 0)
    assert s.error == "OOMKilled: container exceeded its memory limit"
    assert [(t.index, t.state, t.exit_code, t.diagnostic) for t in s.tasks] == [
        ("0", "failed", 137, "OOMKilled")
    ]


def test_pending_diagnostics_and_a_default_exit_that_is_not_believed() -> None:
    s = parse_state_text(DESCRIBE_PENDING, job_id="/benjaminfeuer/tpu-kaniko-abd6dc86")
    # exit=0 is the proto default
    assert (s.state, s.exit_code, s.error) == (JobState.PENDING, None, None)
    assert s.diagnostics() == "task 0 pending: Pending: insufficient cpu (need 32, max free 16)"
    running = parse_state_text(SUMMARY_RUNNING_2026_07, job_id="/u/j")
    assert (running.state, running.exit_code, running.preemptions, running.diagnostics()) == (
        JobState.RUNNING,
        None,
        1,
        "",
    )


# marin-iris 0.2.20.dev202606180959 against its own local controller: the job's exit stays 0.
REAL_SUMMARY_FAILED_2026_06 = """Job: /root/fail (/root/fail)
State: failed  exit=0  failures=1  preemptions=0
Tasks: 0/1 completed  failed=1
Error: Exit code: 3

  TASK  STATE       EXIT  DURATION      PEAK MEM    CUR MEM    ERROR
     0  failed         3  1.02 seconds  -           -          Exit code: 3
"""


def test_a_2026_06_failed_job_carries_its_exit_code_on_the_task() -> None:
    s = parse_state_text(REAL_SUMMARY_FAILED_2026_06, job_id="/root/fail")
    assert (s.state, s.exit_code, s.error) == (JobState.FAILED, 3, "Exit code: 3")


def test_summary_json_of_2026_06_and_a_non_integer_exit() -> None:
    done = parse_state_json(
        {
            "job_id": "/u/j",
            "state": "failed",
            "exit_code": 3,
            "error": f"push denied for {SECRET}",
            "tasks": [{"index": "0", "state": "failed", "exit_code": 3, "error": ""}],
        },
        job_id="/u/j",
        secrets=[SECRET],
    )
    assert (done.state, done.exit_code, done.error) == (JobState.FAILED, 3, "push denied for ***")
    with pytest.raises(IrisError, match="exit_code 'abc'"):
        parse_state_json({"job_id": "/u/j", "state": "failed", "exit_code": "abc"}, job_id="/u/j")


def test_job_list_table_with_and_without_reasons() -> None:
    rows = parse_list_text(
        "JOB ID            STATE    SUBMITTED                         REASON\n"
        "/u/tpu-kaniko-ab  pending  2026-11-30T10:00:00.123000+00:00  insufficient cpu\n"
        "/u/tpu-kaniko-a   running  2026-11-30T09:00:00+00:00\n"
    )
    assert [(r.job_id, r.state, r.submitted, r.reason) for r in rows] == [
        ("/u/tpu-kaniko-ab", "pending", "2026-11-30T10:00:00.123000+00:00", "insufficient cpu"),
        ("/u/tpu-kaniko-a", "running", "2026-11-30T09:00:00+00:00", ""),
    ]
    assert parse_list_text("No jobs found.\n") == []


def test_capabilities_are_read_from_the_real_help_screens() -> None:
    assert help_commands(REAL_JOB_HELP_2026_06) == {
        "bug-report",
        "kill",
        "list",
        "logs",
        "run",
        "stop",
        "summary",
    }
    options = help_options(REAL_RUN_HELP_2026_06)
    assert {
        "-e",
        "--env-vars",
        "--user",
        "--preemptible",
        "--no-preemptible",
        "--task-image",
    } <= options
    # mentioned in a description, not an option
    assert "--no-sync" not in options and "--tpu" not in options


def test_argv_is_the_runbook_shape_with_user_and_no_preemptible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    spec = kaniko_job(
        KanikoSettings(
            gitsha="abd6dc86", image=IMAGE, docker_user="penfever", docker_token_env="GHCR_TOKEN"
        ),
        build_script(IMAGE).encode(),
    )
    cli = IrisCli(binary="/opt/otagent/bin/iris", cluster="cw-us-east-02a", user="benjaminfeuer")
    argv = cli.argv(spec)
    assert argv[:4] == ["/opt/otagent/bin/iris", "--cluster=cw-us-east-02a", "job", "run"]
    assert argv[argv.index("--user") + 1] == "benjaminfeuer" and "--no-preemptible" in argv
    assert (
        argv[argv.index("--") - 1] == "--no-wait" and argv[argv.index("DOCKER_TOKEN") + 1] == SECRET
    )
    assert cli.job_id(spec.name) == "/benjaminfeuer/tpu-kaniko-abd6dc86"  # known before the submit
    assert SECRET not in cli.command_line(spec) and "-e DOCKER_TOKEN '***'" in cli.command_line(
        spec
    )
    # the script, shown by size
    assert f"'<{len(spec.env['BUILD_B64'])} chars>'" in cli.command_line(spec)


@pytest.mark.parametrize(
    "bad", [{"cluster": None}, {"config_file": "x.yaml"}, {"user": "a b"}, {"user": "--x"}]
)
def test_a_cli_needs_one_target_and_a_plain_user(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        IrisCli(**{"cluster": "c", "user": "u", **bad})


def test_missing_secret_names_the_variable_never_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GHCR_TOKEN", raising=False)
    spec = job("needs-token", "exit 0", secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"})
    with pytest.raises(
        IrisError,
        match=r"-e DOCKER_TOKEN comes from environment variable GHCR_TOKEN, which is not set",
    ):
        IrisCli(cluster="c", user="u").argv(spec)


# ---- against the sandbox iris, in each contract ------------------------------------------------


def test_capabilities_of_each_generation(fake: Fake) -> None:
    caps = fake.cli().capabilities()
    want = {"2026-08": ("describe", "cancel", False), "2026-07": ("summary", "kill", False),
            "2026-06": ("summary", "kill", True)}[fake.contract]  # fmt: skip
    assert (caps.state_command, caps.cancel_command, caps.summary_json) == want
    assert "--no-sync" in caps.run_options and "--user" in caps.run_options


def test_today_refuses_json_as_click_does(today: Fake) -> None:
    said = subprocess.run(
        [str(today.binary), "--cluster=sandbox", "job", "describe", "/sandbox/x", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert said.returncode == 2 and "No such option: --json" in said.stderr
    gone = subprocess.run([str(today.binary), "--cluster=sandbox", "job", "summary", "/sandbox/x"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert gone.returncode == 2 and "No such command 'summary'" in gone.stderr


def test_a_command_job_succeeds_by_its_state(fake: Fake) -> None:
    cli = fake.cli()
    sub = cli.submit(spec=job("smoke-ok", 'echo "ran on $TASK_IMAGE"; exit 0'), cwd=fake.workspace)
    assert sub.job_id == "/sandbox/smoke-ok" and sub.listed is not None and sub.listed.state
    done = cli.wait(job_id=sub.job_id, timeout_s=20, submission=sub)
    assert (done.state, done.exit_code, done.error) == (JobState.SUCCEEDED, 0, None)
    log = cli.logs(job_id=sub.job_id, since_ms=sub.submitted_ms)
    assert (
        log.tail == [l for l in log.tail if "ran on docker.io/library/ubuntu:22.04" in l]
        and log.leaked == []
    )


def test_a_failure_carries_the_exit_code_and_the_log(fake: Fake) -> None:
    cli = fake.cli()
    sub = cli.submit(
        spec=job("smoke-bad", "for i in $(seq 1 300); do echo line $i; done; exit 7"),
        cwd=fake.workspace,
    )
    done = cli.wait(job_id=sub.job_id, timeout_s=20, submission=sub)
    assert (done.state, done.exit_code) == (JobState.FAILED, 7) and "Exit code 7" in (
        done.error or ""
    )
    log = cli.logs(job_id=sub.job_id, since_ms=sub.submitted_ms)
    # The whole window (--no-tail from the submit), its last 200 lines kept: the end of the story.
    assert log.lines == 300 and len(log.tail) == 200 and log.tail[-1].endswith("| line 300")


def test_oom_is_failed_with_no_last_line(fake: Fake) -> None:
    queue_fault(fake.home, "oom")
    cli = fake.cli()
    sub = cli.submit(spec=job("smoke-oom", "echo never printed"), cwd=fake.workspace)
    done = cli.wait(job_id=sub.job_id, timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.FAILED, 137) and "OOMKilled" in (
        done.error or ""
    )
    # only the state says what happened
    assert cli.logs(job_id=sub.job_id, since_ms=sub.submitted_ms).lines == 0


def test_unschedulable_is_terminal_with_its_reason(today: Fake) -> None:
    queue_fault(today.home, "unschedulable")
    cli = today.cli()
    done = cli.wait(
        job_id=cli.submit(spec=job("first", "exit 0"), cwd=today.workspace).job_id, timeout_s=20
    )
    assert (done.state, done.exit_code) == (
        JobState.UNSCHEDULABLE,
        None,
    ) and "no worker can fit" in (done.error or "")


def test_a_job_stuck_pending_says_why_when_the_wait_gives_up(
    today: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    queue_fault(today.home, "pending")
    cli = today.cli()
    sub = cli.submit(spec=job("stuck", "exit 0"), cwd=today.workspace)
    with pytest.raises(
        IrisError, match=r"still pending \(.*no worker can fit cpu=1.*\) after 0.6s .*NOT cancelled"
    ):
        cli.wait(job_id=sub.job_id, timeout_s=0.6)
    cli.cancel(job_id=sub.job_id)


def test_hang_then_cancel_ends_the_whole_process_group(fake: Fake) -> None:
    cli = fake.cli()
    sub = cli.submit(spec=job("smoke-sleep", "sleep 30 & sleep 30; wait"), cwd=fake.workspace)
    with pytest.raises(
        IrisError,
        match=(
            rf"still running after 0.4s.*job {fake.cli().capabilities().cancel_command} "
            r"/sandbox/smoke-sleep"
        ),
    ):
        cli.wait(job_id=sub.job_id, timeout_s=0.4)
    worker = json.loads((job_dir(fake.home, sub.job_id) / "state.json").read_text())["worker_pgid"]
    cli.cancel(job_id=sub.job_id)
    assert cli.wait(job_id=sub.job_id, timeout_s=5).state is JobState.KILLED
    assert gone(worker)
    cli.cancel(job_id=sub.job_id)  # ending a finished job is not an error


def gone(pgid: int, within_s: float = 3.0) -> bool:
    """True once no live process is left in the group
    (a zombie awaiting its reaper counts as dead)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    live.append(stat.parent.name)
        if not live:
            return True
        time.sleep(0.02)
    return False


def test_prefix_matching_kill_of_older_iris_never_ends_a_sibling(fake: Fake) -> None:
    cli = fake.cli()
    mine = cli.submit(spec=job("tpu-kaniko-abd6dc8", "sleep 30"), cwd=fake.workspace)
    sibling = cli.submit(spec=job("tpu-kaniko-abd6dc86", "sleep 30"), cwd=fake.workspace)
    if fake.contract == "2026-08":
        cli.cancel(job_id=mine.job_id)  # `cancel` is exact
    else:
        with pytest.raises(
            IrisError,
            match=r"matches ids by prefix and would also end /sandbox/tpu-kaniko-abd6dc86",
        ):
            cli.cancel(job_id=mine.job_id)
    assert cli.describe(job_id=sibling.job_id).state is not JobState.KILLED  # type: ignore[union-attr]


def test_a_worker_that_dies_mid_job_is_worker_failed(today: Fake) -> None:
    queue_fault(today.home, "hang")
    cli = today.cli()
    sub = cli.submit(spec=job("smoke-crash", "exit 0"), cwd=today.workspace)
    with pytest.raises(IrisError, match="still running"):
        cli.wait(job_id=sub.job_id, timeout_s=0.2)
    os.killpg(
        json.loads((job_dir(today.home, sub.job_id) / "state.json").read_text())["worker_pgid"],
        signal.SIGKILL,
    )
    done = cli.wait(job_id=sub.job_id, timeout_s=5)
    assert done.state is JobState.WORKER_FAILED and "worker process died" in (done.error or "")


def test_a_vanished_job_is_an_error(today: Fake) -> None:
    queue_fault(today.home, "vanish")
    cli = today.cli()
    sub = cli.submit(spec=job("smoke-vanish", "exit 0"), cwd=today.workspace)
    with pytest.raises(IrisError, match=r"vanished: iris did not know it in 3 consecutive polls"):
        cli.wait(job_id=sub.job_id, timeout_s=20)
    assert cli.describe(job_id=sub.job_id) is None


def test_a_job_replaced_by_another_submission_of_its_name_is_not_ours(fake: Fake) -> None:
    queue_fault(fake.home, "replace")
    cli = fake.cli()
    sub = cli.submit(spec=job("smoke-replaced", "sleep 0.3; exit 0"), cwd=fake.workspace)
    time.sleep(1.5)  # it ends, and someone submits the same name
    with pytest.raises(
        JobReplaced, match="submitted at .* but iris now reports a job of that name submitted at"
    ):
        cli.wait(job_id=sub.job_id, timeout_s=20, submission=sub)


def test_a_running_job_of_the_same_name_refuses_the_submit(today: Fake) -> None:
    cli = today.cli()
    cli.submit(spec=job("busy", "sleep 30"), cwd=today.workspace)
    with pytest.raises(
        JobAlreadyRunning,
        match=r"/sandbox/busy is already running on the cluster \(it is (pending|building|running)",
    ):
        cli.submit(
            spec=job("busy", "exit 0", secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"}),
            cwd=today.workspace,
        )


def test_a_client_too_old_for_the_controller_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _fake(tmp_path, "2026-06", too_old=True)
    with pytest.raises(
        ClientTooOld, match=r"refuses the iris CLI .*client is too old.*upgrade marin-iris"
    ):
        f.cli().submit(spec=job("x", "exit 0"), cwd=f.workspace)


def test_a_binary_without_no_sync_is_refused_before_anything_runs(
    today: Fake, tmp_path: Path
) -> None:
    # The 2026-06-18 wheel's shape: no --no-sync yet (it came on 2026-06-24).
    old = tmp_path / "iris-2026-06-18"
    old.write_text(f'#!/bin/sh\n"{today.binary}" "$@" | grep -v -- "--no-sync"\n')
    old.chmod(0o755)
    with pytest.raises(
        MissingCapability,
        match=r"has no --no-sync for `job run` \(--no-sync arrived in iris on 2026-06-24",
    ):
        today.cli(binary=str(old)).submit(spec=job("never", "exit 0"), cwd=today.workspace)
    assert not (today.home / "jobs" / "sandbox").exists()


def test_a_kaniko_job_runs_the_script_and_its_executor(fake: Fake) -> None:
    cli = fake.cli()
    spec = kaniko_job(
        KanikoSettings(
            gitsha="abd6dc8", image=IMAGE, docker_user="penfever", docker_token_env="GHCR_TOKEN"
        ),
        build_script(IMAGE).encode(),
    )
    sub = cli.submit(spec=spec, cwd=fake.workspace)
    done = cli.wait(job_id=sub.job_id, timeout_s=30, submission=sub)
    log = cli.logs(job_id=sub.job_id, since_ms=sub.submitted_ms, spec=spec)
    text = "\n".join(log.tail)
    assert done.state is JobState.SUCCEEDED, text
    assert (
        f"--destination {IMAGE}:tpu-abd6dc7" not in text
        and f"--destination {IMAGE}:tpu-abd6dc8" in text
    )
    # traced, but never while the token is expanded
    assert "+ CACHE_REPO=" in text and log.leaked == []
    jd = job_dir(fake.home, sub.job_id)
    # The task's disk, with the docker login it wrote, ended with the job (the login's content is
    # read by kaniko in tests/sandbox/test_sandbox_hostile_dir.py); the job's record stays.
    assert (
        not (jd / "root").exists() and not list(jd.rglob("config.json")) and (jd / "log").is_file()
    )


def test_a_script_that_traces_its_token_is_caught_in_the_log_by_name(
    today: Fake, tmp_path: Path
) -> None:
    """bash's xtrace prints the token; the real iris does
    not mask it, so lockstep scans every log it reads."""
    cli = today.cli()
    traced = build_script(IMAGE).replace("set -euo pipefail\n", "set -euxo pipefail\n", 1)
    spec = kaniko_job(
        KanikoSettings(
            gitsha="abd6dc8", image=IMAGE, docker_user="penfever", docker_token_env="GHCR_TOKEN"
        ),
        traced.encode(),
    )
    sub = cli.submit(spec=spec, cwd=today.workspace)
    cli.wait(job_id=sub.job_id, timeout_s=30, submission=sub)
    raw = (job_dir(today.home, sub.job_id) / "log").read_text()
    assert f"+ : {SECRET}" in raw  # what anyone reading the job's logs would see
    log = cli.logs(job_id=sub.job_id, since_ms=sub.submitted_ms, spec=spec)
    assert log.leaked == ["GHCR_TOKEN"]
    assert SECRET not in "\n".join(log.tail) and "***" in "\n".join(log.tail)
    auth = base64.b64encode(f"penfever:{SECRET}".encode()).decode()
    assert auth[8:-8] not in "\n".join(log.tail)  # the traced AUTH= line is masked too


def test_logs_ask_for_the_window_from_the_submit_never_the_tail(
    today: Fake, tmp_path: Path
) -> None:
    record = tmp_path / "argv.log"
    spy = tmp_path / "spy-iris"
    spy.write_text(f'#!/bin/sh\necho "$@" >> "{record}"\nexec "{today.binary}" "$@"\n')
    spy.chmod(0o755)
    cli = today.cli(binary=str(spy))
    sub = cli.submit(spec=job("windowed", "echo hi"), cwd=today.workspace)
    cli.wait(job_id=sub.job_id, timeout_s=20)
    cli.logs(job_id=sub.job_id, since_ms=sub.submitted_ms)
    (logs,) = [line for line in record.read_text().splitlines() if " job logs " in line]
    assert (
        f"job logs /sandbox/windowed --since-ms {sub.submitted_ms} --no-tail --max-lines 100000"
        in logs
    )


def test_the_wait_backs_off_between_the_bounds(
    today: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(iris_module, "_sleep", sleep)
    queue_fault(today.home, "hang")
    cli = today.cli(poll_min_s=0.01, poll_max_s=0.04)
    sub = cli.submit(spec=job("smoke-backoff", "exit 0"), cwd=today.workspace)
    with pytest.raises(IrisError, match="still running"):
        cli.wait(job_id=sub.job_id, timeout_s=2)
    assert slept[:3] == [0.01, 0.02, 0.04] and all(s <= 0.04 for s in slept) and len(slept) >= 4


def test_no_secret_reaches_records_or_errors(today: Fake, tmp_path: Path) -> None:
    cli = today.cli()
    spec = kaniko_job(
        KanikoSettings(
            gitsha="abd6dc8", image=IMAGE, docker_user="penfever", docker_token_env="GHCR_TOKEN"
        ),
        build_script(IMAGE).encode(),
    )
    sub = cli.submit(spec=spec, cwd=today.workspace)
    done = cli.wait(job_id=sub.job_id, timeout_s=30)
    assert (
        done.state is JobState.SUCCEEDED
        and SECRET not in done.model_dump_json() + sub.model_dump_json()
    )
    echo = tmp_path / "echo-iris"
    echo.write_text(f'#!/bin/sh\ncase "$*" in *--help*) exec "{today.binary}" "$@";; esac\n'
                    'echo "refused: $*" >&2\nexit 3\n')  # fmt: skip
    echo.chmod(0o755)
    with pytest.raises(IrisError, match=r"failed \(exit 3\)") as refused:
        today.cli(binary=str(echo)).submit(spec=spec, cwd=today.workspace)
    assert SECRET not in str(refused.value) and "-e DOCKER_TOKEN *** --no-wait" in str(
        refused.value
    )
    leaks = [
        p
        for p in files_under(tmp_path)
        if SECRET.encode() in p.read_bytes()
        # the kaniko auth file in the task's /kaniko is the token's place
        and p.name != "config.json"
    ]
    assert leaks == []


def test_a_cli_that_hangs_is_cut_off_by_the_timeout(today: Fake, tmp_path: Path) -> None:
    stuck = tmp_path / "stuck-iris"
    stuck.write_text("#!/bin/sh\nsleep 30\n")  # a child holding the pipes: the group must be killed
    stuck.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(IrisError, match=r"did not answer in 0.3s"):
        today.cli(binary=str(stuck), timeout_s=0.3).capabilities()
    assert time.monotonic() - started < 3


def test_the_wait_gives_up_when_iris_keeps_failing(today: Fake, tmp_path: Path) -> None:
    broken = tmp_path / "broken-iris"
    broken.write_text(f'#!/bin/sh\ncase "$*" in *--help*) exec "{today.binary}" "$@";; esac\n'
                      "echo 'connection refused' >&2\nexit 1\n")  # fmt: skip
    broken.chmod(0o755)
    with pytest.raises(
        IrisError,
        match=r"(?s)failed to answer for job /sandbox/x 3 times in a row.*connection refused",
    ):
        today.cli(binary=str(broken)).wait(job_id="/sandbox/x", timeout_s=20)


def test_the_bundle_is_the_git_working_tree(today: Fake, tmp_path: Path) -> None:
    repo = tmp_path / "consumer"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    (repo / ".gitignore").write_text("*.pyc\n")
    (repo / "tracked.txt").write_text("committed\n")
    subprocess.run([*git, "add", "-A"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "init"], check=True, timeout=30)
    (repo / "tracked.txt").write_text("edited, not committed\n")
    (repo / "new.txt").write_text("untracked\n")
    (repo / "cache.pyc").write_text("ignored\n")
    cli = today.cli()
    sub = cli.submit(spec=job("bundle", "exit 0"), cwd=repo)
    app = job_dir(today.home, sub.job_id) / "app"
    assert sorted(p.name for p in app.iterdir()) == [".gitignore", "new.txt", "tracked.txt"]
    assert (app / "tracked.txt").read_text() == "edited, not committed\n"
    cli.wait(job_id=sub.job_id, timeout_s=20)


def test_the_task_image_hook_unpacks_the_image_for_the_command(today: Fake, tmp_path: Path) -> None:
    hook = [
        sys.executable,
        "-c",
        (
            "import os, pathlib; r = pathlib.Path(os.environ['IMAGE_ROOT']) / 'etc';"
            " r.mkdir(parents=True); (r / 'os-release').write_text('image=' + "
            "os.environ['TASK_IMAGE'])"
        ),
    ]
    binary = install_fake_iris(tmp_path / "world", task_image_hook=hook, state_delay_s=0.02)
    cli = today.cli(binary=str(binary))
    sub = cli.submit(
        spec=job("with-image", 'cat "$IMAGE_ROOT/etc/os-release"'), cwd=today.workspace
    )
    assert cli.wait(job_id=sub.job_id, timeout_s=20).state is JobState.SUCCEEDED
    assert (
        job_dir(today.home, sub.job_id) / "log"
    ).read_text() == "image=docker.io/library/ubuntu:22.04"
