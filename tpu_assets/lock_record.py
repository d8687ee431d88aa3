"""How a re-lock of harbor shows on `tpu/harbor_lock`'s
record: its metadata, shared by the re-lock and
the runtime pin of a rollback (tpu_assets/runtime_rollback.py)."""

from __future__ import annotations

import dagster as dg

from resources.links import commit_entries
from resources.site.schema import SiteConfig
from tpu_assets.models import HarborLock


def lock_metadata(lock: HarborLock, site: SiteConfig) -> dict[str, dg.MetadataValue]:
    b, a = lock.before, lock.after
    if lock.pushed:
        outcome = (
            f"Pushed **{lock.consumer_commit[:8]}** to `{lock.consumer_branch}` (was "
            f"{lock.consumer_base[:8]})."
        )
    else:
        outcome = (
            "Already at the harbor tip: nothing committed, nothing pushed. Consumer stays at "
            f"{lock.consumer_commit[:8]}."
        )
    if a.commit != lock.harbor_tip:
        outcome += (
            f" Note: uv locked {a.commit[:8]}, the branch tip lockstep saw was "
            f"{lock.harbor_tip[:8]}."
        )
    meta: dict[str, dg.MetadataValue] = {
        "outcome": dg.MetadataValue.md(outcome),
        "harbor_version": dg.MetadataValue.text(f"{b.version} -> {a.version}"),
        **commit_entries(
            site.links,
            "harbor_commit",
            site.tpu.harbor_repo,
            a.commit,
            text=f"{b.commit} -> {a.commit}",
        ),
        **commit_entries(
            site.links, "consumer_commit", site.tpu.consumer_repo, lock.consumer_commit
        ),
        "pushed": dg.MetadataValue.bool(lock.pushed),
        "dockerfile_pin": dg.MetadataValue.text(f"{lock.dockerfile}:{lock.dockerfile_line}"),
    }
    if lock.lock_diff:
        meta["lock_diff"] = dg.MetadataValue.md(f"```diff\n{lock.lock_diff}\n```")
    return meta
