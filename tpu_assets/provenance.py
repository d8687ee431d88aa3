"""The `tpu/verified_image` record as an in-toto
Statement with a SLSA provenance v1 predicate (pure).

The verification results ride in the predicate (`verification`, a lockstep extension field: SLSA
consumers ignore fields they do not know), so the signature over the statement covers them too.
"""

from __future__ import annotations

from typing import Any

from resources.attest import statement
from resources.site.tpu import TpuSection
from tpu_assets.models import BuiltImage, Finding, SmokeResult

CONSUMER_DEPENDENCY = "consumer"


def slsa_statement(
    *, image: BuiltImage, tpu: TpuSection, findings: dict[str, Finding], smoke: SmokeResult
) -> dict[str, Any]:
    """Subject digest, resolved dependencies with git
    commits, and what verified it (checks + smoke)."""
    predicate = {
        "buildDefinition": {
            "buildType": "lockstep/kaniko-on-iris@v1",
            "externalParameters": {
                "consumer": {
                    "repository": tpu.consumer_repo,
                    "branch": tpu.consumer_branch,
                    "commit": image.consumer_commit,
                }
            },
            "resolvedDependencies": [
                {
                    "uri": f"git+{tpu.consumer_repo}@refs/heads/{tpu.consumer_branch}",
                    "name": CONSUMER_DEPENDENCY,
                    "digest": {"gitCommit": image.consumer_commit},
                },
                {
                    "uri": f"git+{tpu.harbor_repo}",
                    "name": tpu.harbor_package,
                    "digest": {"gitCommit": image.lock_pin.commit},
                },
            ],
        },
        "runDetails": {
            "builder": {"id": "lockstep/tpu/image"},
            "metadata": {"invocationId": image.job_id or "reused"},
        },
        "verification": {
            name: {"passed": f.passed, "summary": f.description} for name, f in findings.items()
        }
        | {"smoke": {"passed": True, "summary": f"job {smoke.job_id} {smoke.state}"}},
    }
    return statement(
        subject_name=image.ref.rsplit(":", 1)[0], digest=image.digest, predicate=predicate
    )


def dependency_commit(predicate: dict[str, Any], name: str) -> str | None:
    """The gitCommit of the resolved dependency called `name`, or None."""
    deps = (predicate.get("buildDefinition") or {}).get("resolvedDependencies") or []
    for dep in deps:
        if isinstance(dep, dict) and dep.get("name") == name:
            commit = (dep.get("digest") or {}).get("gitCommit")
            return commit if isinstance(commit, str) else None
    return None
