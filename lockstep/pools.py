"""The Dagster pools a site needs, and setting them on an instance.

Every pool is set explicitly rather than left to the instance's `default_limit`: in Dagster 1.13 the
first daemon pass that meets a pool not yet in storage can dequeue two of its runs at once (it reads
the configured pools before it initializes the new one to the default).
"""

from __future__ import annotations

import dagster as dg

from jovian_assets.keys import node_pool
from resources.site.schema import SiteConfig
from tpu_assets.keys import IRIS_POOL
from tpu_assets.promotion import TAG_MOVES_POOL


def site_pools(site: SiteConfig, *, iris_builds: int) -> dict[str, int]:
    """Pool -> limit: one tag move at a time, `iris_builds`
    iris builds, one build per DGX build node."""
    pools = {TAG_MOVES_POOL: 1, IRIS_POOL: iris_builds}
    if site.jovian is not None and site.jovian.build_node is not None:
        pools[node_pool(site.jovian.build_node)] = 1
    if site.spark is not None:
        pools |= {node_pool(n.name): 1 for n in site.spark.nodes if "build" in n.roles}
    return pools


def apply_pools(instance: dg.DagsterInstance, pools: dict[str, int]) -> None:
    for pool, limit in pools.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
