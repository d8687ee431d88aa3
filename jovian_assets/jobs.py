"""Every job of the jovian location, selecting assets by key (naming a job loads no asset code).

Only jovian_assets/definitions.py puts them in the location; sensors name them by `.name`.
"""

import dagster as dg

from jovian_assets.keys import (
    BENCH,
    BUILD_PROFILE,
    DEP_TABLE,
    DEP_TREES,
    DISTRIBUTED,
    FORK_CUT,
    IMAGE,
    LANE_SERVING,
    SOURCE_LOCK,
)

# Non-idempotent: a retry would restart an hours-long build and file a second bench report.
NO_RETRIES = {"dagster/max_retries": "0"}

adopt_lab_rev = dg.define_asset_job(
    "adopt_lab_rev",
    selection=dg.AssetSelection.assets(SOURCE_LOCK, FORK_CUT, BUILD_PROFILE, DEP_TABLE, DEP_TREES),
    description=(
        "Adopt one lab rev: parse its lock, audit the fork cut, write the profile, re-sync the "
        "dep table, fetch the dep trees."
    ),
)
build_jovian_rev = dg.define_asset_job(
    "build_jovian_rev",
    selection=dg.AssetSelection.assets(IMAGE, DISTRIBUTED, LANE_SERVING, BENCH),
    tags=NO_RETRIES,
    description="Build an adopted rev on the build node, gate it, distribute it to the lane, "
    "boot it there, bench it and "
    "file the report.",
)
