"""Rolling back what iris workers RUN, not only the
tag: `rollback_tpu` scope image / runtime / both.

Runbook's lesson: workers `uv sync --frozen --reinstall` from the consumer's uv.lock, overwriting
the image. A rollback of `:tpu` alone leaves every new launch installing the bad harbor from the
lock. Real bare repos, real uv (a real `uv sync --frozen`
of the consumer), real OCI images, Dagster in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import git
import pytest
from click.testing import CliRunner

from lockstep.cli import main as lockstep_cli
from resources.uv import UvLock, uv_binary
from sandbox.consumer_source import CONSUMER_SHAPES, ConsumerShape
from sandbox.world import HARBOR_BRANCH, Sandbox, advance_harbor, up
from tests.conftest import remote_file, remote_head, stop_sandbox
from tests.support.runs import Pipeline, failure_message, materialize
from tpu_assets.definitions import harbor_sensor
from tpu_assets.dockerfile import find_pin
from tpu_assets.harbor_hold import HOLD, LOCK_ACTION, read_hold
from tpu_assets.keys import HARBOR_HEAD, HARBOR_LOCK

pytestmark = pytest.mark.heavy(180)  # seconds, about, unloaded (three tests, two builds each)


def promoted(p: Pipeline, *, fix: bool = False) -> tuple[str, str]:
    """Push a harbor commit, re-lock, build, verify and
    promote it: (harbor commit, consumer commit)."""
    harbor = advance_harbor(p.sb.root, fix=fix)
    build = p.relock()
    built = p.build(build)
    assert built.success, failure_message(built)
    moved = p.tag("promote")
    assert moved.success, failure_message(moved)
    return harbor, build


def locked(sb: Sandbox) -> str:
    return (
        UvLock.read(Path("uv.lock"), remote_file(sb.consumer, "uv.lock"))
        .git_package("harbor")[1]
        .commit
    )


def baked_pin(sb: Sandbox) -> str:
    return find_pin(
        remote_file(sb.consumer, "docker/Dockerfile.tpu"), "Dockerfile.tpu", "HARBOR_COMMIT"
    ).commit


def installed_by_fresh_sync(sb: Sandbox, tmp: Path) -> str:
    """What a worker gets: a fresh clone of the consumer
    head, `uv sync --frozen`, the installed dist's
    PEP 610 direct_url.json commit_id."""
    checkout = tmp / "worker"
    git.Repo.clone_from(str(sb.consumer), checkout)
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    env |= {"UV_CACHE_DIR": str(tmp / "uv-cache"), "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run(
        [uv_binary(), "sync", "--frozen", "--offline", "--no-progress"],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (direct_url,) = checkout.glob(
        ".venv/lib/python*/site-packages/harbor-*.dist-info/direct_url.json"
    )
    return json.loads(direct_url.read_text())["vcs_info"]["commit_id"]


def harbor_tick(p: Pipeline, cursor: str | None) -> dg.SensorResult:
    sensor = harbor_sensor(p.resources)
    with dg.build_sensor_context(cursor=cursor, instance=p.instance) as context:
        return sensor(context)


def lock_records(p: Pipeline) -> list[dict[str, object]]:
    """tpu/harbor_lock's materializations, newest first, as plain metadata."""
    records = p.instance.fetch_materializations(HARBOR_LOCK, limit=100).records
    return [
        {k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}  # type: ignore[union-attr]
        for r in records
    ]


def release(p: Pipeline) -> dg.ExecuteInProcessResult:
    return materialize(
        p.resources,
        [HARBOR_LOCK],
        p.instance,
        run_config={"ops": {"tpu__harbor_lock": {"config": {"release_hold": True}}}},
    )


@pytest.fixture(params=CONSUMER_SHAPES)
def consumer_shape(request: pytest.FixtureRequest) -> ConsumerShape:
    return request.param


@pytest.fixture
def sb(tmp_path: Path, consumer_shape: ConsumerShape) -> Iterator[Sandbox]:
    """The whole TPU flow runs against a consumer in each
    shape in the field (the default is the real one's)."""
    world = up(tmp_path / "sandbox", consumer_shape=consumer_shape)
    yield world
    stop_sandbox(world)


