"""The `jovian` code location: GPU serving images from
the lab's source locks (runbook 004_43dc16d711c37290)."""

import gc
from collections.abc import Mapping

import dagster as dg

# Importing dagster leaves ~110k long-lived objects, and the first full collection after it, which
# the imports below would set off, rescans them all: a sixth of loading a location. They live as
# long as the process does, so they go where no collection looks again.
gc.freeze()

from jovian_assets.adoption_assets import (
    build_profile,
    dep_table,
    dep_trees,
    fork_cut,
    source_lock,
)
from jovian_assets.bench_assets import bench_report
from jovian_assets.jobs import adopt_lab_rev, build_jovian_rev
from jovian_assets.keys import node_pool
from jovian_assets.lane_assets import lane, lane_serving
from jovian_assets.node_assets import build_image_asset, distributed_image
from jovian_assets.partitions import lab_revs
from resources.git import git_for
from resources.site.load import site_at_load
from resources.site.resource import location_owners, needs_site, site_resource, with_owners
from resources.site.schema import SiteConfig
from resources.spark import spark_for
from sensors.lab_revs import build_lab_rev_sensor
from sensors.lane_watch import build_lane_watch_sensor


def jovian_resources(site: SiteConfig | None) -> dict[str, object]:
    """The outside systems, built from the site file the location loaded (secrets as dg.EnvVar)."""
    return {
        "site": site_resource(site),
        "git": git_for(site),
        "spark": spark_for(site, env_vars=True) if site and site.spark else needs_site("spark"),
    }


def lab_sensor(resources: Mapping[str, object]) -> dg.SensorDefinition:
    """lab_rev_sensor over these resources' `site`
    and `git` objects (a tick initializes neither)."""
    return build_lab_rev_sensor(
        job_name=adopt_lab_rev.name,
        partitions_def=lab_revs,
        site=resources["site"],
        git=resources["git"],
    )


def build_defs(site: SiteConfig | None) -> dg.Definitions:
    """The location's definitions from the site file
    read at load: owners on every asset, `jovian/image`
    in the build node's pool (pools are fixed at definition time), the resources."""
    build_node = site.jovian.build_node if site and site.jovian else None
    image = build_image_asset(pool=node_pool(build_node or "build"))
    assets = [
        source_lock,
        fork_cut,
        build_profile,
        dep_table,
        dep_trees,
        image,
        distributed_image,
        lane_serving,
        bench_report,
        lane,
    ]
    resources = jovian_resources(site)
    return dg.Definitions(
        assets=with_owners(assets, location_owners(site, "jovian")),
        jobs=[adopt_lab_rev, build_jovian_rev],
        sensors=[lab_sensor(resources), build_lane_watch_sensor()],
        resources=resources,
    )


defs = build_defs(site_at_load())
