"""The `jovian` code location: GPU serving images from the lab's source locks (runbook 004_43dc16d711c37290)."""

import dagster as dg

from jovian_assets.assets import adopt_lab_rev, build_profile, dep_table, dep_trees, fork_cut, source_lock
from jovian_assets.node_assets import bench_report, distributed_image, image
from jovian_assets.partitions import lab_revs
from resources.git import GitRemotes
from resources.site import SiteResource
from sensors.lab_revs import build_lab_rev_sensor

build_jovian_rev = dg.define_asset_job(
    "build_jovian_rev",
    selection=dg.AssetSelection.assets(image, distributed_image, bench_report),
    description="Build an adopted rev on the build node, gate it, distribute it to the lane, bench it and file the report.",
)

defs = dg.Definitions(
    assets=[source_lock, fork_cut, build_profile, dep_table, dep_trees, image, distributed_image, bench_report],
    jobs=[adopt_lab_rev, build_jovian_rev],
    sensors=[build_lab_rev_sensor(job_name=adopt_lab_rev.name, partitions_def=lab_revs)],
    resources={"site": SiteResource(), "git": GitRemotes()},
)
