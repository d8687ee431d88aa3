"""consumer_rebuild_sensor and auto_promote_sensor:
rebuild only for base layers; never promote over a hold."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from sandbox.world import Sandbox, advance_harbor
from tests.conftest import remote_head
from tests.support.runs import materialize
from tests.support.sensors import tick
from tpu_assets.history import FLOATING_TAG, VERIFIED_IMAGE
from tpu_assets.keys import HARBOR_LOCK
from tpu_assets.rebuild_policy import rebuild_reason


def set_policy(sb: Sandbox, rebuild_on_lock_change: bool) -> None:
    text = sb.site_file.read_text()
    sb.site_file.write_text(
        text.replace(
            "rebuild_on_lock_change = true",
            f"rebuild_on_lock_change = {str(rebuild_on_lock_change).lower()}",
        )
    )


def test_first_tick_builds_once_then_lock_only_moves_do_not_rebuild(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    set_policy(sb, False)
    instance = dg.DagsterInstance.ephemeral()
    first = tick("consumer_rebuild_sensor", resources, instance)
    (request,) = first.run_requests
    head = remote_head(sb.consumer)
    assert request.partition_key == head and request.run_key == f"build:{head}"
    assert first.dynamic_partitions_requests[0].partition_keys == [head]

    advance_harbor(sb.root)
    assert materialize(resources, [HARBOR_LOCK], instance).success  # a lock-only consumer commit
    after = tick("consumer_rebuild_sensor", resources, instance, cursor=first.cursor)
    assert not after.run_requests and "no rebuild" in after.skip_reason.skip_message  # type: ignore[union-attr]
    assert after.cursor == remote_head(sb.consumer)


def test_lock_moves_rebuild_when_the_site_asks(sb: Sandbox, resources: dict[str, object]) -> None:
    instance = dg.DagsterInstance.ephemeral()
    cursor = remote_head(sb.consumer)
    advance_harbor(sb.root)
    assert materialize(resources, [HARBOR_LOCK], instance).success
    result = tick("consumer_rebuild_sensor", resources, instance, cursor=cursor)
    (request,) = result.run_requests
    assert "rebuild_on_lock_change" in request.tags["lockstep/rebuild_reason"]


def test_base_layer_change_requests_a_build(
    sb: Sandbox, resources: dict[str, object], push_consumer
) -> None:
    set_policy(sb, False)
    instance = dg.DagsterInstance.ephemeral()
    cursor = remote_head(sb.consumer)

    def base_layer(wt: Path) -> None:
        p = wt / "docker/Dockerfile.tpu"
        text = p.read_text()
        assert "\nCOPY . /app\n" in text
        p.write_text(
            text.replace(
                "\nCOPY . /app\n", "\nRUN echo 'ulimit -n 65535' >> /etc/profile\n\nCOPY . /app\n"
            )
        )

    sha = push_consumer(sb, base_layer, "Dockerfile: raise the open files limit")
    (request,) = tick("consumer_rebuild_sensor", resources, instance, cursor=cursor).run_requests
    assert (
        request.partition_key == sha
        and "docker/Dockerfile.tpu outside the HARBOR_COMMIT line"
        in request.tags["lockstep/rebuild_reason"]
    )


def test_rebuild_reason_ignores_the_pin_line_only() -> None:
    a = {"d": "FROM x\nENV HARBOR_COMMIT=" + "a" * 40 + "\n", "s": "build", "uv.lock": "1"}
    b = {**a, "d": a["d"].replace("a" * 40, "b" * 40), "uv.lock": "2"}
    kw = {"dockerfile": "d", "build_script": "s", "package": "harbor"}
    assert rebuild_reason(old=a, new=b, rebuild_on_lock_change=False, **kw) is None
    assert rebuild_reason(old=a, new=b, rebuild_on_lock_change=True, **kw)
    assert "s" in (
        rebuild_reason(old=a, new={**a, "s": "build2"}, rebuild_on_lock_change=False, **kw) or ""
    )


def _verified_event(instance: dg.DagsterInstance, build: str) -> None:
    instance.add_dynamic_partitions("tpu_builds", [build])
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            VERIFIED_IMAGE,
            partition=build,
            metadata={"digest": "sha256:" + "1" * 64, "harbor_commit": "h" * 40},
        )
    )


def test_auto_promote_requests_promotion_but_never_over_a_hold(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    with dg.instance_for_test() as instance:
        _verified_event(instance, "c" * 40)
        off = tick("auto_promote_sensor", resources, instance)
        assert not off.run_requests and "auto_promote is off" in off.skip_reason.skip_message

        sb.site_file.write_text(
            sb.site_file.read_text().replace("auto_promote = false", "auto_promote = true")
        )
        _verified_event(instance, "e" * 40)
        (request,) = tick(
            "auto_promote_sensor", resources, instance, cursor=off.cursor
        ).run_requests
        assert request.run_config["ops"]["tpu__floating_tag"]["config"] == {
            "action": "promote",
            "build": "e" * 40,
            "note": "auto_promote",
        }

        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                FLOATING_TAG,
                metadata={
                    "action": "rollback",
                    "from_digest": "",
                    "to_digest": "sha256:" + "1" * 64,
                    "build": "",
                    "hold": True,
                },
            )
        )
        _verified_event(instance, "d" * 40)
        held = tick("auto_promote_sensor", resources, instance, cursor=off.cursor)
        assert not held.run_requests and "on hold" in held.skip_reason.skip_message
