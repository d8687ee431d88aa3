"""A tpu sensor tick over a bad site file skips with
the file:line message; it never crashes the tick."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from resources.git import GitRemotes
from resources.registry import LayoutRegistry
from resources.site.resource import SiteResource
from tpu_assets.definitions import consumer_rebuild_sensor, defs, harbor_sensor
from tpu_assets.history import VERIFIED_IMAGE

BAD = Path(__file__).resolve().parent.parent / "corpus" / "site" / "memory_lots.toml"
SENSORS = [
    "harbor_branch_sensor",
    "consumer_rebuild_sensor",
    "auto_promote_sensor",
    "floating_tag_watch",
    "alert_sensor",
    "status_sensor",
]


def test_a_bad_site_makes_every_tpu_tick_skip_naming_file_and_line(tmp_path: Path) -> None:
    resources = {
        "site": SiteResource(path=str(BAD)),
        "git": GitRemotes(cache_dir=str(tmp_path / "cache")),
        "registry": LayoutRegistry(root=str(tmp_path / "registry")),
    }
    # one instance for all six: each tick reads only the site
    with dg.instance_for_test() as instance:
        # auto_promote reads the site only once there is a verified build to judge.
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=VERIFIED_IMAGE, partition="a" * 40)
        )
        for name in SENSORS:
            # These two take the location's resource objects,
            # not the tick's (sensors/tick_resources.py).
            own = {
                "harbor_branch_sensor": harbor_sensor,
                "consumer_rebuild_sensor": consumer_rebuild_sensor,
            }
            sensor = own[name](resources) if name in own else defs.resolve_sensor_def(name)
            with dg.build_sensor_context(instance=instance, resources=resources) as context:
                result = sensor(context)
            reason = (
                result.skip_message
                if isinstance(result, dg.SkipReason)
                else result.skip_reason.skip_message
            )
            assert f"{BAD}:31: [iris] memory: memory 'lots'" in reason, (name, reason)
            assert not getattr(result, "run_requests", None), name
