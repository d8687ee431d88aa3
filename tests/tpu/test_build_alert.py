"""A real failed build (the sandbox iris's job fails) is posted once, with its run's link."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import remote_head
from tests.support.alerts import HOOK_ENV, Receiver, Ticker, with_webhook
from tests.support.report import queue_fault
from tests.support.runs import Pipeline


@pytest.fixture
def hook() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.stop()


def test_a_failed_build_is_posted_once_with_its_run(
    pipeline: Pipeline, hook: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_webhook(pipeline.sb)
    monkeypatch.setenv(HOOK_ENV, hook.url)
    tick = Ticker(pipeline.sb, pipeline.instance, tmp_path)
    tick()
    queue_fault(pipeline.sb.iris_home, "fail")
    result = pipeline.build(remote_head(pipeline.sb.consumer))
    assert not result.success
    tick()
    tick()
    [body] = hook.delivered
    assert "run of `" in str(body["text"]) and "failed" in str(body["text"])
    assert f"http://dagster.example:3000/runs/{result.run_id}" in str(body["text"])
