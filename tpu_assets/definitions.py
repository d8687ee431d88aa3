"""The `tpu` code location: the TPU runtime image graph (runbook 000_42bc23b59d697b5b)."""

import dagster as dg

from resources.git import GitRemotes
from resources.site import SiteResource
from resources.uv import UvCli
from sensors.harbor import build_harbor_branch_sensor
from tpu_assets.lock import HARBOR_HEAD, harbor_head, harbor_lock, harbor_version_moved, lock_and_dockerfile_agree, uv_lock_check

relock_harbor = dg.define_asset_job(
    "relock_harbor",
    selection=dg.AssetSelection.assets(harbor_lock),
    description="Re-lock harbor in the consumer repo (uv.lock + Dockerfile HARBOR_COMMIT), checked, pushed fast-forward.",
)

defs = dg.Definitions(
    assets=[harbor_head, harbor_lock],
    asset_checks=[lock_and_dockerfile_agree, harbor_version_moved, uv_lock_check],
    jobs=[relock_harbor],
    sensors=[build_harbor_branch_sensor(job_name=relock_harbor.name, observed=HARBOR_HEAD)],
    resources={"site": SiteResource(), "git": GitRemotes(), "uv": UvCli()},
)
