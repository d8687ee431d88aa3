"""[tpu.promotion] and rejections hold for a person
(promote_tpu) and for automation (auto_promote_sensor).

Two real verified builds, made once by the sandbox TPU pipeline (layout registry); each test gets
its own floating tag (a copy of the site file naming another tag) and a fresh instance holding
copies of the two `tpu/verified_image` records, written as the test starts, so both builds were
verified "just now": soak is judged by making soak_minutes larger than that, freeze by a window
around now. The first build is promoted before the policy is switched on; every refusal must leave
the tag on it and the promotion log equal to the registry.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from lockstep.cli import main
from resources.registry import ImageRef, registry_for
from resources.site.load import load_site
from resources.site.resource import SiteResource
from tests.conftest import sandbox_resources
from tests.support.runs import failure_message, materialize, metadata
from tests.support.two_builds import Built, record_builds, site_with_own_tag, two_builds
from tpu_assets.definitions import defs
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE, tag_history, verified_history
from tpu_assets.jobs import reject_tpu_build, release_tpu_build
from tpu_assets.promotion_policy import shown, utc
from tpu_assets.rejection import rejections
from tpu_assets.tag_log import log_disagreement

pytestmark = pytest.mark.heavy(120)  # seconds, about: the order parallel workers take modules in

ONLY_THE_MOVE = dg.AssetSelection.assets(FLOATING_TAG).without_checks()
_TAGS = itertools.count(1)
# what the sandbox writes: no soak, no freeze
SANDBOX_POLICY = "[tpu.promotion]\nsoak_minutes = 0\nfreeze = []\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    with two_builds(tmp_path_factory.mktemp("policy")) as two:
        yield two


class World:
    """A floating tag of its own at build 1, promoted
    with no policy; `policy()` then switches one on."""

    def __init__(self, built: Built, instance: dg.DagsterInstance, tmp: Path) -> None:
        self.instance, self.tmp = instance, tmp
        self.tag = f"policy-{os.getpid()}-{next(_TAGS)}"
        self.site_file = site_with_own_tag(built, self.tag)
        self.base = self.site_file.read_text(encoding="utf-8")
        assert (
            self.tag in self.base
            and "auto_promote = false" in self.base
            and SANDBOX_POLICY in self.base
        )
        self.policy("")
        site = load_site(self.site_file)
        self.registry, self.repository = (
            registry_for(site),
            ImageRef.parse(site.tpu.image).repository,
        )
        self.resources = {
            **sandbox_resources(built.sb, tmp / "cache"),
            "site": SiteResource(path=str(self.site_file)),
        }
        record_builds(instance, built)
        self.b1, self.b2 = built.builds
        self.d1, self.d2 = built.digests[self.b1], built.digests[self.b2]
        assert self.promote(self.b1).success and self.floating() == self.d1

    def policy(self, text: str) -> None:
        """The site file with auto_promote on and `text` as its [tpu.promotion] table's body."""
        on = self.base.replace("auto_promote = false", "auto_promote = true")
        self.site_file.write_text(
            on.replace(SANDBOX_POLICY, f"[tpu.promotion]\n{text}\n"), encoding="utf-8"
        )

    def promote(self, build: str = "", **config: object) -> dg.ExecuteInProcessResult:
        run_config = {
            "ops": {
                "tpu__floating_tag": {"config": {"action": "promote", "build": build[:8], **config}}
            }
        }
        return materialize(self.resources, ONLY_THE_MOVE, self.instance, run_config=run_config)

    def auto(self, cursor: str | None = None) -> dg.SensorResult:
        sensor = defs.resolve_sensor_def("auto_promote_sensor")
        with dg.build_sensor_context(
            cursor=cursor, instance=self.instance, resources=self.resources
        ) as context:
            result = sensor(context)
        assert isinstance(result, dg.SensorResult)
        return result

    def floating(self) -> str | None:
        return self.registry.resolve(repository=self.repository, reference=self.tag)

    def assert_refused_and_untouched(self, result: dg.ExecuteInProcessResult, says: str) -> None:
        assert not result.success and says in failure_message(result), failure_message(result)
        assert self.floating() == self.d1
        log = list(reversed(tag_history(self.instance)))
        # the refusal wrote no record, not even half of one
        assert [m.to_digest for m in log] == [self.d1]
        assert log_disagreement(log, self.floating()) is None

    def assert_auto_refused(self, says: str) -> dg.SensorResult:
        result = self.auto()
        assert not result.run_requests, result.run_requests
        assert says in (result.skip_reason.skip_message if result.skip_reason else ""), (
            result.skip_reason
        )
        assert self.floating() == self.d1
        return result


