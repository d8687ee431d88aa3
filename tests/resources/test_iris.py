"""IrisCli: the runbook's command line, state polling (never logs), kill; driven against the sandbox's fake iris."""

from __future__ import annotations

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

from resources import iris as iris_module
from resources.iris import IrisCli, IrisError, JobSpec, JobState, parse_job_id, parse_job_status
from resources.kaniko import KanikoSettings, build_destination, kaniko_job
from sandbox.consumer_source import BUILD_SCRIPT
from sandbox.fake_iris import install_fake_iris, job_dir, queue_fault, stop_all

SECRET = "ghp_irisTestTokenValue0123456789abcdef"
IMAGE = "127.0.0.1:5000/open-thoughts/openthoughts-agent"

# Stands in for kaniko: checks what a build job gets, "pushes" by writing a file, and is careless
# with the token on purpose, so the fake's log masking is exercised.
BUILDER = """
import json, os, pathlib
app = pathlib.Path(os.environ["APP_DIR"])
assert (app / "docker" / "Dockerfile.tpu").is_file(), "the bundle has no docker/Dockerfile.tpu"
token = os.environ["DOCKER_TOKEN"]
print("pushing", os.environ["IMAGE"] + ":tpu-" + os.environ["GITSHA"], "with token", token, flush=True)
pathlib.Path("pushed.json").write_text(json.dumps({
    "destination": os.environ["IMAGE"] + ":tpu-" + os.environ["GITSHA"],
    "user": os.environ["DOCKER_USER_ID"],
    "token_length": len(token),
    "inherited_ghcr_token": "GHCR_TOKEN" in os.environ,
}))
"""


class Fake(BaseModel):
    binary: Path
    home: Path
    workspace: Path

    def cli(self, **overrides: object) -> IrisCli:
        fields: dict[str, object] = {
            "binary": str(self.binary), "cluster": "sandbox", "timeout_s": 20, "poll_min_s": 0.02,
            "poll_max_s": 0.1, "vanish_after": 3, "redact_env": ["GHCR_TOKEN"],
        }  # fmt: skip
        return IrisCli(**{**fields, **overrides})


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    binary = install_fake_iris(tmp_path / "world", builder=[sys.executable, "-c", BUILDER], state_delay_s=0.02)
    workspace = tmp_path / "workspace"
    (workspace / "docker").mkdir(parents=True)
    (workspace / "docker" / "Dockerfile.tpu").write_text("FROM python:3.12-slim\n")
    (workspace / "docker" / "build_tpu_kaniko.sh").write_text(BUILD_SCRIPT)
    home = tmp_path / "world" / "iris"
    yield Fake(binary=binary, home=home, workspace=workspace)
    stop_all(home)  # no hung worker outlives its test


def job(name: str, script: str, **more: object) -> JobSpec:
    return JobSpec(name=name, task_image="docker.io/library/ubuntu:22.04", cpu=1, memory="1GB", disk="5GB",
                   timeout_s=60, command=["bash", "-lc", script], **more)  # fmt: skip


def build_settings(**overrides: object) -> KanikoSettings:
    values: dict[str, object] = {
        "gitsha": "abd6dc86", "image": IMAGE, "docker_user": "penfever", "docker_token_env": "GHCR_TOKEN",
    }  # fmt: skip
    return KanikoSettings(**{**values, **overrides})


