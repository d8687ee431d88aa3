"""lab_rev_sensor: one ls-remote of the lab branch per
tick; a new or changed lock starts one adoption."""

import dagster as dg

from jovian_assets.revs import LAB_COMMIT_TAG, lab_locks
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.site.resource import SiteResource
from sensors.tick_resources import (
    WatchedBranch,
    default_sensor_status,
    for_ticks,
    moved_tip,
    run_tick,
    site_config,
)


def build_lab_rev_sensor(
    *, job_name: str, partitions_def: dg.DynamicPartitionsDefinition, site: object, git: object
) -> dg.SensorDefinition:
    """The sensor over the location's `site` and `git` resource objects
    (sensors/tick_resources.py)."""
    site_res, git_res = (
        for_ticks(site, SiteResource, key="site"),
        for_ticks(git, GitRemotes, key="git"),
    )

    def _tick(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        jovian = site_config(site_res).jovian
        if jovian is None:
            return dg.SensorResult(skip_reason="the site has no [jovian] table")
        watched = WatchedBranch(repo=jovian.lab_repo, branch=jovian.lab_branch)
        tip, where = moved_tip(git_res, watched, context.cursor), watched.where
        try:
            # One shallow fetch of both commits the tick
            # lists: each fetch is a round trip to the lab.
            git_res.fetch(
                url=jovian.lab_repo,
                shas=[tip, *([context.cursor] if context.cursor else [])],
                depth=1,
            )
            locks = lab_locks(git_res, jovian, lab_commit=tip)
            # Only what changed since the last lab commit
            # seen: a new rev, or a lock whose blob moved.
            seen = (
                git_res.list_files(
                    url=jovian.lab_repo, sha=context.cursor, pattern=jovian.lock_glob
                )
                if context.cursor
                else {}
            )
        except LockstepError as exc:
            raise watched.unreadable(exc, context.cursor) from exc
        for bad in (entry for entry in locks if entry.error):
            context.log.warning(f"skipping {bad.path}: {bad.error}")
        good = [entry for entry in locks if entry.rev and seen.get(entry.path) != entry.blob]
        known = set(context.instance.get_dynamic_partitions(partitions_def.name))
        new_revs = sorted({entry.rev for entry in good if entry.rev not in known})  # type: ignore[misc]
        requests = [
            dg.RunRequest(
                run_key=f"{entry.rev}:{entry.blob}",
                partition_key=entry.rev,
                tags={LAB_COMMIT_TAG: tip, "lockstep/lock_path": entry.path},
            )
            for entry in good
        ]
        if not requests:
            return dg.SensorResult(
                cursor=tip,
                skip_reason=f"{where} moved to {tip[:12]} without a new or changed source lock",
            )
        return dg.SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=[partitions_def.build_add_request(new_revs)]
            if new_revs
            else [],
            cursor=tip,
        )

    @dg.sensor(
        name="lab_rev_sensor",
        job_name=job_name,
        minimum_interval_seconds=30,
        default_status=default_sensor_status(),
        description=(
            "Watches the lab's branch with one `git ls-remote` per tick; when it moved, a "
            "shallow fetch lists "
            "the source locks. A new rev adds a `lab_revs` partition; each lock that is new or "
            "changed since the "
            "last lab commit seen requests "
            f"`{job_name}` with run key `<rev>:<lock blob sha>`, so a lock is adopted exactly "
            "once. Reads the "
            "location's `site` and `git` resources as configured (a tick initializes no resource)."
        ),
    )
    def lab_rev_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return run_tick(site_res, lambda: _tick(context))

    return lab_rev_sensor
