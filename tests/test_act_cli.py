"""The acting commands' contract without a server: arguments refused before anything is asked (exit
2), what is launched (job, run config, who asked), exit codes by the run's outcome (0 ok, 1 refused,
3 failed or unreachable), the `--json` object, `--plan` launching nothing, `--version`, the
exit-code epilog, and a CLI start free of dagster.

The webserver is replaced by a recording stand-in of lockstep/graphql.py's `Webserver` (its GraphQL
is exercised for real in tests/ui/test_browser.py, against `lockstep demo`).
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import lockstep.act_cmd as act
from lockstep.cli import main
from lockstep.graphql import RunEvent, WebserverError

ROOT = Path(__file__).resolve().parents[1]
BUILD = "0123456789abcdef0123456789abcdef01234567"


class FakeWeb:
    """Records launches; plays back one run: these events, then `status`."""

    launched: list[dict[str, Any]]
    events: list[dict[str, Any]]
    status = "SUCCESS"
    refuse_by = False  # answer as a webserver whose job config has no `by`
    unreachable = False
    moves: list[dict[str, Any]]

    def __init__(self, url: str = act.DEFAULT_URL, **_: object) -> None:
        self.url = url.rstrip("/")

    def launch(
        self, *, location: str, job: str, run_config: dict[str, Any], tags: dict[str, str]
    ) -> str:
        if FakeWeb.unreachable:
            raise WebserverError(
                f"the Dagster webserver at {self.url} did not answer (ConnectionError): is it "
                "running?"
            )
        (config,) = (op["config"] for op in run_config["ops"].values())
        if FakeWeb.refuse_by and "by" in config:
            raise WebserverError(
                f'{location}/{job} refused its run config: Received unexpected config entry "by" '
                "at path root"
            )
        FakeWeb.launched.append(
            {"location": location, "job": job, "run_config": run_config, "tags": tags}
        )
        return "run-1"

    def run_events(self, run_id: str, **_: object) -> Iterator[RunEvent | str]:
        yield from (RunEvent(e) for e in FakeWeb.events)
        if FakeWeb.status == "interrupt":
            raise KeyboardInterrupt
        yield FakeWeb.status

    def asset_events(
        self, path: list[str], *, limit: int = 1
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [], FakeWeb.moves


@pytest.fixture(autouse=True)
def web(monkeypatch: pytest.MonkeyPatch) -> type[FakeWeb]:
    FakeWeb.launched, FakeWeb.events, FakeWeb.moves = [], [], []
    FakeWeb.status, FakeWeb.refuse_by, FakeWeb.unreachable = "SUCCESS", False, False
    monkeypatch.setattr(act, "Webserver", FakeWeb)
    monkeypatch.setattr(act.getpass, "getuser", lambda: "dora")
    return FakeWeb


def lockstep(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def failure(*classes: str) -> dict[str, Any]:
    """A step failure event as the webserver gives it:
    Dagster's wrapper around what the op raised."""
    error: dict[str, Any] | None = None
    for name in reversed(classes):
        error = {"className": name, "message": f"{name}: said", "cause": error}
    return {
        "__typename": "ExecutionStepFailureEvent",
        "message": "Execution of step failed.",
        "level": "ERROR",
        "stepKey": "tpu__floating_tag",
        "error": error,
    }


@pytest.mark.parametrize(
    "args, hint",
    [
        (["promote", "--build", "HEAD"], "--build"),
        (["promote", "--build", "abc"], "--build"),  # under 4 hex digits
        (["promote", "--note", "line one\nline two"], "--note"),
        (["promote", "--note", "x" * 501], "--note"),
        (["promote", "--override-freeze"], "--note"),  # a freeze override says why
        (["promote", "--by", "eve\x1b[31m"], "--by"),
        (["promote", "--url", "file:///etc/passwd"], "--url"),
        (["rollback", "--must-contain", "--upload-pack=x"], "--must-contain"),
        (["rollback", "--scope", "everything"], "--scope"),
        (["rollback", "--build", "g123"], "--build"),
        (["rollback", "plan", "--build", "../etc"], "--build"),
        (["hold", "release", "everything"], "{tag|harbor}"),
        (["build", "reject", BUILD], "--reason"),
        (["build", "reject", BUILD, "--reason", "  "], "--reason"),
        (["build", "reject", "-rf", "--reason", "x"], ""),
        (["build", "release", "main"], "BUILD"),
    ],
)
def test_bad_arguments_are_usage_errors_and_nothing_is_launched(
    args: list[str], hint: str, web: type[FakeWeb]
) -> None:
    result = lockstep(*args)
    assert result.exit_code == 2, result.output
    assert hint in result.output and "Traceback" not in result.output
    assert web.launched == []


