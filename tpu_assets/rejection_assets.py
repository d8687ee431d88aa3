"""The old import path of tpu_assets/rejection.py and the reject/release jobs, kept for tests and benches.

Product code imports tpu_assets.rejection (the logic) and tpu_assets.jobs (the jobs).
"""

from tpu_assets.jobs import reject_tpu_build, release_tpu_build
from tpu_assets.rejection import (
    now_utc,
    policy_gate,
    rejection_observation,
    rejections,
)

__all__ = ["now_utc", "policy_gate", "reject_tpu_build", "rejection_observation", "rejections", "release_tpu_build"]
