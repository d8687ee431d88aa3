"""Idle sensors start nothing; a change starts exactly one run — with the cursor as the only state.

The daemon stores a sensor's cursor in the instance and evaluates each tick in a fresh process. So
every tick here gets fresh resources, and the tick that sees the change runs on a freshly opened
instance over the same storage: nothing a previous tick held in memory can make a run request go
away or appear. (Opening a SQLite instance costs ~1 s, so the idle ticks share one.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from dagster._core.remote_representation.external_data import SensorExecutionErrorSnap
from dagster._grpc.impl import get_external_sensor_execution

from jovian_assets.definitions import build_defs as jovian_build_defs
from jovian_assets.definitions import lab_sensor
from resources.git import GitRemotes
from resources.site.cache import SiteCache
from resources.site.load import load_site
from resources.site.resource import SiteResource, site_resource
from sandbox.jovian_world import new_lab_rev
from sandbox.world import HARBOR_BRANCH, Sandbox, advance_harbor
from tests.conftest import sandbox_resources
from tests.support.report import count
from tests.support.sensors import tick as sensor_tick
from tpu_assets.definitions import build_defs as tpu_build_defs
from tpu_assets.definitions import harbor_sensor

IDLE_TICKS = 100


def opened(home: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def tick(
    sensor: str, sb: Sandbox, instance: dg.DagsterInstance, cursor: str | None
) -> dg.SensorResult:
    """A tick over fresh resources (the daemon evaluates each tick in a fresh process), counted."""
    result = sensor_tick(
        sensor, sandbox_resources(sb, Path(instance.root_directory) / "cache"), instance, cursor
    )
    count(f"sensor ticks evaluated ({sensor})")
    return result


def move_harbor(sb: Sandbox) -> str:
    return advance_harbor(sb.root)


def move_lab(sb: Sandbox) -> str:
    return new_lab_rev(sb.root, "r28").lab_commit


@pytest.mark.parametrize(
    ("sensor", "move"), [("harbor_branch_sensor", move_harbor), ("lab_rev_sensor", move_lab)]
)
def test_idle_ticks_request_nothing_and_one_change_requests_one_run(
    sensor: str, move: Callable[[Sandbox], str], sb: Sandbox, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    with opened(home) as instance:
        first = tick(sensor, sb, instance, None)
        assert len(first.run_requests or []) == 1  # a fresh sensor syncs once
        cursor = first.cursor
        idle = [tick(sensor, sb, instance, cursor) for _ in range(IDLE_TICKS)]
    assert sum(len(t.run_requests or []) for t in idle) == 0
    assert {t.cursor for t in idle} <= {cursor, None}  # an idle tick keeps the stored cursor

    upstream = move(sb)
    with opened(home) as instance:
        changed = tick(sensor, sb, instance, cursor)
        (request,) = changed.run_requests or []
        # A tick the daemon evaluates twice (it died before storing the cursor) asks for the same
        # run key, which the daemon starts once.
        (again,) = tick(sensor, sb, instance, cursor).run_requests or []
        assert again.run_key == request.run_key and upstream in (changed.cursor or "")
        after = [tick(sensor, sb, instance, changed.cursor) for _ in range(3)]
    assert sum(len(t.run_requests or []) for t in after) == 0


def test_an_edited_site_is_seen_on_the_next_tick_and_a_broken_edit_skips(
    sb: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sandbox wrote its site moments ago, which the cache does not keep yet: let it, so these
    # ticks are served from it. Every edit below changes the file's size.
    monkeypatch.setattr(SiteCache, "SETTLED_NS", 0)
    resources = sandbox_resources(sb, tmp_path / "cache")
    wired = {"site": resources["site"], "git": resources["git"]}
    # as a code location wires it
    pinned = {**wired, "site": site_resource(load_site(sb.site_file))}

    def reason(res: dict[str, object], cursor: str | None) -> str:
        with dg.build_sensor_context(cursor=cursor, instance=instance) as context:
            result = harbor_sensor(res)(context)
        assert not result.run_requests
        return result.skip_reason.skip_message  # type: ignore[union-attr]

    text = sb.site_file.read_text(encoding="utf-8")
    with dg.instance_for_test() as instance:
        tip = tick("harbor_branch_sensor", sb, instance, None).cursor
        assert "still at" in reason(wired, tip) and load_site(sb.site_file) is load_site(
            sb.site_file
        )

        sb.site_file.write_text(
            text.replace(f'harbor_branch = "{HARBOR_BRANCH}"', 'harbor_branch = "penfever/gone"')
        )
        # the edit, on the very next tick
        assert reason(wired, tip).startswith("branch penfever/gone on ")
        assert "changed since this code location loaded it" in reason(pinned, tip)

        broken = text.replace('memory = "64GB"', 'memory = "lots"')
        line = broken.splitlines().index('memory = "lots"') + 1
        sb.site_file.write_text(broken)
        for _ in range(2):  # never the config of before the edit, on any tick
            assert reason(wired, tip).startswith(
                f"site file unusable: {sb.site_file}:{line}: [iris] memory"
            )

        sb.site_file.write_text(text)
        assert reason(wired, tip).endswith(f"still at {tip}")


def test_a_moved_lab_tick_fetches_once(
    sb: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dg.instance_for_test() as instance:
        cursor = tick("lab_rev_sensor", sb, instance, None).cursor
        move_lab(sb)
        fetches: list[list[str]] = []
        real = subprocess.Popen.__init__

        def counting(
            self: subprocess.Popen[bytes], args: list[str], *a: object, **kw: object
        ) -> None:
            if "fetch" in args and Path(str(args[0])).name == "git":
                fetches.append(list(args))
            real(self, args, *a, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(subprocess.Popen, "__init__", counting)
        # A cold mirror cache (a new pod, a wiped cache):
        # the tick lists the new tip and the last one seen.
        cold = sandbox_resources(sb, tmp_path / "cold-cache")
        with dg.build_sensor_context(cursor=cursor, instance=instance) as context:
            (request,) = lab_sensor(cold)(context).run_requests or []
    # Both in one shallow fetch: each fetch is a round trip to the lab.
    (fetch,) = fetches
    assert "--depth=1" in fetch and cursor in " ".join(fetch) and request.partition_key == "r28"


@pytest.mark.parametrize(
    "sensor", ["harbor_branch_sensor", "consumer_rebuild_sensor", "lab_rev_sensor"]
)
def test_a_steady_tick_as_the_code_server_runs_it_is_one_ls_remote_and_nothing_built(
    sensor: str, sb: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemon asks of the code location per tick (dagster/_grpc/impl.py), over the
    location's own Definitions: a tick that declared a resource
    would open the instance from its ref and build each
    resource three times (sensors/tick_resources.py)."""
    site = load_site(sb.site_file)
    repo = (jovian_build_defs if sensor == "lab_rev_sensor" else tpu_build_defs)(
        site
    ).get_repository_def()
    (tmp_path / "home").mkdir()
    good = InstanceRef.from_dir(str(tmp_path / "home"))
    (tmp_path / "trap").mkdir()
    unopenable = InstanceRef.from_dir(str(tmp_path / "trap"))
    (tmp_path / "trap").rmdir()
    # a file where its storage would be: opening the instance fails
    (tmp_path / "trap").write_text("")

    def evaluate(ref: InstanceRef, cursor: str | None) -> object:
        return get_external_sensor_execution(
            repo, None, ref, sensor, None, None, cursor, [sensor, "tick"], None
        )

    # a moved tick reads the instance (the hold; the known builds or revs)
    first = evaluate(good, None)
    assert first.run_requests, first  # type: ignore[attr-defined]
    tip = first.cursor  # type: ignore[attr-defined]
    # the trap springs when it is opened
    assert isinstance(evaluate(unopenable, None), SensorExecutionErrorSnap)

    built: list[str] = []
    processes: list[list[str]] = []
    for cls in (SiteResource, GitRemotes):

        def counting(
            self: object, *a: object, __init=cls.__init__, __name=cls.__name__, **kw: object
        ) -> None:
            built.append(__name)
            __init(self, *a, **kw)

        monkeypatch.setattr(cls, "__init__", counting)
    real = subprocess.Popen.__init__

    def spawned(self: subprocess.Popen[bytes], args: list[str], *a: object, **kw: object) -> None:
        processes.append([str(x) for x in args])
        real(self, args, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", spawned)
    steady = [evaluate(unopenable, tip) for _ in range(3)]
    assert all(not isinstance(t, SensorExecutionErrorSnap) for t in steady), steady
    assert all(not t.run_requests and tip in (t.skip_message or "") for t in steady), steady  # type: ignore[attr-defined]
    assert built == []
    assert [p[p.index("ls-remote")] if "ls-remote" in p else p for p in processes] == [
        "ls-remote"
    ] * 3


def test_a_resource_a_tick_could_not_use_as_configured_is_refused_at_load() -> None:
    # Used directly, cache_dir would be the variable's name: the location refuses it as it loads.
    with pytest.raises(ValueError, match=r"resource 'git' sets cache_dir from the environment"):
        harbor_sensor(
            {"site": SiteResource(), "git": GitRemotes(cache_dir=dg.EnvVar("LOCKSTEP_GIT_CACHE"))}
        )
    with pytest.raises(TypeError, match=r"resource 'site' is a GitRemotes, not the SiteResource"):
        lab_sensor({"site": GitRemotes(), "git": GitRemotes()})


# Where each branch watch's repo and branch are in the site: (section, repo key, branch key).
WATCHED = {
    "harbor_branch_sensor": ("tpu", "harbor_repo", "harbor_branch"),
    "consumer_rebuild_sensor": ("tpu", "consumer_repo", "consumer_branch"),
    "lab_rev_sensor": ("jovian", "lab_repo", "lab_branch"),
}


@pytest.mark.parametrize("sensor", sorted(WATCHED))
def test_every_branch_watch_skips_in_one_wording(
    sensor: str, sb: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared preamble (sensors/tick_resources.py): the same four skip reasons from each branch
    watch, each keeping the cursor."""
    monkeypatch.setattr(SiteCache, "SETTLED_NS", 0)  # each edit below is seen on the next tick
    section, repo_key, branch_key = WATCHED[sensor]
    watched = getattr(load_site(sb.site_file), section)
    repo, branch = getattr(watched, repo_key), getattr(watched, branch_key)
    text = sb.site_file.read_text(encoding="utf-8")
    loaded = sandbox_resources(sb, tmp_path / "cache")  # as the location wired them when it loaded

    def skip(edited: str, cursor: str | None) -> str:
        sb.site_file.write_text(edited, encoding="utf-8")
        result = sensor_tick(sensor, loaded, instance, cursor)
        assert not result.run_requests and result.cursor is None, result  # the stored cursor stays
        return result.skip_reason.skip_message  # type: ignore[union-attr]

    def edit(key: str, old: str, new: str) -> str:
        assert text.count(f'{key} = "{old}"') == 1, key
        return text.replace(f'{key} = "{old}"', f'{key} = "{new}"')

    with dg.instance_for_test() as instance:
        tip = sensor_tick(sensor, loaded, instance, None).cursor
        assert tip
        assert skip(text, tip) == f"{branch} on {repo} still at {tip}"
        gone = skip(edit(branch_key, branch, "penfever/gone"), tip)
        assert gone == f"branch penfever/gone on {repo} does not exist"
        nowhere = (tmp_path / "nowhere.git").as_uri()
        unreadable = skip(edit(repo_key, repo, nowhere), tip)
        assert unreadable.startswith(f"cannot read {branch} on {nowhere}: ")
        assert "cannot reach" in unreadable
        assert unreadable.endswith(f"(cursor kept at {tip})")
        broken = text.replace('memory = "64GB"', 'memory = "lots"')
        line = broken.splitlines().index('memory = "lots"') + 1
        unusable = skip(broken, tip)
        assert unusable.startswith(f"site file unusable: {sb.site_file}:{line}: [iris] memory")
