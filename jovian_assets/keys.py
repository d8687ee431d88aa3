"""The lane's asset keys, shared by the lane code (which reads the lane's history) and the assets.

Their own module, so the asset definitions do not load the lane code into every process that loads
the location (docs/PERFORMANCE.md, code-location load).
"""

import dagster as dg

LANE = dg.AssetKey(["jovian", "lane"])
LANE_SERVING = dg.AssetKey(["jovian", "lane_serving"])

# lane_watch_sensor's observation of LANE (sensors/lane_watch.py), read by lockstep/status (tpu location).
LANE_WATCH_SENSOR = "lane_watch_sensor"
LIVE_NODES = "live_nodes"  # node -> image ID its container runs, or null
LIVE_WHY = "live_why"  # node -> why it has no image ID (only the null ones)
OBSERVED_BY = "observed_by"
