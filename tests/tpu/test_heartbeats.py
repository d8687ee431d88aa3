"""Issue 26's "Done when" for progress: a long sandbox build writes heartbeats into its run's log,
and the iris job ids are on the assets from the moment they are submitted, not only at the end.

The build is the sandbox's real one (the fake iris running the consumer's kaniko script), slowed by
a loop of progress lines in that script; [timeouts]
heartbeat_s = 1 so a few seconds of it are "long".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from resources.heartbeat import TAIL_MARK
from sandbox.world import SANDBOX_TOKEN_VALUE, advance_harbor
from tests.support.runs import Pipeline, failure_message
from tpu_assets.keys import IMAGE, SMOKE

pytestmark = pytest.mark.heavy(75)  # seconds, about (both tests)

STEPS = 4  # one a second: the job runs at least this long, so several 1 s heartbeats fall inside it


def slow_script(*, echo_token: bool = False) -> Callable[[Path], None]:
    """An edit of the consumer's build script: STEPS progress lines a second apart before kaniko
    runs, untraced (the pre-flight refuses a traced token).
    With `echo_token` each line prints the push token,
    and the script ends there (exit 1): the leak, not the image, is what that test is about."""

    def edit(wt: Path) -> None:
        script = wt / "docker" / "build_tpu_kaniko.sh"
        said = " as ${DOCKER_TOKEN}" if echo_token else ""
        loop = (
            f'{{ set +x; }} 2>/dev/null\nfor i in $(seq 1 {STEPS}); do echo "pushing layer '
            f'$i/{STEPS}{said}"; '
            f"sleep 1; done\nset -x\n{'exit 1' if echo_token else 'exec /kaniko/executor'}"
        )
        script.write_text(script.read_text().replace("exec /kaniko/executor", loop, 1))

    return edit


def run_log(p: Pipeline, result: dg.ExecuteInProcessResult) -> list[dg.EventLogEntry]:
    """The run's events as the instance stored them (what the UI's run page reads)."""
    return list(p.instance.all_logs(result.run_id))


def heartbeats(entries: list[dg.EventLogEntry], step: str) -> list[tuple[int, str]]:
    return [
        (i, e.user_message)
        for i, e in enumerate(entries)
        if e.user_message.startswith(f"heartbeat: {step}")
    ]


def observed(entries: list[dg.EventLogEntry], key: dg.AssetKey) -> list[tuple[int, dict[str, str]]]:
    """The asset observations the run logged for `key`, with their place in the run's log."""
    out = []
    for i, e in enumerate(entries):
        event = e.dagster_event
        if event is not None and event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
            observation = event.asset_observation_data.asset_observation  # type: ignore[union-attr]
            if observation.asset_key == key:
                out.append((i, {k: str(v.value) for k, v in observation.metadata.items()}))
    return out


def test_a_long_build_beats_in_its_runs_log_with_its_job_id_on_the_asset_from_the_submit(
    pipeline: Pipeline, push_consumer
) -> None:
    p = pipeline
    text = p.sb.site_file.read_text()
    text, n = re.subn(r"^heartbeat_s = .*$", "heartbeat_s = 1", text, flags=re.MULTILINE)
    if n == 0:
        text += "\n[timeouts]\nheartbeat_s = 1\n"
    p.sb.site_file.write_text(text)
    advance_harbor(p.sb.root, fix=True)
    p.relock()
    head = push_consumer(p.sb, slow_script(), "a slow build")

    result = p.build(head)
    assert result.success, failure_message(result)
    entries = run_log(p, result)
    job_id = result.asset_value(IMAGE).job_id
    beats = heartbeats(entries, f"build job {job_id}: ")
    assert len(beats) >= 2, [e.user_message for e in entries]
    first, line = beats[0]
    assert re.match(
        rf"heartbeat: build job {re.escape(job_id)}: (pending|building|running)\b.*, \d+s of "
        r"3h00m\n"
        rf"{re.escape(TAIL_MARK)}",
        line,
    ), line
    # the job's own lines
    assert any(re.search(rf"\n  \| pushing layer \d/{STEPS}$", text) for _, text in beats)

    # The job id is on tpu/image (and the run's log) from the submit, before the first heartbeat.
    ((at, facts),) = observed(entries, IMAGE)
    assert facts == {"job_id": job_id} and at < first
    assert any(
        e.user_message == f"iris build job submitted: job_id {job_id}" for e in entries[:first]
    )
    assert [facts for _, facts in observed(entries, SMOKE)] == [
        {"job_id": result.asset_value(SMOKE).job_id}
    ]
    records = p.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=IMAGE, asset_partitions=[head]), limit=5
    )
    assert [r.asset_observation.metadata["job_id"].value for r in records.records] == [job_id]  # type: ignore[union-attr]


def test_a_token_the_job_prints_is_masked_in_every_heartbeat(
    pipeline: Pipeline, push_consumer, tmp_path: Path
) -> None:
    """The tail is read from a job that is still running:
    the post-mortem's leak scan has not run yet."""
    p = pipeline
    p.sb.site_file.write_text(
        re.sub(
            r"^heartbeat_s = .*$", "heartbeat_s = 1", p.sb.site_file.read_text(), flags=re.MULTILINE
        )
    )
    head = push_consumer(p.sb, slow_script(echo_token=True), "a slow build that prints its token")

    result = p.build(head)
    # the leak still fails it
    assert not result.success and "contains the value of" in failure_message(result)
    beats = [line for _, line in heartbeats(run_log(p, result), "build job ")]
    assert len(beats) >= 2 and any(
        re.search(rf"\| pushing layer \d/{STEPS} as \*\*\*$", b, re.MULTILINE) for b in beats
    ), beats
    written = [
        f
        for f in (tmp_path / "dagster_home").rglob("*")
        if f.is_file() and SANDBOX_TOKEN_VALUE.encode() in f.read_bytes()
    ]
    assert written == []
