"""What a run pod does, for tests/deploy/test_k8s_run_mounts.py: run inside a container that has
only the run pod's mounts, with the pod's environment (LOCKSTEP_SITE, LOCKSTEP_CACHE, DAGSTER_HOME).

    python -m tests.support.deploy.k8s_pod_entry adopt REV   # adopt_lab_rev's five assets, as its
    run does python -m tests.support.deploy.k8s_pod_entry build
    REV   # jovian/image's side of a build_jovian_rev run

Both use the jovian location's own Definitions (loaded from LOCKSTEP_SITE) and the instance at the
container's DAGSTER_HOME: the IO manager's values land in, and are read from, $DAGSTER_HOME/storage.
`build` does what `jovian/image` does before the build node is involved: load source_lock,
build_profile and dep_trees through the IO manager, check out the build repo through the git cache,
and stage the build context with the dep trees read from LOCKSTEP_CACHE. It prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import dagster as dg


def main(argv: list[str]) -> int:
    step, rev = argv
    # the image makes it; a base does not
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    from jovian_assets.definitions import defs
    from jovian_assets.keys import BUILD_PROFILE, DEP_TABLE, DEP_TREES, FORK_CUT, SOURCE_LOCK
    from jovian_assets.node_build import stage_build_dir
    from resources.site.load import load_site

    instance = dg.DagsterInstance.get()
    # Partitions live in the instance's database (Postgres on Kubernetes), not on the shared volume.
    instance.add_dynamic_partitions("lab_revs", [rev])
    if step == "adopt":
        result = dg.materialize(
            list(defs.assets or []),
            partition_key=rev,
            instance=instance,
            raise_on_error=False,
            selection=dg.AssetSelection.assets(
                SOURCE_LOCK, FORK_CUT, BUILD_PROFILE, DEP_TABLE, DEP_TREES
            ),
            resources=dict(defs.resources or {}),
        )
        print(
            json.dumps(
                {
                    "success": result.success,
                    "done": sorted(
                        e.asset_key.to_user_string()
                        for e in result.get_asset_materialization_events()
                    ),
                }
            )
        )
        return 0 if result.success else 1
    # A missing input raises here, as the fs IO manager does when a run step loads it.
    source_lock, profile, trees = (
        defs.load_asset_value(key, partition_key=rev, instance=instance)
        for key in (SOURCE_LOCK, BUILD_PROFILE, DEP_TREES)
    )
    site = load_site(Path(os.environ["LOCKSTEP_SITE"]))
    assert site.jovian is not None
    git = defs.resources["git"]  # type: ignore[index]
    with (
        git.checkout(url=site.jovian.build_repo, sha=profile.build_commit) as build,
        tempfile.TemporaryDirectory() as tmp,
    ):
        staged = Path(tmp) / "context"
        checksum = stage_build_dir(
            build_checkout=build.path,
            build_dir=profile.build_dir,
            deps_root=Path(trees.root),
            dest=staged,
        )
        deps = (
            sorted(p.name for p in (staged / "deps").iterdir())
            if (staged / "deps").is_dir()
            else []
        )
    print(
        json.dumps(
            {
                "success": True,
                "lock_rev": source_lock.rev,
                "deps_root": trees.root,
                "staged_deps": deps,
                "checksum": checksum,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
