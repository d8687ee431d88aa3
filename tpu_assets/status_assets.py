"""`lockstep/status`: what is deployed where, an asset no run materializes; status_sensor
(sensors/status.py) and the refresh_status job record it as observations."""

import dagster as dg

from tpu_assets.keys import FLOATING_TAG, HARBOR_LOCK, STATUS, VERIFIED_IMAGE

status_spec = dg.AssetSpec(
    STATUS,
    deps=[FLOATING_TAG, VERIFIED_IMAGE, HARBOR_LOCK],
    group_name="tpu",  # each location's assets are in its own group (tests/test_graph_snapshot.py)
    kinds={"python"},
    description=(
        "What is deployed where, on one page: where `:tpu` is (its digest, build and the harbor it "
        "bakes), the harbor the consumer's uv.lock makes workers install (read live), the tag hold "
        "and the harbor hold, the newest verified build and whether a promote may take it now "
        "(soak, freeze, rejection, attestation) with its harbor changelog, the default rollback "
        "target and why, and the lane: its rev, the image ID each node serves against the rev's "
        "distributed one, ready since, last score against baseline. A WARNING line for each "
        "mismatch. Observed by status_sensor (each minute, recorded only when something changed) "
        "or at once by the refresh_status job; `lockstep status [--json]` prints the newest record."
    ),
)
