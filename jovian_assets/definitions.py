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
from jovian_assets.node_assets import bench_report, distributed_image, image
from jovian_assets.partitions import lab_revs
from resources.git import GitRemotes
from resources.site import SiteResource, location_owners, with_owners
from sensors.lab_revs import build_lab_rev_sensor

build_jovian_rev = dg.define_asset_job(
    "build_jovian_rev",
    selection=dg.AssetSelection.assets(image, distributed_image, bench_report),
    description="Build an adopted rev on the build node, gate it, distribute it to the lane, bench it and file the report.",
)


def build_defs(owners: Sequence[str] = ()) -> dg.Definitions:
    """The location's definitions; `owners` (from the site file) go on every asset."""
    return dg.Definitions(
        assets=with_owners(
            [
                source_lock,
                fork_cut,
                build_profile,
                dep_table,
                dep_trees,
                image,
                distributed_image,
                bench_report,
            ],
            owners,
        ),
        jobs=[adopt_lab_rev, build_jovian_rev],
        sensors=[build_lab_rev_sensor(job_name=adopt_lab_rev.name, partitions_def=lab_revs)],
        resources={"site": SiteResource(), "git": GitRemotes()},
    )


defs = build_defs(location_owners("jovian"))
