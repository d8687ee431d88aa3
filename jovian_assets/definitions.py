"""The `jovian` code location: GPU serving images from the lab's source locks (runbook 004_43dc16d711c37290)."""

from collections.abc import Sequence

import dagster as dg

from jovian_assets.assets import (
    adopt_lab_rev,
    build_profile,
    dep_table,
    dep_trees,
    fork_cut,
    source_lock,
)
from jovian_assets.node_assets import (
    BENCH,
    DISTRIBUTED,
    IMAGE,
    bench_report,
    build_image_asset,
    distributed_image,
    node_pool,
)
from jovian_assets.partitions import lab_revs
from resources.git import GitRemotes
from resources.site import SiteResource, location_owners, site_at_load, with_owners
from sensors.lab_revs import build_lab_rev_sensor

# Non-idempotent: a retry would restart an hours-long build and file a second bench report.
NO_RETRIES = {"dagster/max_retries": "0"}

build_jovian_rev = dg.define_asset_job(
    "build_jovian_rev",
    selection=dg.AssetSelection.assets(IMAGE, DISTRIBUTED, BENCH),
    tags=NO_RETRIES,
    description="Build an adopted rev on the build node, gate it, distribute it to the lane, bench it and file the report.",
)


def build_defs(owners: Sequence[str] = (), build_node: str | None = None) -> dg.Definitions:
    """The location's definitions; `owners` go on every asset, and `jovian/image` is in `build_node`'s pool."""
    image = build_image_asset(pool=node_pool(build_node or "build"))
    assets = [
        source_lock,
        fork_cut,
        build_profile,
        dep_table,
        dep_trees,
        image,
        distributed_image,
        bench_report,
    ]
    return dg.Definitions(
        assets=with_owners(assets, owners),
        jobs=[adopt_lab_rev, build_jovian_rev],
        sensors=[build_lab_rev_sensor(job_name=adopt_lab_rev.name, partitions_def=lab_revs)],
        resources={"site": SiteResource(), "git": GitRemotes()},
    )


_site = site_at_load()  # read once: owners and the build node's pool both come from it
defs = build_defs(
    owners=location_owners(_site, "jovian"),
    build_node=_site.jovian.build_node if _site and _site.jovian else None,
)
