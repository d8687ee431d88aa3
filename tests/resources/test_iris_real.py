"""IrisCli against the REAL iris: the `marin-iris` CLI from PyPI (0.2.20.dev202606180959, the newest
this machine's index serves, 2026-06-18) and its own local controller (`iris --config=local.yaml
cluster start --local`: a real controller with in-process workers that run a job's command as a
process; no Docker). ./dev setup installs it into .tools/iris (deploy/iris-requirements.txt).

- Its own parser decides whether lockstep's command line is acceptable: this binary predates
  `--no-sync` (2026-06-24), so lockstep refuses before running anything, and the real CLI itself
  exits 2 on that option.
- Its controller, on today's clock, refuses a 2026-06-18 client ("client is too old"): lockstep
  names that. To drive jobs anyway, the client is started with a `sitecustomize` that sets the build
  date it reports (``iris._build_info.BUILD_DATE``) to today — the one change made to the real tool,
  made for the freshness gate only (libfaketime cannot be used: it fakes CLOCK_MONOTONIC as well,
  and Python's timed waits never return under it, so the controller never schedules anything).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from resources.iris.capabilities import ClientTooOld, MissingCapability
from resources.iris.cli import IrisCli, JobSpec
from resources.iris.output import JobState
from tests.support.servers import log_tail, stop_process, wait_until_ready

pytestmark = pytest.mark.heavy(150)  # seconds, about: the order parallel workers take modules in

ROOT = Path(__file__).resolve().parents[2]
REAL_IRIS = ROOT / ".tools" / "iris" / "bin" / "iris"
LOCAL_YAML = (
    ROOT
    / ".tools"
    / "iris"
    / "lib"
    / "python3.11"
    / "site-packages"
    / "iris"
    / "config"
    / "local.yaml"
)
SECRET = "ghp_realIrisContractTokenValue0123456789"
FRESH_CLIENT = """\
# Test-only: the client reports today's build date, so the controller's 14-day freshness gate lets it in.
import datetime, os

if os.environ.get("LOCKSTEP_TEST_FRESH_IRIS_CLIENT"):
    import iris._build_info as build_info
    build_info.BUILD_DATE = datetime.date.today().isoformat()