@pytest.fixture
def world(built: Built, tmp_path: Path) -> Iterator[World]:
    with dg.DagsterInstance.ephemeral() as instance:
        yield World(built, instance, tmp_path)


def test_a_build_still_soaking_is_refused_until_verified_plus_soak(world: World) -> None:
    w = world
    w.policy("soak_minutes = 120")
    verified = utc(next(v for v in verified_history(w.instance) if v.build == w.b2).verified_at)
    says = (
        f"soak: build {w.b2[:8]} was verified at {shown(verified)}, soak 120 min, promotable at "
        f"{shown(verified + timedelta(minutes=120))}"
    )
    w.assert_refused_and_untouched(w.promote(w.b2), says)
    first = w.assert_auto_refused(says)
    assert first.cursor is None  # kept: a later tick promotes it once it has soaked
    w.policy("soak_minutes = 0")
    later = w.auto()
    (request,) = later.run_requests
    assert request.run_config["ops"]["tpu__floating_tag"]["config"]["build"] == w.b2
    assert w.promote(w.b2).success and w.floating() == w.d2


def test_an_open_freeze_window_refuses_a_person_and_automation_naming_window_and_end(
    world: World,
) -> None:
    w = world
    now = datetime.now(UTC)
    end = (now + timedelta(hours=3)).replace(microsecond=0)
    w.policy(
        '[[tpu.promotion.freeze]]\nname = "q4-campaign"\nstart = '
        f"{shown(now - timedelta(hours=1))}\nend = {shown(end)}"
    )
    says = f"freeze: window 'q4-campaign' is open until {shown(end)}"
    w.assert_refused_and_untouched(w.promote(w.b2), says)
    w.assert_refused_and_untouched(w.promote(), says)  # the newest build, chosen by the run
    assert w.assert_auto_refused(says).cursor is None
    # not open now
    w.policy('[[tpu.promotion.freeze]]\nname = "weekly"\ncron = "0 0 1 1 *"\nduration_minutes = 1')
    assert w.promote(w.b2).success and w.floating() == w.d2


def test_override_freeze_needs_a_note_is_recorded_and_automation_never_overrides(
    world: World,
) -> None:
    w = world
    now = datetime.now(UTC)
    end = (now + timedelta(hours=3)).replace(microsecond=0)
    w.policy(
        '[[tpu.promotion.freeze]]\nname = "q4-campaign"\nstart = '
        f"{shown(now - timedelta(hours=1))}\nend = {shown(end)}"
    )
    w.assert_refused_and_untouched(
        w.promote(w.b2, override_freeze=True), "override_freeze needs a note"
    )
    w.assert_auto_refused("window 'q4-campaign' is open")
    through = w.promote(w.b2, override_freeze=True, note="eval fix the campaign needs (INC-42)")
    assert through.success, failure_message(through)
    assert w.floating() == w.d2
    record = metadata(through, FLOATING_TAG)
    assert record["override_freeze"] is True and record["freeze_window"] == "q4-campaign"
    assert (
        record["override_note"] == "eval fix the campaign needs (INC-42)"
        and record["to_digest"] == w.d2
    )
    assert record["freeze_until"] == end.timestamp()
    log = list(reversed(tag_history(w.instance)))
    assert log_disagreement(log, w.floating()) is None and [m.to_digest for m in log] == [
        w.d1,
        w.d2,
    ]


