"""What is deployed where (issue 26), on the real sandbox: two verified TPU builds, the newest
promoted, a Jovian rev built, distributed, booted on the lane and benched; then status_sensor ticks
and every fact of its Status is checked against what the runs did. A second tick records nothing.
Then a real `dagster-webserver` on that instance, and
`lockstep status --json` as a subprocess reading it (no
dagster import, no database); a harbor re-lock makes the image-vs-lock warning appear there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from jovian_assets.bench_tools import BenchReport
from jovian_assets.keys import BENCH, LANE_SERVING
from jovian_assets.models import LaneServing
from lockstep.graphql import Webserver
from lockstep.status_cmd import plan_text
from lockstep.status_model import Status
from resources.git import GitRemotes
from resources.registry import registry_for
from sandbox.jovian_world import new_lab_rev
from sandbox.world import Sandbox, advance_harbor, site_config
from sensors.status import build_status_sensor
from tests.conftest import remote_head
from tests.support.jovian.lab import Lab
from tests.support.runs import Pipeline, failure_message, two_verified_builds
from tests.support.servers import free_port
from tests.support.ui.dagster_dev import ROOT, start_process, stop_demo
from tpu_assets.definitions import defs as tpu_defs
from tpu_assets.history import verified_history
from tpu_assets.status import STATUS, fingerprint, gather_status

pytestmark = pytest.mark.heavy(90)  # about the seconds the module takes alone (-n 0)


def tick(p: Pipeline) -> dg.SensorResult:
    sensor = build_status_sensor(git=p.resources["git"])
    resources = {"site": p.resources["site"], "registry": p.resources["registry"]}
    with dg.build_sensor_context(instance=p.instance, resources=resources) as context:
        return sensor(context)


def recorded(result: dg.SensorResult) -> Status:
    """The status a tick emitted, recorded as the daemon would record it."""
    (event,) = result.asset_events or []
    assert isinstance(event, dg.AssetObservation) and event.asset_key == STATUS
    return Status.model_validate(event.metadata["status"].value)


def lockstep(url: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lockstep"), "status", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_an_unreadable_fact_is_named_and_the_rest_still_stands(tmp_path: Path) -> None:
    """No sandbox behind the site: git refuses the consumer's URL, the registry has no :tpu. The
    status says which facts are unknown and why, and warns
    of no mismatch it cannot see; the hash the sensor
    compares ignores how an unknown fact's reason is
    worded (a timeout's seconds), not which fact it is."""
    site = site_config(Sandbox(root=tmp_path))
    with dg.instance_for_test() as instance:
        found = gather_status(
            site,
            instance,
            GitRemotes(cache_dir=str(tmp_path / "cache"), timeout_s=10),
            registry_for(site),
            now=datetime.now(UTC),
        )
    assert found.tpu.digest is None and found.consumer.head is None and found.newest_build is None
    assert [e.split(": ", 1)[0] for e in found.errors] == [
        f"the consumer's uv.lock ({site.tpu.consumer_branch})"
    ]
    assert "no git command was run" in found.errors[0] and found.warnings == []
    assert (
        found.rollback is not None and not found.rollback.ok and "unknown" in found.rollback.scopes
    )
    # a lane in the site, nothing recorded for it
    assert [lane.action for lane in found.lanes] == [""]
    reworded = found.model_copy(update={"errors": [found.errors[0] + " (after 9.8 s)"]})
    assert fingerprint(reworded) == fingerprint(found)
    assert fingerprint(found.model_copy(update={"errors": []})) != fingerprint(found)


def test_status_after_a_promotion_and_a_jovian_boot_says_what_is_deployed_where(
    pipeline: Pipeline,
) -> None:
    p = pipeline
    (older, newer), _ = two_verified_builds(p)
    promoted = p.tag("promote")
    assert promoted.success, failure_message(promoted)
    lab = Lab(p.sb, {k: p.resources[k] for k in ("site", "git", "spark")}, p.instance)
    new_lab_rev(p.sb.root, "r28")
    booted = lab.adopt("r28", build=True)
    assert booted.success, failure_message(booted)
    serving: LaneServing = booted.asset_value(LANE_SERVING)
    bench: BenchReport = booted.asset_value(BENCH)

    first = tick(p)
    status = recorded(first)
    digest = p.floating()
    harbor = {v.build: v.harbor_commit for v in verified_history(p.instance)}
    # :tpu -> digest, build, baked harbor; the consumer's lock read live; no holds.
    assert (status.tpu.digest, status.tpu.build, status.tpu.baked_harbor) == (
        digest,
        newer,
        harbor[newer],
    )
    assert status.tpu.baked_from == "verified record"
    assert (status.consumer.head, status.consumer.harbor_commit) == (
        remote_head(p.sb.consumer),
        harbor[newer],
    )
    assert not status.tag_hold.held and not status.harbor_hold.held
    # The newest verified build is the one on the tag: a
    # promote has nothing to do; attested by the sandbox key.
    assert status.newest_build is not None and status.newest_build.build == newer
    assert [r.rule for r in status.newest_build.refusals] == [
        "already"
    ] and not status.newest_build.promotable
    assert status.newest_build.changelog.startswith("harbor: unchanged at")
    # the sandbox signs what it verifies
    assert status.newest_build.attestation.startswith("attested: ")
    # The default rollback goes back to the older build, in the planner's own words.
    assert status.rollback is not None and status.rollback.target_build == older
    assert "-> TARGET" in status.rollback.explanation and "default (auto)" in status.rollback.scopes
    # The lane: r28 on both nodes, its distributed image,
    # ready since its boot, its score against the baseline.
    (lane,) = status.lanes
    assert (lane.name, lane.action, lane.rev) == ("glm53-2x", "boot", "r28")
    assert (
        lane.expected_image_id == serving.image_id
        and lane.nodes == serving.nodes
        and len(lane.nodes) == 2
    )
    assert (
        lane.ready_since is not None
        and lane.score == bench.quality.final_score
        and lane.gate_passed is True
    )
    assert (
        lane.baseline.startswith(str(bench.quality.final_score)) or lane.baseline == "none recorded"
    )
    assert status.warnings == [] and status.errors == []

    # Recorded once: a second tick with nothing changed emits nothing.
    p.instance.report_runless_asset_event(first.asset_events[0])  # type: ignore[index,arg-type]
    again = tick(p)
    assert not again.asset_events and again.skip_reason is not None
    assert "unchanged" in (again.skip_reason.skip_message or "")

    # A real webserver on this instance; the command reads it from a fresh process.
    port = free_port()
    home = Path(p.instance.root_directory)
    env = {**os.environ, "DAGSTER_HOME": str(home), "LOCKSTEP_SITE": str(p.sb.site_file)}
    env.pop("LOCKSTEP_SENSORS_RUNNING", None)
    url = f"http://127.0.0.1:{port}"
    web = start_process(
        [
            str(Path(sys.executable).parent / "dagster-webserver"),
            "-w",
            str(ROOT / "workspace.yaml"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        url=url,
        sandbox=p.sb,
        log=home / "webserver.log",
        env=env,
    )
    try:
        out = lockstep(url, "--json", env=env)
        assert out.returncode == 0, out.stderr
        read = Status.model_validate_json(out.stdout)
        assert read.fingerprint_json() == status.fingerprint_json()
        human = lockstep(url, env=env)
        assert human.returncode == 0 and f"build {newer[:8]}" in human.stdout
        # the sensors start stopped outside the demo
        assert "status_sensor is STOPPED" in human.stdout
        text, ok = plan_text(Webserver(url), action="rollback")
        assert ok and f"rollback to build {older[:8]}" in text
        text, ok = plan_text(Webserver(url), action="promote")
        assert not ok and "already: :tpu points at it" in text

        # Harbor moves and is re-locked: workers install
        # the new harbor, :tpu still bakes the old one.
        advance_harbor(p.sb.root)
        p.relock()
        changed = tick(p)
        moved = recorded(changed)
        assert moved.consumer.harbor_commit != harbor[newer]
        (warning,) = moved.warnings
        assert (
            f"bakes harbor {harbor[newer][:8]}" in warning
            and f"pins harbor {moved.consumer.harbor_commit[:8]}" in warning
        )
        p.instance.report_runless_asset_event(changed.asset_events[0])  # type: ignore[index,arg-type]
        warned = lockstep(url, env=env)
        assert warned.returncode == 1 and warned.stdout.startswith(f"WARNING: {warning}")
        assert json.loads(lockstep(url, "--json", env=env).stdout)["warnings"] == [warning]

        # A person who will not wait for the next tick: the refresh_status job records one at once.
        refreshed = tpu_defs.get_job_def("refresh_status").execute_in_process(
            instance=p.instance, resources={k: p.resources[k] for k in ("site", "git", "registry")}
        )
        assert refreshed.success
        newest = Status.model_validate_json(lockstep(url, "--json", env=env).stdout)
        assert newest.source == "refresh_status" and newest.warnings == [warning]

        # A default rollback (scope auto: the older build bakes another harbor than the lock, so
        # both): :tpu goes back with the tag hold, uv.lock
        # is pinned to its harbor with the harbor hold.
        rolled = p.tag("rollback")
        assert rolled.success, failure_message(rolled)
        held = recorded(tick(p))
        assert (
            held.tpu.build == older
            and held.consumer.harbor_commit == harbor[older]
            and held.warnings == []
        )
        assert held.tag_hold.held and f"rollback to build {older[:8]}" in held.tag_hold.reason
        assert held.tag_hold.since is not None
        assert held.harbor_hold.held and "runtime rollback to build" in held.harbor_hold.reason
        assert held.harbor_hold.since is not None and held.harbor_hold.by.startswith("run ")
        assert held.newest_build is not None and [r.rule for r in held.newest_build.refusals][
            :1
        ] == ["hold"]
    finally:
        stop_demo(web)
