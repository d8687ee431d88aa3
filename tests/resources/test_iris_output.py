"""iris answers lockstep cannot read are refused
naming the field (JSON path or line) and the value."""

from __future__ import annotations

import pytest

from resources.iris.cli import IrisCli
from resources.iris.output import IrisUnreadable, JobState, parse_state_json, parse_state_text

STATE = (
    "Job: /u/j (j)\nState: {state}  exit={exit}  failures={failures}  preemptions=0\nTasks: "
    "0/1 completed\n"
)


@pytest.mark.parametrize(("fields", "said"), [
    ({"state": "failed", "exit": "abc", "failures": "1"}, "exit='abc'"),
    ({"state": "failed", "exit": "3", "failures": "-1"}, "failures='-1'"),
    ({"state": "exploded", "exit": "0", "failures": "0"}, "unknown state 'exploded'"),
])  # fmt: skip
def test_a_garbled_state_line_names_the_line_and_the_value(
    fields: dict[str, str], said: str
) -> None:
    with pytest.raises(IrisUnreadable) as info:
        parse_state_text(STATE.format(**fields), job_id="/u/j")
    assert said in str(info.value) and "line 2" in str(info.value) and "/u/j" in str(info.value)


@pytest.mark.parametrize(("data", "said"), [
    ({"state": "running", "exit_code": "abc"}, "$.exit_code 'abc'"),  # refused while running too
    ({"state": "failed", "exit_code": True}, "$.exit_code True"),
    ({"state": "failed", "failure_count": "two"}, "$.failure_count 'two'"),
    ({"state": "failed", "tasks": [{"index": 0, "exit_code": "x"}]}, "$.tasks[0].exit_code 'x'"),
    ({"state": "failed", "tasks": "none"}, "$.tasks 'none'"),
    ({"state": 3}, "unknown state 3"),
    ({"state": "JOB_STATE_EXPLODED"}, "unknown state 'JOB_STATE_EXPLODED'"),
])  # fmt: skip
def test_a_json_field_of_the_wrong_type_names_its_path_and_value(
    data: dict[str, object], said: str
) -> None:
    with pytest.raises(IrisUnreadable) as info:
        parse_state_json(data, job_id="/u/j")
    assert said in str(info.value)


def test_wait_reports_an_unknown_state_at_once_not_as_a_vanished_or_silent_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polls: list[str] = []

    def describe(self: IrisCli, *, job_id: str) -> None:
        polls.append(job_id)
        JobState.parse("exploded")

    monkeypatch.setattr(IrisCli, "describe", describe)
    cli = IrisCli(cluster="c", user="u", poll_min_s=0.01, poll_max_s=0.01, vanish_after=3)
    with pytest.raises(IrisUnreadable, match="unknown state 'exploded'"):
        cli.wait(job_id="/u/j", timeout_s=60)
    assert polls == ["/u/j"]
