"""Every asset key and check name of the tpu location, declared once (plus `lockstep/status`'s key),
and the iris builds' pool name.

Every module that names a key imports it from here: the assets that define them, the plain modules
that read their history, the sensors and the alerts. Only dagster and the status model (pydantic)
load here, so naming a key never loads the code that
materializes it (docs/PERFORMANCE.md, code-location load).
"""

import dagster as dg

from lockstep.status_model import STATUS_PATH

IMAGE = dg.AssetKey(["tpu", "image"])
SMOKE = dg.AssetKey(["tpu", "smoke"])
VERIFIED_IMAGE = dg.AssetKey(["tpu", "verified_image"])
FLOATING_TAG = dg.AssetKey(["tpu", "floating_tag"])
HARBOR_HEAD = dg.AssetKey(["tpu", "harbor_head"])
HARBOR_LOCK = dg.AssetKey(["tpu", "harbor_lock"])
# lockstep/status: observed by status_sensor, read by `lockstep
# status` (which names it by STATUS_PATH, no dagster).
STATUS = dg.AssetKey(STATUS_PATH)

# iris builds at once: the cluster's quota, set per instance (`lockstep pools --iris-builds N`).
IRIS_POOL = "iris_builds"

# The checks `tpu/image` carries, judged by tpu_assets.inspection.
CHECK_INSTALLED = "installed_harbor_matches_lock"
CHECK_PROBES = "file_probes"
CHECK_LAYERS = "layers_pullable"
