"""Every asset key and check name of the jovian location, declared once, and its pools' names.

Every module that names a key imports it from here: the assets that define them, the lane code
(which reads the lane's history), the sensors, the status and the alerts. Their own module, so
naming a key does not load the code that materializes it into every process that loads the location
(docs/PERFORMANCE.md, code-location load).
"""

import dagster as dg

SOURCE_LOCK = dg.AssetKey(["jovian", "source_lock"])
FORK_CUT = dg.AssetKey(["jovian", "fork_cut"])
BUILD_PROFILE = dg.AssetKey(["jovian", "build_profile"])
DEP_TABLE = dg.AssetKey(["jovian", "dep_table"])
DEP_TREES = dg.AssetKey(["jovian", "dep_trees"])
IMAGE = dg.AssetKey(["jovian", "image"])
DISTRIBUTED = dg.AssetKey(["jovian", "distributed_image"])
LANE = dg.AssetKey(["jovian", "lane"])
LANE_SERVING = dg.AssetKey(["jovian", "lane_serving"])
BENCH = dg.AssetKey(["jovian", "bench_report"])

# Check names. jovian/fork_cut's (judged by jovian_assets.fork_cut):
TREES_MATCH = "trees_match"
PINS_REACHABLE = "pins_reachable"
ONE_CUT = "one_cut"
NEWER_CUT = "newer_cut_available"
# jovian/build_profile's:
PROFILE_KEYS_KNOWN = "profile_keys_known"
RECIPES_TOP_LEVEL = "recipes_build_profile_top_level"
RECIPES_NO_SCATTERED_PINS = "recipes_no_scattered_pins"
GB10_DEVIATIONS_CURRENT = "gb10_deviations_current"
# jovian/dep_table's and jovian/dep_trees':
CUDA_PINS_GATED = "cuda_pins_gated"
CMAKE_PINS_RESOLVED = "cmake_pins_resolved"
GITLINKS_POPULATED = "gitlinks_populated"
# jovian/image's:
BOOT_GATES = "boot_gates"
IMAGE_LABELED = "image_labeled"
# jovian/bench_report's:
QUALITY_GATE = "quality_not_below_baseline"


def lane_container(lane: str) -> str:
    """The lane's serving container on every node: one
    fixed name per lane (jovian_assets/lane.py starts
    it, sensors/lane_watch.py reads it)."""
    return f"lockstep-{lane}"


def node_pool(node: str) -> str:
    """The Dagster pool of one DGX node: builds on a
    node run one at a time (instance default_limit 1)."""
    return f"spark_node/{node}"


# lane_watch_sensor's observation of LANE
# (sensors/lane_watch.py), read by lockstep/status (tpu location).
LANE_WATCH_SENSOR = "lane_watch_sensor"
LIVE_NODES = "live_nodes"  # node -> image ID its container runs, or null
LIVE_WHY = "live_why"  # node -> why it has no image ID (only the null ones)
OBSERVED_BY = "observed_by"