def test_rollback_both_pins_the_runtime_holds_the_sensor_and_release_relocks_to_the_tip(
    pipeline: Pipeline,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    consumer_shape: ConsumerShape,
) -> None:
    p = pipeline
    declared = remote_file(p.sb.consumer, "pyproject.toml")
    good, b1 = promoted(p, fix=True)
    bad, b2 = promoted(p)  # the bad harbor change: verified, promoted, locked
    assert locked(p.sb) == bad and p.floating() == p.pinned(b2)
    cursor = harbor_tick(p, None).cursor
    assert cursor == bad

    # The plan says what each scope would change, before anything moves.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("LOCKSTEP_SITE", str(p.sb.site_file))
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cli-cache"))
    cli = CliRunner().invoke(lockstep_cli, ["rollback", "plan", "--must-contain", good[:8]])
    assert cli.exit_code == 0, cli.output
    scopes = {
        line.split(":")[0].strip(): line
        for line in cli.output.splitlines()
        if line.startswith("  ")
    }
    assert p.pinned(b1) in scopes["image"] and "still install harbor " + bad[:8] in scopes["image"]
    assert (
        f"{bad[:8]} -> {good[:8]}" in scopes["runtime (with both)"]
        and "harbor hold" in scopes["runtime (with both)"]
    )
    # :tpu bakes the lock's harbor
    assert "already pins harbor " + bad[:8] in scopes["runtime alone (the tag stays)"]
    assert "both" in scopes["default (auto)"]
    before_plan = remote_head(p.sb.consumer)

    # A runtime target without the required fix is refused like an image one, and nothing is pushed.
    for scope in ("runtime", "both"):
        refused = p.tag("rollback", build=b1[:8], must_contain=bad[:8], scope=scope)
        assert not refused.success and "predates" in failure_message(refused), scope
        assert remote_head(p.sb.consumer) == before_plan and p.floating() == p.pinned(b2)
    assert not read_hold(p.instance, HARBOR_LOCK).held

    rolled = p.tag("rollback", must_contain=good[:8], scope="both")
    assert rolled.success, failure_message(rolled)
    assert p.floating() == p.pinned(b1)
    head = remote_head(p.sb.consumer)
    assert (
        head != before_plan
        and git.Repo(p.sb.consumer).commit(head).parents[0].hexsha == before_plan
    )
    assert locked(p.sb) == good and baked_pin(p.sb) == good  # uv.lock and HARBOR_COMMIT in lockstep
    # pinned in the shape the consumer declares harbor
    pinned = remote_file(p.sb.consumer, "pyproject.toml")
    if consumer_shape == "direct_reference":
        assert pinned == declared.replace(f'@{HARBOR_BRANCH}"', f'@{good}"')
    else:
        assert pinned == declared.replace(f'branch = "{HARBOR_BRANCH}"', f'rev = "{good}"')
    # a new worker launch runs the old harbor
    assert installed_by_fresh_sync(p.sb, tmp_path) == good

    # The hold is on tpu/harbor_lock, beside the commit it protects.
    (pin, *_) = lock_records(p)
    assert (
        pin[HOLD] is True
        and pin[LOCK_ACTION] == "runtime_pin"
        and b1[:8] in str(pin["harbor_hold_reason"])
    )
    assert pin["consumer_commit"] == head
    held = materialize(p.resources, [HARBOR_LOCK], p.instance)  # a plain re-lock is refused
    assert (
        not held.success
        and "on hold" in failure_message(held)
        and remote_head(p.sb.consumer) == head
    )

    # A new harbor commit is seen and recorded, but nothing is requested.
    tip = advance_harbor(p.sb.root)
    tick = harbor_tick(p, cursor)
    assert not tick.run_requests and tick.cursor == tip
    assert "on hold" in tick.skip_reason.skip_message  # type: ignore[union-attr]
    (seen,) = tick.asset_events
    assert seen.asset_key == HARBOR_HEAD and seen.tags["dagster/data_version"] == tip

    released = release(p)
    assert released.success, failure_message(released)
    assert locked(p.sb) == tip and baked_pin(p.sb) == tip
    # following the branch again, as before
    assert remote_file(p.sb.consumer, "pyproject.toml") == declared
    assert (
        not read_hold(p.instance, HARBOR_LOCK).held
        and lock_records(p)[0][LOCK_ACTION] == "release_hold"
    )
    assert not release(p).success  # no hold left to release
    after = advance_harbor(p.sb.root)
    (request,) = harbor_tick(p, tip).run_requests or []  # the sensor requests re-locks again
    assert request.run_key == f"harbor:{after}"


# the pin's edit is the first test's, in each shape
@pytest.mark.parametrize("consumer_shape", ["direct_reference"])
def test_scope_image_leaves_the_lock_alone_and_a_refused_pin_after_the_image_move_says_so(
    pipeline: Pipeline,
) -> None:
    p = pipeline
    good, b1 = promoted(p, fix=True)
    bad, b2 = promoted(p)
    head = remote_head(p.sb.consumer)
    rolled = p.tag("rollback", scope="image")
    assert rolled.success, failure_message(rolled)
    assert p.floating() == p.pinned(b1)
    # workers still get the bad harbor
    assert remote_head(p.sb.consumer) == head and locked(p.sb) == bad
    assert not read_hold(p.instance, HARBOR_LOCK).held
    assert p.tag("release_hold").success and p.tag("promote", build=b2[:8]).success

    # The consumer branch refuses the push: the image move stands (recorded, tag hold set), nothing
    # is pushed, no harbor hold is set, and the error says which half is done.
    hook = p.sb.consumer / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'branch protected' >&2\nexit 1\n")
    hook.chmod(0o755)
    rolled = p.tag("rollback", scope="both")
    assert not rolled.success
    message = failure_message(rolled)
    assert "image rollback is done and recorded" in message and "pushed nothing" in message
    assert p.floating() == p.pinned(b1)
    assert remote_head(p.sb.consumer) == head and locked(p.sb) == bad
    assert not read_hold(p.instance, HARBOR_LOCK).held

    hook.unlink()  # the pin alone, as the error says: the tag stays where the rollback put it
    pinned = p.tag("rollback", scope="runtime", build=b1[:8])
    assert pinned.success, failure_message(pinned)
    assert p.floating() == p.pinned(b1) and locked(p.sb) == good and baked_pin(p.sb) == good
    assert read_hold(p.instance, HARBOR_LOCK).held