def test_a_rejected_build_is_promoted_by_nobody_until_released(world: World) -> None:
    w = world
    w.policy("soak_minutes = 0")
    job_config = {
        "ops": {
            "reject_build": {
                "config": {"build": w.b2[:10], "reason": "OOMs on v5e-8", "by": "ops@lab"}
            }
        }
    }
    rejected = reject_tpu_build.execute_in_process(
        run_config=job_config, instance=w.instance, resources={"site": w.resources["site"]}
    )
    assert rejected.success
    mark = rejections(w.instance)[w.b2]
    for build, says in (
        (w.b2, "already rejected (by ops@lab: OOMs on v5e-8): nothing recorded"),
        ("abcdef12", "build abcdef12 names no tpu_builds partitions"),
    ):
        again = {"ops": {"reject_build": {"config": {"build": build, "reason": "x", "by": "mia"}}}}
        twice = reject_tpu_build.execute_in_process(
            run_config=again,
            instance=w.instance,
            raise_on_error=False,
            resources={"site": w.resources["site"]},
        )
        assert not twice.success and says in failure_message(twice), failure_message(twice)
    # Shown on the build's own partition of tpu/verified_image.
    (obs,) = [
        r
        for r in w.instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=VERIFIED_IMAGE, asset_partitions=[w.b2]), limit=5
        ).records
    ]
    assert obs.asset_observation and obs.asset_observation.metadata["by"].value == "ops@lab"
    says = (
        f"reject: build {w.b2[:8]} was rejected by ops@lab at {shown(utc(mark.at))}: OOMs on v5e-8"
    )
    w.assert_refused_and_untouched(w.promote(w.b2), says)
    w.assert_refused_and_untouched(w.promote(w.b2, override_freeze=True, note="please"), says)
    skipped = w.assert_auto_refused(says)
    assert skipped.cursor is not None  # final for automation: the build is not judged again
    newest = w.promote()  # the newest build nobody rejected is build 1, already on the tag
    assert (
        not newest.success
        and "already points at" in failure_message(newest)
        and w.floating() == w.d1
    )
    release = {"ops": {"release_build": {"config": {"build": w.b2, "by": "ops@lab"}}}}
    assert release_tpu_build.execute_in_process(
        run_config=release, instance=w.instance, resources={"site": w.resources["site"]}
    ).success
    assert w.auto().run_requests and w.promote(w.b2).success and w.floating() == w.d2


def test_a_rollback_does_not_land_on_a_rejected_build_and_ignores_a_freeze(world: World) -> None:
    w = world
    assert w.promote(w.b2).success and w.floating() == w.d2
    w.policy(
        '[[tpu.promotion.freeze]]\nname = "q4-campaign"\nstart = '
        f"{shown(datetime.now(UTC) - timedelta(hours=1))}\n"
        f"end = {shown(datetime.now(UTC) + timedelta(hours=1))}"
    )
    reject = {
        "ops": {
            "reject_build": {"config": {"build": w.b1, "reason": "bad numbers", "by": "ops@lab"}}
        }
    }
    assert reject_tpu_build.execute_in_process(
        run_config=reject, instance=w.instance, resources={"site": w.resources["site"]}
    ).success
    refused = materialize(
        w.resources,
        ONLY_THE_MOVE,
        w.instance,
        run_config={"ops": {"tpu__floating_tag": {"config": {"action": "rollback"}}}},
    )
    assert not refused.success and "rollback target reject: build" in failure_message(refused)
    assert "rejected by ops@lab" in failure_message(refused) and w.floating() == w.d2
    assert [m.to_digest for m in reversed(tag_history(w.instance))] == [w.d1, w.d2]
    release = {"ops": {"release_build": {"config": {"build": w.b1, "by": "ops@lab"}}}}
    assert release_tpu_build.execute_in_process(
        run_config=release, instance=w.instance, resources={"site": w.resources["site"]}
    ).success
    rolled = materialize(
        w.resources,
        ONLY_THE_MOVE,
        w.instance,
        run_config={"ops": {"tpu__floating_tag": {"config": {"action": "rollback"}}}},
    )
    assert rolled.success, failure_message(rolled)  # during the freeze: a rollback is remedial
    assert w.floating() == w.d1


def test_lockstep_reject_and_release_from_the_command_line(built: Built, tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        w = World(built, instance, tmp_path)
        env = {"DAGSTER_HOME": str(home), "LOCKSTEP_SITE": str(w.site_file)}
        said = CliRunner().invoke(
            main, ["reject", w.b2[:12], "--reason", "bad eval numbers", "--by", "mia"], env=env
        )
        assert said.exit_code == 0, said.output
        assert "rejected by mia: bad eval numbers" in said.output
        twice = CliRunner().invoke(
            main, ["reject", w.b2[:12], "--reason", "again", "--by", "mia"], env=env
        )
        # a "no", not a failure
        assert twice.exit_code == 1 and "already rejected" in twice.output, twice.output
        w.assert_refused_and_untouched(w.promote(w.b2), "was rejected by mia")
        w.assert_auto_refused("was rejected by mia")
        freed = CliRunner().invoke(main, ["release", w.b2[:12], "--by", "mia"], env=env)
        assert freed.exit_code == 0 and "released by mia" in freed.output, freed.output
        assert w.promote(w.b2).success and w.floating() == w.d2
