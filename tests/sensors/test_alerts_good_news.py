"""The good news reaches the webhooks once each: a promotion and a rollback (who acted, the
changelog), a verified build waiting for promotion, a failed WARN check, an adopted lab rev and a
filed bench (score and baseline), and a webhook's `events` keeps out what it does not list.

Every event is made for real, in-process, on one test instance: the sandbox's harbor is advanced,
re-locked, built, verified, promoted and rolled back (tests/support/runs.py), and a lab rev is
adopted, built, served and benched on the sandbox's Spark nodes (tests/support/jovian/lab.py). Two
real HTTP receivers on 127.0.0.1 take the posts: one webhook
without `events` (every kind), one that lists a few.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from jovian_assets.keys import BENCH, BUILD_PROFILE
from resources.changelog import ChangeCommit, CommitRange, changelog_metadata
from resources.site.alerts import ALL_KINDS, BAD_NEWS, GOOD_NEWS, AlertsSection, Webhook
from sandbox.jovian_world import new_lab_rev
from sandbox.world import Sandbox
from tests.support.alerts import SANDBOX_ALERTS, Receiver, Ticker
from tests.support.jovian.lab import Lab
from tests.support.runs import Pipeline, failure_message, materialize, metadata, two_verified_builds
from tpu_assets.alert_events import BENCH_REPORT, HARBOR_LOCK, alert_for, rev_adopted_alert
from tpu_assets.alert_events import BUILD_PROFILE as ALERTS_BUILD_PROFILE
from tpu_assets.harbor_hold import hold_entries
from tpu_assets.history import FLOATING_TAG

# seconds, about: two TPU builds, one Jovian build, serve and bench
pytestmark = pytest.mark.heavy(150)

ALL_ENV = "LOCKSTEP_TEST_ALERT_ALL"
PAGER_ENV = "LOCKSTEP_TEST_ALERT_PAGER"
# The pager lists `hold` and `check_warned`: it gets the rollback (which set the hold) and the WARN
# check, never a promotion, a waiting build, an adoption or a bench.
PAGER_EVENTS = 'events = ["hold", "check_warned"]'


def two_webhooks(sb: Sandbox) -> None:
    text = sb.site_file.read_text()
    assert SANDBOX_ALERTS in text
    sb.site_file.write_text(
        text.replace(
            SANDBOX_ALERTS,
            (
                '[alerts]\nbase_url = "http://dagster.example:3000"\n\n'
                f'[[alerts.webhook]]\nname = "everything"\nurl_env = "{ALL_ENV}"\n\n'
                f'[[alerts.webhook]]\nname = "pager"\nurl_env = "{PAGER_ENV}"\n{PAGER_EVENTS}\n'
            ),
        )
    )


@pytest.fixture
def hooks(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Receiver, Receiver]]:
    everything, pager = Receiver([]), Receiver([])
    two_webhooks(sb)
    monkeypatch.setenv(ALL_ENV, everything.url)
    monkeypatch.setenv(PAGER_ENV, pager.url)
    yield everything, pager
    everything.stop()
    pager.stop()


class Watch:
    """Ticks the alert sensor twice after each step; what each receiver got from those two ticks."""

    def __init__(self, tick: Ticker, everything: Receiver, pager: Receiver) -> None:
        self.tick, self.everything, self.pager = tick, everything, pager

    def step(self) -> tuple[list[str], list[str]]:
        before = len(self.everything.delivered), len(self.pager.delivered)
        self.tick()
        got = (
            [str(b["text"]) for b in self.everything.delivered[before[0] :]],
            [str(b["text"]) for b in self.pager.delivered[before[1] :]],
        )
        self.tick()  # a second tick delivers nothing again
        assert (len(self.everything.delivered), len(self.pager.delivered)) == (
            before[0] + len(got[0]),
            before[1] + len(got[1]),
        )
        return got


def one(texts: list[str], marker: str) -> str:
    found = [t for t in texts if marker in t]
    assert len(found) == 1, (marker, texts)
    return found[0]


def test_the_webhook_kinds_are_the_old_ones_plus_the_good_news_and_unset_means_all() -> None:
    assert set(ALL_KINDS) == {*BAD_NEWS, *GOOD_NEWS} and len(ALL_KINDS) == 11
    assert set(GOOD_NEWS) == {
        "promotion",
        "rollback",
        "verified_build_waiting",
        "rev_adopted",
        "bench_filed",
        "check_warned",
    }
    everything = Webhook(name="all", url_env="X")
    assert all(everything.wants(k) for k in ALL_KINDS)
    pager = Webhook(name="pager", url_env="X", events=["hold", "check_warned"])
    assert (
        pager.wants("rollback", "hold")
        and not pager.wants("rollback")
        and not pager.wants("promotion")
    )
    # The alert sensor runs in the tpu location and spells
    # the Jovian keys itself: they must be the same.
    assert (ALERTS_BUILD_PROFILE, BENCH_REPORT) == (BUILD_PROFILE, BENCH)


def entry(
    key: dg.AssetKey, metadata: dict[str, object], partition: str | None = None
) -> dg.EventLogEntry:
    """An event-log entry as the event log hands it
    back (written and read on a throw-away instance)."""
    with dg.instance_for_test() as instance:
        if partition is not None:
            instance.add_dynamic_partitions("p", [partition])
        instance.report_runless_asset_event(
            dg.AssetMaterialization(key, metadata=metadata, partition=partition)
        )  # type: ignore[arg-type]
        [record] = instance.fetch_materializations(key, limit=1).records
        return record.event_log_entry


def test_a_long_changelog_is_bounded_who_is_said_and_a_credential_in_a_note_is_not() -> None:
    base, target = "1" * 40, "2" * 40
    commits = [
        ChangeCommit(
            sha=str(i) * 40,
            subject=f"fix {i}\nbody",
            author="dev <d@x>",
            committed_at=datetime(2026, 12, 1, tzinfo=UTC),
        )
        for i in range(8)
    ]
    changes = changelog_metadata(
        [CommitRange(repo="harbor", base=base, target=target, added=commits, added_total=60)]
    )
    alerts = AlertsSection()
    alert = alert_for(
        alerts,
        entry(
            FLOATING_TAG,
            {
                "action": "promote",
                "from_digest": "sha256:" + "a" * 64,
                "to_digest": "sha256:" + "b" * 64,
                "build": "c" * 40,
                "hold": False,
                "note": "see https://bot:T0KEN-s3cret@git.example/x",
                **changes,
            },
        ),
        tag="tpu",
    )
    assert alert is not None and alert.kinds == ["promotion"]
    lines = alert.text.splitlines()
    assert lines[0] == (
        ":rocket: `:tpu` promoted to build `cccccccc` (who: not recorded): "
        "sha256:aaaaaaaaaaaa -> sha256:bbbbbbbbbbbb"
    )
    assert "T0KEN-s3cret" not in alert.text and "note: see https://***@git.example/x" in alert.text
    assert (
        "changelog: harbor 11111111 -> 22222222: 60 commits added (the first 50 listed, 10 more)"
        in lines
    )
    assert [line for line in lines if line.startswith("  + ")] == [
        f"  + `{str(i) * 8}` fix {i} (dev <d@x>)" for i in range(5)
    ]
    assert "  ... 55 more on the record" in lines and len(lines) == 10
    # A rollback that set the hold stands for a `hold`
    # too, so a webhook listing only `hold` still gets it.
    rollback = alert_for(
        alerts, entry(FLOATING_TAG, {"action": "rollback", "hold": True, "by": "bob"})
    )
    assert (
        rollback is not None
        and rollback.kinds == ["rollback", "hold"]
        and " by bob:" in rollback.text
    )
    released = alert_for(
        alerts,
        entry(
            HARBOR_LOCK,
            {**hold_entries(action="release_hold", held=False, reason="x"), "by": "carol"},
        ),
    )
    assert (
        released is not None
        and released.kind == "hold"
        and "harbor hold released by carol" in released.text
    )
    # A profile refused for an unknown key is not an adoption.
    assert (
        rev_adopted_alert(
            alerts, entry(BUILD_PROFILE, {"outcome": "NOT written: X is unknown"}, "r9")
        )
        is None
    )


def test_verified_promoted_rolled_back_and_a_warn_check_each_reach_the_webhooks_once(
    sb: Sandbox,
    resources: dict[str, object],
    hooks: tuple[Receiver, Receiver],
    tmp_path: Path,
) -> None:
    everything, pager = hooks
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        p = Pipeline(sb, resources, instance)
        watch = Watch(Ticker(sb, instance, tmp_path), everything, pager)
        watch.tick()  # starts at the present

        # Two builds verified, nothing of lockstep's at :tpu: each is waiting, once.
        (b1, b2), _ = two_verified_builds(p)
        got, paged = watch.step()
        assert paged == []
        waiting = [t for t in got if ":white_check_mark:" in t]
        assert len(waiting) == 2 and len(got) == 2, got
        for build, text in zip((b1, b2), waiting, strict=True):
            assert (
                f"build `{build[:8]}` verified" in text
                and "waiting: `:tpu` is at no verified build" in text
            )
            assert "Promotable now: run promote_tpu." in text
            assert (
                f"http://dagster.example:3000/assets/tpu/verified_image?partition={build}" in text
            )

        # A promote names who acted (the config's `by`),
        # the note and the changelog; its WARN check passes.
        promoted = p.tag("promote", by="alice", note="ship the export fix")
        assert promoted.success, failure_message(promoted)
        move = metadata(promoted, FLOATING_TAG)
        assert move["by"] == "alice" and move["action"] == "promote"
        logs = [e.user_message for e in instance.all_logs(promoted.run_id) if e.user_message]
        assert any(m.startswith("promote by alice: ship the export fix") for m in logs)
        got, paged = watch.step()
        assert paged == [] and len(got) == 1, got
        [promotion] = got
        assert f":rocket: `:tpu` promoted to build `{b2[:8]}` by alice" in promotion
        assert "note: ship the export fix" in promotion
        summary = str(move["changelog_summary"]).splitlines()[0]
        assert f"changelog: {summary}" in promotion
        assert "http://dagster.example:3000/assets/tpu/floating_tag" in promotion

        # A rollback launched with the `lockstep/by` run tag (no `by` in its config): who acted is
        # the tag; the image now bakes another harbor than the lock
        # pins, so the WARN check fails: one alert each.
        rolled = materialize(
            resources,
            [FLOATING_TAG],
            instance,
            tags={"lockstep/by": "bob"},
            run_config={
                "ops": {
                    "tpu__floating_tag": {
                        "config": {"action": "rollback", "build": b1, "scope": "image"}
                    }
                }
            },
        )
        assert rolled.success, failure_message(rolled)
        assert metadata(rolled, FLOATING_TAG)["by"] == "bob"
        got, paged = watch.step()
        assert len(got) == 2, got
        rollback = one(got, ":rewind:")
        assert (
            f"floating tag rollback to build `{b1[:8]}` by bob" in rollback
            and "HOLD set" in rollback
        )
        removed = int(metadata(rolled, FLOATING_TAG)["commits_removed"])  # type: ignore[call-overload]
        # the commits it takes away
        assert removed >= 1 and f"{removed} commit" in rollback and "\n  - `" in rollback
        warned = one(got, "WARN check")
        assert (
            "`floating_tag_bakes_locked_harbor` on `tpu/floating_tag`" in warned
            and "but uv.lock" in warned
        )
        assert "http://dagster.example:3000/assets/tpu/floating_tag?view=checks" in warned
        # The pager lists `hold` and `check_warned`: the rollback set the hold, so it gets that too.
        assert sorted(paged) == sorted(got)

        # b1 verified again is not news twice; the tag is at b1 now anyway.
        assert watch.step() == ([], [])


def test_an_adopted_rev_and_its_bench_reach_the_webhooks_once(
    sb: Sandbox,
    resources: dict[str, object],
    hooks: tuple[Receiver, Receiver],
    tmp_path: Path,
) -> None:
    everything, pager = hooks
    with dg.instance_for_test() as instance:
        lab = Lab(sb, {k: resources[k] for k in ("site", "git", "spark")}, instance)
        watch = Watch(Ticker(sb, instance, tmp_path), everything, pager)
        watch.tick()

        new_lab_rev(sb.root, "r28")
        result = lab.adopt("r28", build=True)
        assert result.success, failure_message(result)
        bench = [e for e in result.get_asset_materialization_events() if e.asset_key == BENCH]
        [bench_meta] = [
            {k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()}
            for e in bench
        ]
        got, paged = watch.step()
        assert paged == [] and len(got) == 2, got
        adopted = one(got, ":inbox_tray:")
        assert "lab rev `r28` adopted" in adopted and "build_jovian_rev" in adopted
        assert "http://dagster.example:3000/assets/jovian/build_profile?partition=r28" in adopted
        filed = one(got, ":bar_chart:")
        assert f"`r28` on lane `{bench_meta['lane']}` scores {bench_meta['score']}" in filed
        assert f"baseline {bench_meta['baseline']}" in filed and str(bench_meta["report"]) in filed

        # Adopting r28 again (the profile is unchanged) is not a second adoption.
        again = lab.adopt("r28")
        assert again.success, failure_message(again)
        assert watch.step() == ([], [])
