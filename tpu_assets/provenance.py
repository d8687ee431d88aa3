"""The `tpu/verified_image` record as an in-toto Statement with a SLSA provenance predicate (pure)."""

from __future__ import annotations

from typing import Any

from resources.site import TpuSection
from tpu_assets.models import BuiltImage, Finding, SmokeResult


def slsa_statement(*, image: BuiltImage, tpu: TpuSection, findings: dict[str, Finding], smoke: SmokeResult) -> dict[str, Any]:
    """Subject digest, resolved dependencies with git commits, and what verified it (checks + smoke)."""
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": image.ref.rsplit(":", 1)[0], "digest": {"sha256": image.digest.removeprefix("sha256:")}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "lockstep/kaniko-on-iris@v1",
                "resolvedDependencies": [
                    {"uri": f"git+{tpu.consumer_repo}@refs/heads/{tpu.consumer_branch}",
                     "digest": {"gitCommit": image.consumer_commit}},
                    {"uri": f"git+{tpu.harbor_repo}", "name": tpu.harbor_package,
                     "digest": {"gitCommit": image.lock_pin.commit}},
                ],
            },
            "runDetails": {"builder": {"id": "lockstep/tpu/image"},
                           "metadata": {"invocationId": image.job_id or "reused"}},
        },
        "verification": {name: {"passed": f.passed, "summary": f.description} for name, f in findings.items()}
        | {"smoke": {"passed": True, "summary": f"job {smoke.job_id} {smoke.state}"}},
    }