def files_under(root: Path) -> Iterator[Path]:
    return (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# ---- pure: states, the real CLI's JSON shapes, the command line -------------------------------


@pytest.mark.parametrize(
    ("spelling", "state"),
    [("JOB_STATE_SUCCEEDED", JobState.SUCCEEDED), ("Succeeded", JobState.SUCCEEDED), ("succeeded", JobState.SUCCEEDED),
     ("JOB_STATE_WORKER_FAILED", JobState.WORKER_FAILED), ("worker-failed", JobState.WORKER_FAILED),
     (" Running ", JobState.RUNNING), ("JOB_STATE_UNSPECIFIED", JobState.PENDING), ("", JobState.PENDING)],
)  # fmt: skip
def test_states_are_read_however_iris_spells_them(spelling: str, state: JobState) -> None:
    assert JobState.parse(spelling) is state


def test_unknown_state_is_an_error_not_a_guess() -> None:
    with pytest.raises(IrisError, match="'JOB_STATE_EXPLODED'"):
        JobState.parse("JOB_STATE_EXPLODED")


def test_real_summary_json_shape() -> None:
    # `iris job summary ID --json` (build_job_summary): friendly state, exit_code an int even while running.
    running = {"job_id": "/benjaminfeuer/tpu-kaniko-abd6dc86", "name": "/benjaminfeuer/tpu-kaniko-abd6dc86",
               "state": "running", "exit_code": 0, "error": "", "tasks": [{"state": "running", "exit_code": None}]}  # fmt: skip
    now = parse_job_status(running, job_id="/benjaminfeuer/tpu-kaniko-abd6dc86")
    assert (now.state, now.exit_code, now.error) == (JobState.RUNNING, None, None)
    failed = parse_job_status({**running, "state": "failed", "exit_code": 3, "error": f"push denied for {SECRET}"},
                              job_id="x", secrets=[SECRET])  # fmt: skip
    assert (failed.state, failed.exit_code, failed.error) == (JobState.FAILED, 3, "push denied for ***")


def test_real_list_entry_shape() -> None:
    # `iris job list --json`: MessageToDict of JobStatus; defaults omitted, enum names, epoch_ms strings.
    done = parse_job_status({"job_id": "/u/j", "state": "JOB_STATE_SUCCEEDED", "finished_at": {"epoch_ms": "1783500000000"}},
                            job_id="/u/j")  # fmt: skip
    assert (done.state, done.exit_code, done.finished_at) == (JobState.SUCCEEDED, 0, "2026-07-08T08:40:00+00:00")
    camel = parse_job_status({"jobId": "/u/j", "state": "JOB_STATE_FAILED", "exitCode": 137, "finishedAt": {"epochMs": "0"}},
                             job_id="/u/j")  # fmt: skip
    assert (camel.state, camel.exit_code, camel.finished_at) == (JobState.FAILED, 137, None)
    killed = parse_job_status({"job_id": "/u/j", "state": "JOB_STATE_KILLED", "exit_code": 0}, job_id="/u/j")
    assert killed.exit_code is None  # a proto default, not a clean exit


def test_job_id_is_read_from_what_job_run_prints() -> None:
    out = "INFO Submitting job: tpu-kaniko-abd6dc86\n/benjaminfeuer/tpu-kaniko-abd6dc86\n"
    assert parse_job_id(out, name="tpu-kaniko-abd6dc86") == "/benjaminfeuer/tpu-kaniko-abd6dc86"
    assert parse_job_id("Job submitted: /u/other-name\n", name="tpu-kaniko-abd6dc86") == "/u/other-name"
    assert parse_job_id("nothing useful\n", name="tpu-kaniko-abd6dc86") is None


def test_argv_is_exactly_the_runbook_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    spec = JobSpec(name="tpu-kaniko-abd6dc86", task_image="docker.io/library/ubuntu:22.04",
                   env={"DOCKER_USER_ID": "penfever", "BUILD_B64": "ZWNobyBoaQ==", "GITSHA": "abd6dc86"},
                   secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"},
                   command=["bash", "-lc", 'echo "$BUILD_B64" | base64 -d > /tmp/build.sh && exec bash /tmp/build.sh'])  # fmt: skip
    cli = IrisCli(binary="/opt/otagent/bin/iris", cluster="cw-us-east-02a")
    assert cli.argv(spec) == [
        "/opt/otagent/bin/iris", "--cluster=cw-us-east-02a", "job", "run",
        "--task-image", "docker.io/library/ubuntu:22.04", "--no-sync", "--enable-extra-resources",
        "--cpu", "16", "--memory", "64GB", "--disk", "120GB",
        "--job-name", "tpu-kaniko-abd6dc86", "--max-retries", "0", "--timeout", "10800",
        "-e", "DOCKER_USER_ID", "penfever", "-e", "BUILD_B64", "ZWNobyBoaQ==", "-e", "GITSHA", "abd6dc86",
        "-e", "DOCKER_TOKEN", SECRET,
        "--no-wait", "--", "bash", "-lc", 'echo "$BUILD_B64" | base64 -d > /tmp/build.sh && exec bash /tmp/build.sh',
    ]  # fmt: skip
    redacted = cli.redacted_argv(spec)
    assert redacted == ["***" if a == SECRET else a for a in cli.argv(spec)]
    assert SECRET not in cli.command_line(spec)
    assert "-e DOCKER_TOKEN '***'" in cli.command_line(spec)


def test_secret_also_masked_where_a_caller_put_it_by_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    spec = job("leaky", f"echo {SECRET}", secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"})
    assert SECRET not in IrisCli(cluster="c").command_line(spec)


@pytest.mark.parametrize("value", [None, ""])
def test_missing_secret_names_the_variable_never_a_value(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("GHCR_TOKEN", raising=False)
    else:
        monkeypatch.setenv("GHCR_TOKEN", value)
    spec = job("needs-token", "exit 0", secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"})
    cli = IrisCli(cluster="c")
    with pytest.raises(IrisError, match=r"-e DOCKER_TOKEN comes from environment variable GHCR_TOKEN, which is not set"):
        cli.argv(spec)
    with pytest.raises(IrisError, match="GHCR_TOKEN"):
        cli.submit(spec=spec, cwd=Path.cwd())
    redacted = cli.redacted_argv(spec)  # still loggable
    assert redacted[redacted.index("DOCKER_TOKEN") + 1] == "***"


def test_poll_bounds_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="poll_min_s"):
        IrisCli(cluster="c", poll_min_s=10, poll_max_s=1)


# ---- against the fake iris --------------------------------------------------------------------


def test_command_job_succeeds_with_its_state_not_its_log(fake: Fake) -> None:
    cli = fake.cli()
    job_id = cli.submit(spec=job("smoke-ok", 'echo "ran on $TASK_IMAGE"; exit 0'), cwd=fake.workspace)
    assert job_id == "/sandbox/smoke-ok"
    done = cli.wait(job_id=job_id, timeout_s=20)
    assert (done.state, done.exit_code, done.error) == (JobState.SUCCEEDED, 0, None)
    assert done.finished_at is not None
    assert "ran on docker.io/library/ubuntu:22.04" in (job_dir(fake.home, job_id) / "log").read_text()


def test_failure_carries_the_real_exit_code(fake: Fake) -> None:
    cli = fake.cli()
    done = cli.wait(job_id=cli.submit(spec=job("smoke-bad", "exit 7"), cwd=fake.workspace), timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.FAILED, 7)


def test_kaniko_build_runs_the_builder_on_the_bundle(fake: Fake) -> None:
    cli = fake.cli()
    settings = build_settings()
    spec = kaniko_job(settings, (fake.workspace / "docker" / "build_tpu_kaniko.sh").read_bytes())
    job_id = cli.submit(spec=spec, cwd=fake.workspace)
    assert job_id == "/sandbox/tpu-kaniko-abd6dc86"
    done = cli.wait(job_id=job_id, timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0), (job_dir(fake.home, job_id) / "log").read_text()
    pushed = json.loads((job_dir(fake.home, job_id) / "pushed.json").read_text())
    assert pushed == {"destination": build_destination(settings), "user": "penfever", "token_length": len(SECRET),
                      "inherited_ghcr_token": False}  # fmt: skip
    log = (job_dir(fake.home, job_id) / "log").read_text()
    assert "with token ***" in log and SECRET not in log


def test_build_without_gitsha_dies_like_the_script(fake: Fake) -> None:
    spec = kaniko_job(build_settings(), BUILD_SCRIPT.encode())
    spec = spec.model_copy(update={"env": {k: v for k, v in spec.env.items() if k != "GITSHA"}})
    cli = fake.cli()
    done = cli.wait(job_id=cli.submit(spec=spec, cwd=fake.workspace), timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.FAILED, 1)
    jd = job_dir(fake.home, "/sandbox/tpu-kaniko-abd6dc86")
    assert "GITSHA: GITSHA is required" in (jd / "log").read_text()
    assert not (jd / "pushed.json").exists()  # the builder never ran


def test_hang_times_out_naming_the_state_then_kill(fake: Fake) -> None:
    queue_fault(fake.home, "hang")
    cli = fake.cli()
    job_id = cli.submit(spec=job("smoke-hang", "exit 0"), cwd=fake.workspace)
    started = time.monotonic()
    with pytest.raises(IrisError, match=r"still running after 0.4s .* NOT killed.*job kill /sandbox/smoke-hang"):
        cli.wait(job_id=job_id, timeout_s=0.4)
    assert time.monotonic() - started < 2
    worker = json.loads((job_dir(fake.home, job_id) / "state.json").read_text())["worker_pgid"]
    cli.kill(job_id=job_id)
    done = cli.wait(job_id=job_id, timeout_s=5)
    assert done.state is JobState.KILLED and done.exit_code is None
    assert gone(worker)  # the worker and its process group, not just the record


def gone(pgid: int, within_s: float = 3.0) -> bool:
    """True once no live process is left in the group (a zombie awaiting its reaper counts as dead)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
                if int(fields[2]) == pgid and fields[0] != "Z":
                    live.append(stat.parent.name)
        if not live:
            return True
        time.sleep(0.02)
    return False


def test_kill_ends_a_running_command_and_everything_it_started(fake: Fake) -> None:
    cli = fake.cli()
    job_id = cli.submit(spec=job("smoke-sleep", "sleep 30 & sleep 30; wait"), cwd=fake.workspace)
    with pytest.raises(IrisError, match="still running"):
        cli.wait(job_id=job_id, timeout_s=0.3)
    worker = json.loads((job_dir(fake.home, job_id) / "state.json").read_text())["worker_pgid"]
    cli.kill(job_id=job_id)
    assert cli.wait(job_id=job_id, timeout_s=5).state is JobState.KILLED
    assert gone(worker)
    cli.kill(job_id=job_id)  # killing a finished job is not an error


def test_worker_that_dies_mid_job_is_worker_failed(fake: Fake) -> None:
    queue_fault(fake.home, "hang")
    cli = fake.cli()
    job_id = cli.submit(spec=job("smoke-crash", "exit 0"), cwd=fake.workspace)
    with pytest.raises(IrisError, match="still running"):
        cli.wait(job_id=job_id, timeout_s=0.2)
    os.killpg(json.loads((job_dir(fake.home, job_id) / "state.json").read_text())["worker_pgid"], signal.SIGKILL)
    done = cli.wait(job_id=job_id, timeout_s=5)
    assert done.state is JobState.WORKER_FAILED and "worker process died" in (done.error or "")


def test_vanished_job_is_an_error(fake: Fake) -> None:
    queue_fault(fake.home, "vanish")
    cli = fake.cli()
    job_id = cli.submit(spec=job("smoke-vanish", "exit 0"), cwd=fake.workspace)
    with pytest.raises(IrisError, match=r"vanished: iris did not know it in 3 consecutive polls"):
        cli.wait(job_id=job_id, timeout_s=20)
    assert cli.summary(job_id=job_id) is None


def test_oom_reap_is_killed_with_no_last_line(fake: Fake) -> None:
    queue_fault(fake.home, "oom")
    cli = fake.cli()
    job_id = cli.submit(spec=job("smoke-oom", "echo never printed"), cwd=fake.workspace)
    done = cli.wait(job_id=job_id, timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.KILLED, 137)
    assert (job_dir(fake.home, job_id) / "log").read_text() == ""  # only the state says what happened


def test_unschedulable_is_terminal(fake: Fake) -> None:
    queue_fault(fake.home, "ok")  # the queue is consumed one entry per job, in order
    queue_fault(fake.home, "unschedulable")
    cli = fake.cli()
    first = cli.wait(job_id=cli.submit(spec=job("first", "exit 0"), cwd=fake.workspace), timeout_s=20)
    second = cli.wait(job_id=cli.submit(spec=job("second", "exit 0"), cwd=fake.workspace), timeout_s=20)
    assert first.state is JobState.SUCCEEDED
    assert (second.state, second.exit_code) == (JobState.UNSCHEDULABLE, None)
    assert "no worker can fit" in (second.error or "")


def test_injected_failure(fake: Fake) -> None:
    queue_fault(fake.home, "fail")
    cli = fake.cli()
    done = cli.wait(job_id=cli.submit(spec=job("smoke-fail", "exit 0"), cwd=fake.workspace), timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.FAILED, 1)


def test_wait_backs_off_between_the_bounds(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(iris_module, "_sleep", sleep)
    queue_fault(fake.home, "hang")
    cli = fake.cli(poll_min_s=0.01, poll_max_s=0.04)
    job_id = cli.submit(spec=job("smoke-backoff", "exit 0"), cwd=fake.workspace)
    with pytest.raises(IrisError, match="still running"):
        cli.wait(job_id=job_id, timeout_s=0.8)
    assert slept[:3] == [0.01, 0.02, 0.04]
    assert all(s <= 0.04 for s in slept) and len(slept) >= 4


def test_secret_never_reaches_records_logs_or_errors(fake: Fake, tmp_path: Path) -> None:
    cli = fake.cli()
    spec = kaniko_job(build_settings(), BUILD_SCRIPT.encode())
    job_id = cli.submit(spec=spec, cwd=fake.workspace)
    done = cli.wait(job_id=job_id, timeout_s=20)
    assert done.state is JobState.SUCCEEDED and SECRET not in done.model_dump_json()
    # A second submit of a running name, and a CLI that echoes its argv back when it fails.
    queue_fault(fake.home, "hang")
    hung = cli.submit(spec=job("smoke-hang", "exit 0", secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"}), cwd=fake.workspace)
    with pytest.raises(IrisError, match="already exists and is") as twice:
        cli.submit(spec=job("smoke-hang", "exit 0", secret_env={"DOCKER_TOKEN": "GHCR_TOKEN"}), cwd=fake.workspace)
    cli.kill(job_id=hung)
    echo = tmp_path / "echo-iris"
    echo.write_text('#!/bin/sh\necho "refused: $*" >&2\nexit 3\n')
    echo.chmod(0o755)
    with pytest.raises(IrisError, match=r"failed \(exit 3\)") as refused:
        fake.cli(binary=str(echo)).submit(spec=spec, cwd=fake.workspace)
    for err in (twice.value, refused.value):
        assert SECRET not in str(err)
    assert "-e DOCKER_TOKEN *** --no-wait" in str(refused.value)
    leaks = [p for p in files_under(tmp_path) if SECRET.encode() in p.read_bytes()]
    assert leaks == []


def test_summary_of_an_unknown_job_is_none(fake: Fake) -> None:
    assert fake.cli().summary(job_id="/sandbox/never-submitted") is None


def test_summary_falls_back_to_list_on_an_older_iris(fake: Fake, tmp_path: Path) -> None:
    old = tmp_path / "old-iris"
    old.write_text(f'#!/bin/sh\nif [ "$2 $3" = "job summary" ]; then echo "Error: No such command \'summary\'." >&2; exit 2; fi\n'
                   f'exec {fake.binary} "$@"\n')  # fmt: skip
    old.chmod(0o755)
    cli = fake.cli(binary=str(old))
    done = cli.wait(job_id=cli.submit(spec=job("smoke-old", "exit 5"), cwd=fake.workspace), timeout_s=20)
    assert (done.state, done.exit_code) == (JobState.FAILED, 5) and done.finished_at is not None


def test_a_cli_that_hangs_is_cut_off_by_the_timeout(fake: Fake, tmp_path: Path) -> None:
    stuck = tmp_path / "stuck-iris"
    stuck.write_text("#!/bin/sh\nsleep 30\n")  # a child holding the pipes: the group must be killed
    stuck.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(IrisError, match=r"did not answer in 0.3s"):
        fake.cli(binary=str(stuck), timeout_s=0.3).kill(job_id="/sandbox/x")
    assert time.monotonic() - started < 3


def test_wait_gives_up_when_iris_keeps_failing(fake: Fake, tmp_path: Path) -> None:
    broken = tmp_path / "broken-iris"
    broken.write_text("#!/bin/sh\necho 'connection refused' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(IrisError, match="failed to answer for job /sandbox/x 3 times in a row.*connection refused"):
        fake.cli(binary=str(broken)).wait(job_id="/sandbox/x", timeout_s=20)


def test_bundle_is_the_git_working_tree(fake: Fake, tmp_path: Path) -> None:
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
    cli = fake.cli()
    job_id = cli.submit(spec=job("bundle", "exit 0"), cwd=repo)
    app = job_dir(fake.home, job_id) / "app"
    assert sorted(p.name for p in app.iterdir()) == [".gitignore", "new.txt", "tracked.txt"]
    assert (app / "tracked.txt").read_text() == "edited, not committed\n"
    cli.wait(job_id=job_id, timeout_s=20)


def test_task_image_hook_unpacks_the_image_for_the_command(fake: Fake, tmp_path: Path) -> None:
    hook = [sys.executable, "-c", "import os, pathlib; r = pathlib.Path(os.environ['IMAGE_ROOT']) / 'etc';"
            " r.mkdir(parents=True); (r / 'os-release').write_text('image=' + os.environ['TASK_IMAGE'])"]  # fmt: skip
    binary = install_fake_iris(tmp_path / "world", task_image_hook=hook, state_delay_s=0.02)
    cli = fake.cli(binary=str(binary))
    job_id = cli.submit(spec=job("with-image", 'cat "$IMAGE_ROOT/etc/os-release"'), cwd=fake.workspace)
    assert cli.wait(job_id=job_id, timeout_s=20).state is JobState.SUCCEEDED
    assert (job_dir(fake.home, job_id) / "log").read_text() == "image=docker.io/library/ubuntu:22.04"