"""  # noqa: E501


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    url: str
    home: Path
    fresh_client: Path  # a wrapper: the real iris with the fresh build date


def _binary() -> Path:
    if not REAL_IRIS.exists():
        pytest.fail(
            f"{REAL_IRIS} is missing: run ./dev setup (it installs the real marin-iris CLI there)"
        )
    return REAL_IRIS


def _env(home: Path) -> dict[str, str]:
    # Its own HOME: `cluster start --local` writes ~/.iris/tokens.sqlite.
    return {**os.environ, "HOME": str(home), "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    binary = _binary()
    home = tmp_path_factory.mktemp("real-iris")
    (home / "local.yaml").write_text(LOCAL_YAML.read_text())
    log = home / "controller.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary), "--config=local.yaml", "cluster", "start", "--local"],
            cwd=home,
            env=_env(home),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # its Ctrl-C path stops the workers and cleans up
        stop_process(proc, grace_s=30, group=True, sigterm=False)

    wait_until_ready(
        proc,
        lambda: "Controller started at" in log_tail(log, 100_000),
        timeout_s=120,
        interval_s=0.2,
        log=log,
        tail_chars=3000,
        stop=stop,
        message=lambda code, tail: f"the real iris controller did not start (exit {code}):\n{tail}",
    )
    url = re.search(r"Controller started at (http://[0-9.:]+)", log.read_text()).group(1)  # type: ignore[union-attr]
    shim = home / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(FRESH_CLIENT)
    fresh = home / "iris-fresh-client"
    fresh.write_text(
        f'#!/bin/sh\nPYTHONPATH="{shim}" LOCKSTEP_TEST_FRESH_IRIS_CLIENT=1 exec "{binary}" "$@"\n'
    )
    fresh.chmod(0o755)
    try:
        yield Controller(proc=proc, url=url, home=home, fresh_client=fresh)
    finally:
        stop()


def cli(binary: Path, url: str, **more: object) -> IrisCli:
    return IrisCli(
        binary=str(binary),
        controller_url=url,
        user="lockstep-test",
        timeout_s=120,
        poll_min_s=1,
        poll_max_s=3,
        redact_env=["LOCKSTEP_TEST_IRIS_TOKEN"],
        **more,
    )  # type: ignore[arg-type]


def command_job(name: str, script: str, **more: object) -> JobSpec:
    # no_sync=False: this binary has no --no-sync (and its local workers never run the sync anyway).
    return JobSpec(
        name=name,
        task_image="docker.io/library/ubuntu:22.04",
        cpu=1,
        memory="1GB",
        disk="5GB",
        timeout_s=300,
        no_sync=False,
        command=["bash", "-c", script],
        **more,
    )


def test_the_real_binary_is_read_as_the_2026_06_generation() -> None:
    caps = cli(_binary(), "http://127.0.0.1:1").capabilities()
    assert (caps.state_command, caps.cancel_command, caps.summary_json) == ("summary", "kill", True)
    assert caps.contract == "2026-04..07 (summary --json, kill)" and not caps.kill_exact
    assert {
        "--task-image",
        "--user",
        "--no-preemptible",
        "--enable-extra-resources",
    } <= caps.run_options
    assert "--no-sync" not in caps.run_options


def test_no_sync_is_refused_by_lockstep_before_the_real_parser_would(tmp_path: Path) -> None:
    iris = cli(_binary(), "http://127.0.0.1:1")
    spec = command_job("never", "exit 0").model_copy(update={"no_sync": True})
    with pytest.raises(
        MissingCapability,
        match=r"has no --no-sync for `job run` \(--no-sync arrived in iris on 2026-06-24",
    ):
        iris.submit(spec=spec, cwd=tmp_path)
    # The real parser on lockstep's own argv: exit 2 on --no-sync, as lockstep predicted.
    real = subprocess.run(
        iris.argv(spec),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
        check=False,
    )
    assert real.returncode == 2 and "Unknown option '--no-sync'" in real.stderr


def test_a_controller_that_refuses_an_old_client_is_named(
    controller: Controller, tmp_path: Path
) -> None:
    with pytest.raises(
        ClientTooOld,
        match=r"marin-iris client is too old \(build 2026-06-18; minimum .*upgrade marin-iris",
    ):
        cli(_binary(), controller.url).submit(spec=command_job("too-old", "exit 0"), cwd=tmp_path)


def test_jobs_on_the_real_controller(
    controller: Controller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submit with lockstep's argv (the real parser accepts all of it), poll `summary --json` to the
    end, read the log by time window, find a leaked value, and kill a running job exactly."""
    monkeypatch.setenv("LOCKSTEP_TEST_IRIS_TOKEN", SECRET)
    iris = cli(controller.fresh_client, controller.url)
    failing = command_job(
        "fails",
        'echo building; echo "+ : $LOCKSTEP_TOKEN"; echo oops >&2; exit 3',
        env={"LOCKSTEP_TOKEN": SECRET},
        preemptible=False,
    )
    sub = iris.submit(spec=failing, cwd=tmp_path)
    assert sub.job_id == "/lockstep-test/fails" and sub.listed is not None
    long = iris.submit(
        spec=command_job("runs-long", "for i in $(seq 1 300); do echo tick $i; sleep 1; done"),
        cwd=tmp_path,
    )

    done = iris.wait(job_id=sub.job_id, timeout_s=180, submission=sub)
    # This controller leaves the job's exit at 0 and
    # puts the code on the task: lockstep reads it there.
    assert (done.state, done.exit_code) == (JobState.FAILED, 3)
    assert done.error == "Exit code: 3. stderr: oops"  # this controller appends the task's stderr
    log = iris.logs(job_id=sub.job_id, since_ms=sub.submitted_ms)
    text = "\n".join(log.tail)
    assert "| building" in text and "| oops" in text
    assert log.leaked == ["LOCKSTEP_TEST_IRIS_TOKEN"] and SECRET not in text  # named, never shown

    iris.cancel(job_id=long.job_id)
    assert iris.wait(job_id=long.job_id, timeout_s=120).state is JobState.KILLED