def test_promote_launches_promote_tpu_with_who_asked_and_exits_0_on_success(
    web: type[FakeWeb],
) -> None:
    web.events = [
        {"__typename": "LogMessageEvent", "message": "promoted by alice", "level": "INFO"},
        {"__typename": "EngineEvent", "message": "engine chatter", "level": "DEBUG"},
    ]
    result = lockstep(
        "promote",
        "--build",
        BUILD[:8],
        "--note",
        "ship it",
        "--by",
        "alice",
        "--url",
        "http://ui:3000/",
    )
    assert result.exit_code == 0, result.output
    (launch,) = web.launched
    assert launch["location"] == "tpu" and launch["job"] == "promote_tpu"
    assert launch["run_config"] == {
        "ops": {
            "tpu__floating_tag": {
                "config": {
                    "action": "promote",
                    "build": BUILD[:8],
                    "note": "ship it",
                    "override_freeze": False,
                    "by": "alice",
                }
            }
        }
    }
    assert launch["tags"] == {"lockstep/by": "alice", "lockstep/cli": "promote"}
    assert "http://ui:3000/runs/run-1" in result.output and "promoted by alice" in result.output
    # the engine's DEBUG lines are not the log a person reads
    assert "engine chatter" not in result.output


def test_without_by_the_login_name_is_recorded(web: type[FakeWeb]) -> None:
    assert lockstep("rollback").exit_code == 0
    assert lockstep("hold", "release", "harbor").exit_code == 0
    assert lockstep("build", "reject", BUILD[:12], "--reason", "OOMs on v5e-8").exit_code == 0
    rollback, harbor, reject = web.launched
    assert rollback["job"] == "rollback_tpu" and rollback["tags"]["lockstep/by"] == "dora"
    assert rollback["run_config"]["ops"]["tpu__floating_tag"]["config"] == {
        "action": "rollback",
        "build": "",
        "must_contain": "",
        "note": "",
        "scope": "auto",
        "by": "dora",
    }
    assert harbor["job"] == "release_harbor_hold"
    assert harbor["run_config"] == {
        "ops": {"tpu__harbor_lock": {"config": {"release_hold": True, "by": "dora"}}}
    }
    assert reject["job"] == "reject_tpu_build" and reject["tags"] == {
        "lockstep/by": "dora",
        "lockstep/cli": "build reject",
    }
    assert reject["run_config"] == {
        "ops": {
            "reject_build": {
                "config": {"build": BUILD[:12], "reason": "OOMs on v5e-8", "by": "dora"}
            }
        }
    }


def test_hold_release_tag_and_build_release_launch_their_jobs(web: type[FakeWeb]) -> None:
    assert lockstep("hold", "release", "tag", "--by", "carol").exit_code == 0
    assert lockstep("build", "release", BUILD, "--by", "carol").exit_code == 0
    tag, release = web.launched
    assert tag["job"] == "release_tpu_hold"
    assert tag["run_config"]["ops"]["tpu__floating_tag"]["config"] == {
        "action": "release_hold",
        "by": "carol",
    }
    assert release["job"] == "release_tpu_build" and release["run_config"] == {
        "ops": {"release_build": {"config": {"build": BUILD, "by": "carol"}}}
    }


@pytest.mark.parametrize(
    "classes, code, outcome",
    [
        (("DagsterExecutionStepExecutionError", "PolicyRefused"), 1, "refused"),
        (("DagsterExecutionStepExecutionError", "AlreadyThere"), 1, "refused"),
        (("HarborHeld",), 1, "refused"),
        (("DagsterExecutionStepExecutionError", "GitError"), 3, "failed"),
        (("DagsterExecutionStepExecutionError", "KeyError"), 3, "failed"),
    ],
)
def test_a_refusal_is_a_negative_answer_and_a_crash_an_operational_error(
    classes: tuple[str, ...], code: int, outcome: str, web: type[FakeWeb]
) -> None:
    web.events, web.status = [failure(*classes)], "FAILURE"
    result = lockstep("promote", "--by", "alice")
    assert result.exit_code == code, result.output
    assert f"FAILURE: {outcome}" in result.output
    # what the op raised, not only "step failed"
    assert f"\n        {classes[-1]}: said\n" in result.output
    shown = json.loads(lockstep("promote", "--by", "alice", "--json").output)
    assert shown["outcome"] == outcome and shown["errors"] == [f"{classes[-1]}: said"]


def test_a_canceled_run_and_an_unreachable_webserver_exit_3(web: type[FakeWeb]) -> None:
    web.status = "CANCELED"
    assert lockstep("rollback", "--by", "bob").exit_code == 3
    web.unreachable = True
    result = lockstep("rollback", "--by", "bob")
    assert (
        result.exit_code == 3
        and "did not answer" in result.output
        and "Traceback" not in result.output
    )


def test_ctrl_c_stops_following_not_the_run(web: type[FakeWeb]) -> None:
    web.status = "interrupt"
    result = lockstep("promote", "--by", "alice")
    assert result.exit_code == 130 and "stopped following; the run goes on: " in result.output
    assert f"{act.DEFAULT_URL}/runs/run-1" in result.output


