"""The harbor re-lock slice end to end: real bare repos, real uv, Dagster in-process.

Runbook §2: the runtime gate is uv.lock; HARBOR_COMMIT follows it in the same commit; a failed
re-lock pushes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import git

from resources.uv import UvCli, UvLock
from sandbox.world import Sandbox, advance_harbor
from sensors.harbor import HARBOR_COMMIT_TAG
from tests.conftest import commit_count, remote_file, remote_head
from tests.support.runs import checks, failure_message, materialize, metadata
from tpu_assets.definitions import harbor_sensor
from tpu_assets.dockerfile import find_pin
from tpu_assets.keys import HARBOR_HEAD, HARBOR_LOCK
from tpu_assets.lock_assets import lock_and_dockerfile_agree


def relock(
    resources: dict[str, object], instance: dg.DagsterInstance | None = None
) -> dg.ExecuteInProcessResult:
    return materialize(resources, [HARBOR_LOCK], instance)


def locked_harbor_commit(sb: Sandbox) -> str:
    lock = UvLock.read(Path("uv.lock"), remote_file(sb.consumer, "uv.lock"))
    return lock.git_package("harbor")[1].commit


def dockerfile_pin(sb: Sandbox) -> str:
    return find_pin(
        remote_file(sb.consumer, "docker/Dockerfile.tpu"), "Dockerfile.tpu", "HARBOR_COMMIT"
    ).commit


def sensor_tick(
    resources: dict[str, object], cursor: str | None, instance: dg.DagsterInstance
) -> dg.SensorResult:
    sensor = harbor_sensor(resources)
    with dg.build_sensor_context(cursor=cursor, instance=instance) as context:
        return sensor(context)


def test_new_harbor_commit_gives_one_run_request_then_one_pushed_relock(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    instance = dg.DagsterInstance.ephemeral()
    first = sensor_tick(resources, None, instance)
    assert first.cursor and len(first.run_requests or []) == 1  # a fresh sensor syncs once

    new_sha = advance_harbor(sb.root)
    tick = sensor_tick(resources, first.cursor, instance)
    (request,) = tick.run_requests or []
    assert request.run_key == f"harbor:{new_sha}"
    assert request.tags[HARBOR_COMMIT_TAG] == new_sha
    assert tick.cursor == new_sha
    (obs,) = tick.asset_events
    assert obs.asset_key == HARBOR_HEAD and obs.tags["dagster/data_version"] == new_sha

    again = sensor_tick(resources, tick.cursor, instance)
    assert not again.run_requests
    assert new_sha in again.skip_reason.skip_message  # type: ignore[union-attr]

    before_head, before_count = remote_head(sb.consumer), commit_count(sb.consumer)
    result = relock(resources, instance)
    assert result.success
    assert commit_count(sb.consumer) == before_count + 1
    head = remote_head(sb.consumer)
    assert locked_harbor_commit(sb) == new_sha == dockerfile_pin(sb)
    assert git.Repo(sb.consumer).commit(head).parents[0].hexsha == before_head
    assert (
        git.Repo(sb.consumer).commit(head).message.strip()
        == f"chore(deps): re-lock harbor -> 0.8.1 ({new_sha[:8]})"
    )
    # The consumer as it really is: a direct reference
    # that follows the branch, which uv locks as a rev.
    assert remote_file(sb.consumer, "pyproject.toml") == remote_file(
        sb.consumer, "pyproject.toml", before_head
    )
    assert f"?rev=penfever%2Fworking#{new_sha}" in remote_file(sb.consumer, "uv.lock")
    meta = metadata(result)
    assert meta["consumer_commit"] == head and meta["pushed"] is True
    assert meta["harbor_version"] == "0.8.0 -> 0.8.1"
    assert new_sha in str(meta["lock_diff"])
    evaluated = checks(result)
    assert set(evaluated) == {"lock_and_dockerfile_agree", "harbor_version_moved", "uv_lock_check"}
    assert all(e.passed for e in evaluated.values())

    # A second materialization at the same tip pushes nothing and says so.
    again_result = relock(resources, instance)
    assert again_result.success
    assert remote_head(sb.consumer) == head
    meta = metadata(again_result)
    assert meta["pushed"] is False and "nothing pushed" in str(meta["outcome"])
    assert all(e.passed for e in checks(again_result).values())


def test_same_version_harbor_change_warns_about_stale_wheels(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    sha = advance_harbor(sb.root, version_bump=False)
    result = relock(resources)
    assert result.success  # a WARN does not stop the re-lock: the lock is still the right gate
    assert locked_harbor_commit(sb) == sha == dockerfile_pin(sb)
    warn = checks(result)["harbor_version_moved"]
    assert not warn.passed and warn.severity == dg.AssetCheckSeverity.WARN
    assert "0.8.0" in (warn.description or "") and "stale cached wheel" in (warn.description or "")


def test_stale_dockerfile_pin_alone_is_brought_into_lockstep(
    sb: Sandbox, resources: dict[str, object], push_consumer
) -> None:
    def stale(wt: Path) -> None:
        p = wt / "docker/Dockerfile.tpu"
        p.write_text(re.sub(r"HARBOR_COMMIT=\w+", "HARBOR_COMMIT=" + "0" * 40, p.read_text()))

    push_consumer(sb, stale)
    result = relock(resources)
    assert result.success and metadata(result)["pushed"] is True
    assert dockerfile_pin(sb) == locked_harbor_commit(sb)


def test_pins_that_disagree_fail_the_blocking_check(
    sb: Sandbox, resources: dict[str, object], push_consumer
) -> None:
    """The check reads the files at the recorded
    consumer commit from the remote, not from the run."""
    result = relock(resources)
    recorded = result.asset_value(HARBOR_LOCK)

    def drift(wt: Path) -> None:
        p = wt / "docker/Dockerfile.tpu"
        p.write_text(re.sub(r"HARBOR_COMMIT=\w+", "HARBOR_COMMIT=" + "1" * 40, p.read_text()))

    drifted = recorded.model_copy(update={"consumer_commit": push_consumer(sb, drift)})
    bound = {"site": resources["site"], "git": resources["git"]}
    good = lock_and_dockerfile_agree(lock=recorded, **bound)
    bad = lock_and_dockerfile_agree(lock=drifted, **bound)
    assert good.passed
    assert not bad.passed and bad.severity == dg.AssetCheckSeverity.ERROR
    line = find_pin(
        remote_file(sb.consumer, "docker/Dockerfile.tpu"), "docker/Dockerfile.tpu", "HARBOR_COMMIT"
    ).line
    assert f"docker/Dockerfile.tpu:{line}" in (bad.description or "") and "11111111" in (
        bad.description or ""
    )
    assert lock_and_dockerfile_agree.check_specs_by_output_name  # registered as a check...
    (spec,) = lock_and_dockerfile_agree.check_specs
    assert spec.blocking  # ...that blocks downstream assets when it fails


# -- bad input: each gets a clear error and pushes nothing ----------------------------------------


def _assert_refused(sb: Sandbox, resources: dict[str, object], *needles: str) -> str:
    head = remote_head(sb.consumer)
    advance_harbor(sb.root)
    result = relock(resources)
    assert not result.success
    message = failure_message(result)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert remote_head(sb.consumer) == head, "a failed re-lock must push nothing"
    assert "Nothing was pushed" in message or "nothing was pushed" in message
    return message


def test_dockerfile_without_harbor_commit_line_is_refused(
    sb: Sandbox, resources: dict[str, object], push_consumer
) -> None:
    def drop(wt: Path) -> None:
        p = wt / "docker/Dockerfile.tpu"
        p.write_text(
            "".join(l for l in p.read_text().splitlines(True) if "ENV HARBOR_COMMIT" not in l)
        )

    push_consumer(sb, drop)
    _assert_refused(sb, resources, "docker/Dockerfile.tpu", "no `ENV HARBOR_COMMIT=<sha>` line")


def test_lock_without_harbor_is_refused(
    sb: Sandbox, resources: dict[str, object], push_consumer
) -> None:
    def no_harbor(wt: Path) -> None:
        p = wt / "pyproject.toml"
        p.write_text(re.sub(r"dependencies = \[\n.*\n\]", "dependencies = []", p.read_text()))
        UvCli(offline=True).lock(project_dir=wt)

    push_consumer(sb, no_harbor)
    _assert_refused(sb, resources, "uv.lock", "no [[package]] named 'harbor'")


def test_consumer_branch_that_moves_during_relock_is_not_overwritten(
    sb: Sandbox, resources: dict[str, object], push_consumer
) -> None:
    class TeammatePushesMidway(UvCli):
        def lock_upgrade(self, *, project_dir: Path, package: str):  # type: ignore[no-untyped-def]
            push_consumer(
                sb, lambda wt: (wt / "NOTES.md").write_text("racing\n"), "teammate: notes"
            )
            return super().lock_upgrade(project_dir=project_dir, package=package)

    advance_harbor(sb.root)
    result = relock({**resources, "uv": TeammatePushesMidway(timeout_s=120)})
    assert not result.success
    message = failure_message(result)
    assert "moved from" in message and "nothing was pushed" in message
    tip = git.Repo(sb.consumer).commit("penfever/working")
    assert tip.message.strip() == "teammate: notes"  # the teammate's commit stands; no force-push


def test_malformed_site_file_names_file_line_and_key(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    text = sb.site_file.read_text()
    sb.site_file.write_text(text.replace("[tpu]\n", '[tpu]\nharbour_branch = "main"\n'))
    result = relock(resources)
    assert not result.success
    message = failure_message(result)
    assert f"{sb.site_file}:" in message and "[tpu] harbour_branch: unknown key" in message


def test_unreachable_harbor_remote_fails_the_relock_and_skips_the_sensor(
    sb: Sandbox, resources: dict[str, object], tmp_path: Path
) -> None:
    good = sb.url(sb.harbor)
    gone = (tmp_path / "nowhere" / "harbor.git").as_uri()
    sb.site_file.write_text(sb.site_file.read_text().replace(good, gone))
    head = remote_head(sb.consumer)
    result = relock(resources)
    assert not result.success
    assert "cannot reach" in failure_message(result) and gone in failure_message(result)
    assert remote_head(sb.consumer) == head

    tick = sensor_tick(resources, "a" * 40, dg.DagsterInstance.ephemeral())
    assert not tick.run_requests and tick.cursor is None  # cursor left alone
    assert "cannot reach" in tick.skip_reason.skip_message  # type: ignore[union-attr]


def test_sensor_skip_reason_never_shows_credentials(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    secret = "ghp_S3cretTokenValue"
    sb.site_file.write_text(
        sb.site_file.read_text().replace(
            sb.url(sb.harbor), f"https://penfever:{secret}@127.0.0.1:9/harbor.git"
        )
    )
    tick = sensor_tick(resources, None, dg.DagsterInstance.ephemeral())
    reason = tick.skip_reason.skip_message  # type: ignore[union-attr]
    assert "cannot reach" in reason or "cannot read" in reason
    assert secret not in reason and "***@127.0.0.1" in reason


def test_commits_link_to_their_web_pages_when_the_site_names_them(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    repos = sb.url(sb.consumer).rsplit("/", 1)[0] + "/"
    sb.site_file.write_text(sb.site_file.read_text() + f'\n[[links.commit]]\nremote = "{repos}"\n'
                            'url = "https://git.example/{path}/-/commit/{sha}"\n')  # fmt: skip
    new_sha = advance_harbor(sb.root)
    result = relock(resources)
    assert result.success
    meta = metadata(result)
    head = remote_head(sb.consumer)
    assert meta["consumer_commit"] == head
    assert meta["consumer_commit_url"] == f"https://git.example/openthoughts-agent/-/commit/{head}"
    assert meta["harbor_commit"].endswith(f" -> {new_sha}")  # type: ignore[union-attr]
    assert meta["harbor_commit_url"] == f"https://git.example/harbor/-/commit/{new_sha}"
