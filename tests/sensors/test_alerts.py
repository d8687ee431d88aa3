"""The alert sensor posts each event once to a real
HTTP receiver, keeps the URL secret, and retries.

The receiver is an http.server on 127.0.0.1 in a thread, stopped by each test. The events are real
event-log records: runs that fail (an asset that raises, a blocking check that fails) executed on a
test instance, holds and an outside move recorded as the floating-tag and harbor-lock
materializations lockstep's own assets write, and a harbor branch deleted from the sandbox remote.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import dagster as dg
import pytest

from resources.alerts import Alert, AlertNotDelivered, deliver
from resources.site.load import load_site
from sandbox.world import HARBOR_BRANCH, Sandbox
from tests.support.alerts import HOOK_ENV, SECRET_PATH, Receiver, Ticker, with_webhook
from tpu_assets.harbor_hold import hold_entries
from tpu_assets.history import FLOATING_TAG


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.stop()


@dg.asset
def boom() -> None:
    raise RuntimeError("kaniko exited 1")


@dg.asset
def lock_file() -> int:
    return 1


@dg.asset_check(asset=lock_file, blocking=True)
def lock_agrees() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, description="uv.lock and Dockerfile disagree")


def new_texts(receiver: Receiver, before: int) -> list[str]:
    return [str(body["text"]) for body in receiver.delivered[before:]]


def test_each_event_is_delivered_once_with_its_link_and_the_url_stays_secret(
    sb: Sandbox,
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    with_webhook(sb)
    monkeypatch.setenv(HOOK_ENV, receiver.url)
    assert HOOK_ENV in load_site(sb.site_file).secret_env_names()  # the secret canary covers it
    with dg.instance_for_test() as instance:
        tick = Ticker(sb, instance, tmp_path)
        tick()
        assert receiver.delivered == []  # a new sensor starts at the present; both branches exist

        def phase(make: object) -> list[str]:
            before = len(receiver.delivered)
            make()  # type: ignore[operator]
            tick()
            texts = new_texts(receiver, before)
            tick()  # a second tick delivers nothing again
            assert len(receiver.delivered) == before + len(texts)
            return texts

        failed = dg.materialize([boom], instance=instance, raise_on_error=False)
        [text] = phase(lambda: None)
        assert "run of `__ephemeral_asset_job__` failed" in text
        assert f"http://dagster.example:3000/runs/{failed.run_id}" in text

        texts = phase(
            lambda: dg.materialize(
                [lock_file, lock_agrees], instance=instance, raise_on_error=False
            )
        )
        [check] = [t for t in texts if "blocking check" in t]
        assert "`lock_agrees` on `lock_file` failed" in check
        assert "http://dagster.example:3000/assets/lock_file?view=checks" in check
        # The blocking check fails its run too: one alert, the check's, naming the run it failed.
        assert len(texts) == 1 and "http://dagster.example:3000/runs/" in check

        def rollback() -> None:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    FLOATING_TAG,
                    metadata={
                        "action": "rollback",
                        "hold": True,
                        "to_digest": "sha256:" + "a" * 64,
                    },
                )
            )

        [hold] = phase(rollback)
        assert "floating tag rollback" in hold and "HOLD set" in hold
        assert "http://dagster.example:3000/assets/tpu/floating_tag" in hold

        def runtime_pin() -> None:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    dg.AssetKey(["tpu", "harbor_lock"]),
                    metadata=hold_entries(
                        action="runtime_pin", held=True, reason="rollback to build 7"
                    ),
                )
            )

        [harbor] = phase(runtime_pin)
        assert "harbor HOLD set (rollback to build 7)" in harbor

        def outside_move() -> None:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    FLOATING_TAG,
                    metadata={
                        "action": "observed",
                        "hold": False,
                        "to_digest": "sha256:" + "b" * 64,
                    },
                )
            )

        [moved] = phase(outside_move)
        assert "moved outside lockstep" in moved

        def relock() -> None:  # an ordinary re-lock is not news
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    dg.AssetKey(["tpu", "harbor_lock"]),
                    metadata=hold_entries(action="relock", held=False, reason=""),
                )
            )

        assert phase(relock) == []

        def delete_branch() -> None:
            subprocess.run(
                ["git", "-C", str(sb.harbor), "update-ref", "-d", f"refs/heads/{HARBOR_BRANCH}"],
                check=True,
            )

        [gone] = phase(delete_branch)
        assert f"harbor branch `{HARBOR_BRANCH}` no longer exists" in gone
        assert "http://dagster.example:3000/locations/tpu/sensors/harbor_branch_sensor" in gone
        assert all(body["blocks"] for body in receiver.delivered)  # Slack blocks beside the text

        out, err = capfd.readouterr()
        logged = caplog.text + out + err + "".join(tick.seen) + json.dumps(receiver.delivered)
        logged += json.dumps(
            [
                str(r.event_log_entry)
                for r in instance.fetch_materializations(FLOATING_TAG, limit=100).records
            ]
        )
        assert SECRET_PATH not in logged and receiver.url not in logged


def test_a_vanished_lab_branch_is_posted_once(
    sb: Sandbox, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_webhook(sb, events='events = ["branch_gone"]')
    monkeypatch.setenv(HOOK_ENV, receiver.url)
    jovian = load_site(sb.site_file).jovian
    assert jovian is not None
    with dg.instance_for_test() as instance:
        tick = Ticker(sb, instance, tmp_path)
        tick()
        lab = urlparse(jovian.lab_repo).path
        subprocess.run(
            ["git", "-C", lab, "update-ref", "-d", f"refs/heads/{jovian.lab_branch}"], check=True
        )
        tick()
        tick()
        [body] = receiver.delivered
        assert f"the lab branch `{jovian.lab_branch}` no longer exists" in str(body["text"])
        assert "http://dagster.example:3000/locations/jovian/sensors/lab_rev_sensor" in str(
            body["text"]
        )


def test_a_refused_delivery_is_retried_and_lands_once(
    sb: Sandbox, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_webhook(sb, events='events = ["run_failure"]')
    monkeypatch.setenv(HOOK_ENV, receiver.url)
    with dg.instance_for_test() as instance:
        tick = Ticker(sb, instance, tmp_path)
        tick()
        dg.materialize([boom], instance=instance, raise_on_error=False)
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                FLOATING_TAG,
                metadata={"action": "rollback", "hold": True, "to_digest": "sha256:" + "a" * 64},
            )
        )
        receiver.statuses = [500]
        tick()
        tick()
        assert receiver.requests == 2  # a 500, then the retry's 200; the hold is not in `events`
        [body] = receiver.delivered
        assert "run of `__ephemeral_asset_job__` failed" in str(body["text"])


def test_a_receiver_that_keeps_failing_holds_the_cursor_then_gives_up(
    sb: Sandbox,
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    with_webhook(sb)
    monkeypatch.setenv(HOOK_ENV, receiver.url)
    monkeypatch.setattr(
        "sensors.alerts.deliver", lambda url, alert: deliver(url, alert, backoff_s=0.01)
    )
    with dg.instance_for_test() as instance:
        tick = Ticker(sb, instance, tmp_path)
        tick()
        dg.materialize([boom], instance=instance, raise_on_error=False)
        receiver.statuses = [500] * 6  # two ticks of three tries each
        tick()
        tick()
        assert receiver.delivered == [] and receiver.requests == 6
        tick()  # the third tick's tries succeed: the event was kept, not skipped
        assert len(receiver.delivered) == 1
        receiver.statuses = [500] * 9
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                FLOATING_TAG,
                metadata={
                    "action": "release_hold",
                    "hold": False,
                    "to_digest": "sha256:" + "c" * 64,
                },
            )
        )
        for _ in range(3):
            tick()
        assert len(receiver.delivered) == 1  # given up after three ticks of refusals ...
        tick()
        assert receiver.requests == 6 + 1 + 9  # ... and not tried again
        out, err = capfd.readouterr()
        logged = caplog.text + out + err
        assert "given up" in logged and "not delivered: HTTP 500" in logged
        assert SECRET_PATH not in logged


def test_an_unreachable_receiver_error_does_not_carry_the_url() -> None:
    r = Receiver([])
    url = r.url
    r.stop()  # nothing listens on that port now
    with pytest.raises(AlertNotDelivered) as err:
        deliver(url, Alert(kind="run_failure", text="x", url="http://h/runs/1"), backoff_s=0.01)
    assert SECRET_PATH not in str(err.value) and "127.0.0.1" not in str(err.value)


def test_the_first_delivery_of_a_fresh_process_logs_no_webhook_path_at_debug(
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # requests and urllib3 load when the first alert is delivered, so the urllib3 logger is quieted
    # there: start from a process where nothing has set it yet.
    urllib3_logger = logging.getLogger("urllib3")
    level = urllib3_logger.level
    urllib3_logger.setLevel(logging.NOTSET)
    caplog.set_level(logging.DEBUG)
    try:
        deliver(
            receiver.url, Alert(kind="run_failure", text="x", url="http://h/runs/1"), backoff_s=0.01
        )
    finally:
        quieted = urllib3_logger.level
        urllib3_logger.setLevel(level)
    assert len(receiver.delivered) == 1
    assert quieted == logging.INFO and SECRET_PATH not in caplog.text


def test_a_failed_non_blocking_error_check_is_a_check_failure_and_a_failed_warn_check_is_not() -> (
    None
):
    """Its run succeeds (nothing fails it), so without
    an alert of its own nobody would hear of it."""
    from resources.alerts import check_warned_alert
    from resources.site.alerts import AlertsSection
    from tpu_assets.alert_events import alert_for

    @dg.asset(
        check_specs=[
            dg.AssetCheckSpec("size_sane", asset="thing"),
            dg.AssetCheckSpec("looks_old", asset="thing"),
        ]
    )
    def thing() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            check_results=[
                dg.AssetCheckResult(
                    check_name="size_sane",
                    passed=False,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description="image is 0 bytes",
                ),
                dg.AssetCheckResult(
                    check_name="looks_old",
                    passed=False,
                    severity=dg.AssetCheckSeverity.WARN,
                    description="older than a week",
                ),
            ]
        )

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([thing], instance=instance)
        assert result.success  # a non-blocking check fails no run
        entries = instance.all_logs(
            result.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
    alerts = AlertsSection()
    by_check = {e.dagster_event.asset_check_evaluation_data.check_name: e for e in entries}  # type: ignore[union-attr]
    failed = alert_for(alerts, by_check["size_sane"])
    assert failed is not None and failed.kind == "check_failure"
    assert (
        "`size_sane` on `thing` failed (ERROR, not blocking" in failed.text
        and "image is 0 bytes" in failed.text
    )
    assert check_warned_alert(alerts, by_check["size_sane"]) is None  # one alert for it, not two
    assert alert_for(alerts, by_check["looks_old"]) is None
    warned = check_warned_alert(alerts, by_check["looks_old"])
    assert warned is not None and warned.kind == "check_warned"