def test_json_is_one_object_with_the_run_and_its_move(web: type[FakeWeb]) -> None:
    web.events = [
        {"__typename": "LogMessageEvent", "message": "not printed with --json", "level": "INFO"}
    ]
    web.moves = [
        {"runId": "other", "metadata": {"action": "promote"}},
        {
            "runId": "run-1",
            "metadata": {
                "action": "rollback",
                "from_digest": "sha256:b",
                "to_digest": "sha256:a",
                "build": BUILD,
                "hold": True,
                "by": "bob",
                "summary": "long",
            },
        },
    ]
    result = lockstep("rollback", "--by", "bob", "--json")
    assert result.exit_code == 0
    assert json.loads(result.output) == {
        "command": "rollback",
        "job": "rollback_tpu",
        "run_id": "run-1",
        "status": "SUCCESS",
        "url": f"{act.DEFAULT_URL}/runs/run-1",
        "by": "bob",
        "outcome": "ok",
        "errors": [],
        "move": {
            "action": "rollback",
            "from_digest": "sha256:b",
            "to_digest": "sha256:a",
            "build": BUILD,
            "hold": True,
            "by": "bob",
        },
    }


def test_a_webserver_whose_job_takes_no_by_still_gets_it_as_the_tag(web: type[FakeWeb]) -> None:
    web.refuse_by = True
    result = lockstep("promote", "--by", "alice")
    assert result.exit_code == 0, result.output
    (launch,) = web.launched
    assert "by" not in launch["run_config"]["ops"]["tpu__floating_tag"]["config"]
    assert launch["tags"]["lockstep/by"] == "alice" and "run tag lockstep/by" in result.output


@pytest.mark.parametrize("positive, code", [(True, 0), (False, 1)])
def test_plan_reads_the_status_observation_and_launches_nothing(
    positive: bool, code: int, web: type[FakeWeb], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, str]] = []

    def plan_text(w: FakeWeb, *, action: str) -> tuple[str, bool]:
        asked.append((w.url, action))
        return f"{action}: would move :tpu to build 01234567", positive

    monkeypatch.setitem(
        sys.modules, "lockstep.status_cmd", types.SimpleNamespace(plan_text=plan_text)
    )
    result = lockstep("promote", "--plan", "--url", "http://ui:3000")
    assert (
        result.exit_code == code
        and "would move :tpu" in result.output
        and "nothing was changed" in result.output
    )
    shown = lockstep("rollback", "--plan", "--json")
    assert shown.exit_code == code and json.loads(shown.output) == {
        "action": "rollback",
        "plan": True,
        "ok": positive,
        "text": "rollback: would move :tpu to build 01234567",
        "source": f"the status observation on {act.DEFAULT_URL}",
    }
    assert asked == [("http://ui:3000", "promote"), (act.DEFAULT_URL, "rollback")]
    assert web.launched == []


def test_a_plan_with_selectors_needs_the_instance_and_says_so(
    web: type[FakeWeb], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("LOCKSTEP_SITE", str(tmp_path / "site.toml"))
    result = lockstep("rollback", "--plan", "--scope", "image")
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert web.launched == []


def test_version_and_the_exit_codes_in_the_help() -> None:
    result = lockstep("--version")
    assert (
        result.exit_code == 0
        and result.output == f"lockstep {importlib.metadata.version('lockstep')}\n"
    )
    shown = " ".join(lockstep("--help").output.split())
    assert "Exit codes: 0 ok; 1 a negative answer" in shown and "3 an operational error" in shown
    for command in ("promote", "rollback", "hold", "build"):
        assert f"\n  {command} " in lockstep("--help").output


def test_an_operational_error_exits_3_and_a_missing_image_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lockstep import cli

    monkeypatch.setenv("LOCKSTEP_SITE", str(tmp_path / "absent.toml"))
    broken = lockstep("changelog", "abcd", "abce")
    assert broken.exit_code == 3 and "absent.toml" in broken.output

    class NoTag:
        def resolve(self, **_: str) -> None:
            return None

        def absence(self, **_: str) -> str:
            return "manifest unknown"

    monkeypatch.setattr(cli, "_registry_and_ref", lambda ref: (NoTag(), cli._image_ref(ref), None))
    missing = lockstep("image", "digest", "127.0.0.1:5000/tpu:nope")
    assert missing.exit_code == 1 and "not in the registry (manifest unknown)" in missing.output
    shown = lockstep("image", "digest", "--json", "127.0.0.1:5000/tpu:nope")
    assert shown.exit_code == 1 and json.loads(shown.output) == {
        "ref": "127.0.0.1:5000/tpu:nope",
        "digest": None,
        "absent": "manifest unknown",
    }


def test_the_command_line_starts_without_dagster() -> None:
    code = (
        "import sys, lockstep.cli, lockstep.act_cmd; print(sorted(m for m in sys.modules if "
        "m.split('.')[0] == 'dagster'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
