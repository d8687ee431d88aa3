"""The lane's asset keys, shared by the lane code (which reads the lane's history) and the assets.

Their own module, so the asset definitions do not load the lane code into every process that loads
the location (docs/PERFORMANCE.md, code-location load).
"""

import dagster as dg

LANE = dg.AssetKey(["jovian", "lane"])
LANE_SERVING = dg.AssetKey(["jovian", "lane_serving"])
