"""`tpu/harbor_head` and `tpu/harbor_lock`: the runtime
gate for a harbor change is the consumer's uv.lock."""

import dagster as dg
from pydantic import Field

from resources.errors import Refused
from resources.git import GitRemotes
from resources.site.resource import SiteResource
from resources.uv import UvCli
from tpu_assets.harbor_hold import hold_entries, read_hold
from tpu_assets.history import BY, acted_by
from tpu_assets.keys import HARBOR_HEAD, HARBOR_LOCK
from tpu_assets.lock_checks import pins_agree, version_moved
from tpu_assets.lock_record import lock_metadata
from tpu_assets.models import Finding, HarborLock
from tpu_assets.partitions import tpu_builds
from tpu_assets.relock import relock_harbor
from tpu_assets.runtime_pin import release_runtime


class HarborLockConfig(dg.Config):
    release_hold: bool = Field(
        default=False,
        description=(
            "Release the harbor hold a runtime rollback set: follow the harbor branch again "
            "and re-lock to its tip."
        ),
    )
    by: str = Field(
        default="",
        description=(
            "release_hold: who releases it, kept on the record and named in the alert; empty: "
            "the run's "
            "`lockstep/by` tag, else its `dagster/user` tag."
        ),
    )


class HarborHeld(Refused):
    """A re-lock while a runtime rollback holds harbor
    (or a release with no hold); nothing was pushed."""


harbor_head = dg.AssetSpec(
    HARBOR_HEAD,
    group_name="tpu",
    kinds={"git"},
    description=(
        "The tip of the harbor fork's branch (site `[tpu].harbor_branch`), observed by "
        "`harbor_branch_sensor`. Its data version is the commit sha: when it changes, "
        "`tpu/harbor_lock` is stale."
    ),
)


@dg.asset(
    key=HARBOR_LOCK,
    deps=[HARBOR_HEAD],
    group_name="tpu",
    kinds={"uv", "git"},
    code_version="2",
    description=(
        "The consumer repo re-locked to the harbor tip: `uv lock --upgrade-package harbor` and the "
        "Dockerfile's `ENV HARBOR_COMMIT` set to the same sha, committed as one commit and pushed "
        "fast-forward only. This is what ships a harbor change to iris workers (they `uv sync "
        "--frozen` from the lock); an image rebuild does not. Already at the tip: nothing is "
        "pushed. "
        "Any failure pushes nothing. A runtime rollback (`rollback_tpu` scope runtime/both) "
        "records its pin "
        "here with `harbor_hold` true: re-locks are refused, and harbor_branch_sensor requests "
        "none, until "
        "`release_harbor_hold` re-locks to the tip."
    ),
)
def harbor_lock(
    context: dg.AssetExecutionContext,
    config: HarborLockConfig,
    site: SiteResource,
    git: GitRemotes,
    uv: UvCli,
) -> dg.Output[HarborLock]:
    cfg, held = site.config(), read_hold(context.instance, HARBOR_LOCK)
    if config.release_hold:
        if not held.held:
            raise HarborHeld(
                "there is no harbor hold to release (tpu/harbor_lock's newest record sets none): "
                "nothing was pushed"
            )
        lock = release_runtime(tpu=cfg.tpu, git=git, uv=uv, author=cfg.site.commit_author)
        by = acted_by(config.by, context.run.tags)
        context.log.info(f"harbor hold released by {by or 'nobody named (set `by` in the config)'}")
        hold = hold_entries(
            action="release_hold", held=False, reason=f"released (was: {held.reason})"
        ) | {BY: dg.MetadataValue.text(by)}
    else:
        if held.held:
            raise HarborHeld(
                f"harbor is on hold ({held.reason}): run release_harbor_hold to re-lock to the "
                "tip; "
                "nothing was pushed"
            )
        lock = relock_harbor(tpu=cfg.tpu, git=git, uv=uv, author=cfg.site.commit_author)
        hold = hold_entries(action="relock", held=False, reason="")
    # A re-lock adds its consumer commit as a build
    # partition: it can be built, though it need not be.
    if not context.instance.has_dynamic_partition(tpu_builds.name, lock.consumer_commit):
        context.instance.add_dynamic_partitions(tpu_builds.name, [lock.consumer_commit])
    context.log.info(
        f"harbor {lock.after.version} @ {lock.after.commit[:8]}; consumer "
        f"{lock.consumer_commit[:8]} (pushed={lock.pushed})"
    )
    return dg.Output(
        lock,
        data_version=dg.DataVersion(lock.consumer_commit),
        metadata=lock_metadata(lock, cfg) | hold,
    )


def _result(
    finding: Finding, severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR
) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=finding.passed,
        severity=severity,
        description=finding.description,
        metadata={k: dg.MetadataValue.text(v) for k, v in finding.facts.items()},
    )


@dg.asset_check(
    asset=HARBOR_LOCK,
    blocking=True,
    description=(
        "At the pushed consumer commit, uv.lock's harbor commit (what workers run) equals the "
        "Dockerfile's HARBOR_COMMIT (what the image bakes). Read from the remote, not from the run."
    ),
)
def lock_and_dockerfile_agree(
    lock: HarborLock, site: SiteResource, git: GitRemotes
) -> dg.AssetCheckResult:
    tpu = site.config().tpu
    at = {"url": tpu.consumer_repo, "sha": lock.consumer_commit}
    return _result(
        pins_agree(
            git.show_file(**at, path="uv.lock"), git.show_file(**at, path=tpu.dockerfile), tpu
        )
    )


@dg.asset_check(
    asset=HARBOR_LOCK,
    description=(
        "When harbor's commit moved, its version moved too. WARN otherwise: a same-version change "
        "can be served from a stale cached wheel (runbook §2, c49064a8)."
    ),
)
def harbor_version_moved(lock: HarborLock) -> dg.AssetCheckResult:
    return _result(version_moved(lock), dg.AssetCheckSeverity.WARN)


@dg.asset_check(
    asset=HARBOR_LOCK,
    blocking=True,
    description="`uv lock --check` passes on a fresh checkout of the pushed consumer commit.",
)
def uv_lock_check(
    lock: HarborLock, site: SiteResource, git: GitRemotes, uv: UvCli
) -> dg.AssetCheckResult:
    tpu = site.config().tpu
    with git.checkout(url=tpu.consumer_repo, sha=lock.consumer_commit) as wt:
        result = uv.lock_check(project_dir=wt.path)
    return dg.AssetCheckResult(
        passed=result.ok,
        description=f"uv lock --check exit {result.exit_code} at {lock.consumer_commit[:8]}",
        metadata={"output": dg.MetadataValue.md(f"```\n{result.output[-3000:]}\n```")},
    )
