"""`jovian/image`, `jovian/distributed_image`: build
on the Spark build node, gate, distribute to the
lane. All partitioned by `lab_revs` (the bench is jovian_assets/bench_assets.py)."""

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from jovian_assets.asset_results import check_result, jovian_of, rev_of, string_table
from jovian_assets.keys import BOOT_GATES, DEP_TREES, DISTRIBUTED, IMAGE, IMAGE_LABELED
from jovian_assets.models import AdoptedLock, BuildProfile, DepTrees
from jovian_assets.node_build import (
    Distribution,
    NodeBuildFailed,
    NodeImage,
    expected_pins,
    image_tag,
    inspect_image,
    label_finding,
    run_gates,
    stage_build_dir,
    wait_detached,
)
from jovian_assets.partitions import lab_revs
from resources.git import GitRemotes
from resources.heartbeat import Heartbeat, observe_start
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from resources.spark import SparkNodes


def _build_on_node(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    git: GitRemotes,
    spark: SparkNodes,
    source_lock: AdoptedLock,
    build_profile: BuildProfile,
    dep_trees: DepTrees,
) -> Iterator[dg.Output[NodeImage] | dg.AssetCheckResult]:
    config = site.config()
    jovian = jovian_of(site)
    if config.spark is None or jovian.build_node is None:
        raise NodeBuildFailed(
            f"{config.path}: [spark] nodes and [jovian].build_node are needed to build on a node"
        )
    rev, node = rev_of(context), jovian.build_node
    tag = image_tag(jovian.image_tag, rev)
    # A fresh context dir per attempt; log and lock
    # live beside it, never inside the shipped context.
    remote_dir = f"lockstep-builds/{rev}/{context.run.run_id[:8]}"
    started = time.monotonic()
    # dep_trees wrote its root through path_under; the build only reads it. It may sit under another
    # cache than this run's (adopted by one process,
    # built by another), so only its shape is held here.
    deps_root = Path(dep_trees.root)
    if dep_trees.rev != rev or deps_root.parts[-3:] != ("jovian", rev, "deps"):
        raise NodeBuildFailed(
            f"jovian/dep_trees says its trees for {dep_trees.rev!r} are at {dep_trees.root}, not "
            f".../jovian/{rev}/deps: re-run dep_trees for {rev}"
        )
    with (
        git.checkout(url=jovian.build_repo, sha=build_profile.build_commit) as build,
        tempfile.TemporaryDirectory() as tmp,
    ):
        staged = Path(tmp) / "context"
        checksum = stage_build_dir(
            build_checkout=build.path,
            build_dir=build_profile.build_dir,
            deps_root=deps_root,
            dest=staged,
        )
        spark.put_tree(node=node, local_dir=staged, remote_dir=f"{remote_dir}/context")
    argv = [
        "flock",
        "../../../.build.lock",
        "env",
        f"TAG={tag}",
        f"PROFILE={rev}",
        f"BUILD_DIR_CHECKSUM={checksum}",
        *jovian.build_command,
    ]
    handle = spark.start_detached(
        node=node, argv=argv, log=f"{remote_dir}/build.log", cwd=f"{remote_dir}/context"
    )
    observe_start(
        context,
        {"node": node, "pid": str(handle.pid), "build_log": handle.log},
        what=f"build started on {node} (build_log is relative to its login directory)",
    )
    code = wait_detached(
        spark,
        handle,
        timeout_s=jovian.build_timeout_s,
        poll_s=jovian.poll_s,
        heartbeat=step_heartbeat(
            config, f"build of {tag} on {node}", jovian.build_timeout_s, context
        ),
    )
    tail = spark.tail(handle=handle, lines=40)
    if code != 0:
        raise NodeBuildFailed(
            f"build of {tag} on {node} exited {code}"
            + (" with no output (a dead pipe pump?)" if not tail.strip() else "")
            + f"; log tail:\n{tail}"
        )
    info = inspect_image(spark, node=node, tag=tag)
    labels = (info.get("Config") or {}).get("Labels") or {}
    gates_finding, gate_outputs = run_gates(
        spark, node=node, tag=tag, gates=jovian.boot_gates, lock=source_lock.lock
    )
    image = NodeImage(
        rev=rev,
        tag=tag,
        node=node,
        image_id=info["Id"],
        labels=labels,
        build_dir_checksum=checksum,
        duration_s=round(time.monotonic() - started, 1),
        log_tail=tail[-4000:],
        expected_pins=expected_pins(source_lock.lock),
        gates=gate_outputs,
    )
    yield dg.Output(
        image,
        data_version=dg.DataVersion(image.image_id),
        metadata={
            "tag": dg.MetadataValue.text(tag),
            "image_id": dg.MetadataValue.text(image.image_id),
            "node": dg.MetadataValue.text(node),
            "build_log": dg.MetadataValue.text(handle.log),
            "duration_s": dg.MetadataValue.float(image.duration_s),
            "build_dir_checksum": dg.MetadataValue.text(checksum),
            "expected_pins": string_table(
                [{"package": k, "pin": v} for k, v in image.expected_pins.items()],
                ["package", "pin"],
            ),
            "labels": dg.MetadataValue.json(labels),
            "log_tail": dg.MetadataValue.md(f"```\n{tail[-3000:]}\n```"),
            "boot_gates": string_table(
                [{"gate": g, **o} for g, o in gate_outputs.items()],
                ["gate", "exit", "stdout", "stderr"],
            ),
        },
    )
    yield check_result(IMAGE, BOOT_GATES, gates_finding)
    yield check_result(
        IMAGE, IMAGE_LABELED, label_finding(tag, labels, checksum), dg.AssetCheckSeverity.WARN
    )


def step_heartbeat(
    config: SiteConfig, step: str, budget_s: float | None, context: dg.AssetExecutionContext
) -> Heartbeat:
    """A long step's heartbeat in the run's log, every
    [timeouts] heartbeat_s, the site's secrets masked."""
    return Heartbeat.for_site(config, step, budget_s=budget_s, log=context.log.info)


def build_image_asset(pool: str) -> dg.AssetsDefinition:
    """`jovian/image` in the pool of the site's build
    node (pools are fixed when the location loads)."""

    @dg.asset(
        key=IMAGE,
        partitions_def=lab_revs,
        group_name="jovian",
        kinds={"ssh", "docker"},
        pool=pool,
        code_version="2",
        deps=[DEP_TREES],
        check_specs=[
            dg.AssetCheckSpec(
                BOOT_GATES,
                asset=IMAGE,
                blocking=True,
                description="Boot gates from the site (`docker run --rm --network none IMG "
                "python -c ...` on the build node): imports, "
                "the engine string carries the pin, the B12X enum resolves, nvfp4_ds_mla is "
                "present, the kernels "
                "are sm_121a (GB10), the sm12x patch set ran in full. Outputs kept.",
            ),
            dg.AssetCheckSpec(
                IMAGE_LABELED,
                asset=IMAGE,
                description=(
                    "WARN (informational STALE) when the image's sm121.checksum label is "
                    "missing (hand-built) or is not the build dir's checksum."
                ),
            ),
        ],
        description=(
            "The rev's image built on the build node over SSH: the build dir (versions.env, "
            "profiles/<rev>.env, "
            "the fetched dep trees) shipped as one verified tar stream, `TAG=... PROFILE=<rev> "
            "bash build.sh` started "
            "detached (setsid nohup, log to a file) and polled by pid and exit file until done, "
            "then `docker image inspect` "
            "for the image ID (the config digest) and labels. Builds never overlap on a node "
            "(one pool per node: `spark_node/<node>`, limit 1)."
        ),
    )
    def image(
        context: dg.AssetExecutionContext,
        site: SiteResource,
        git: GitRemotes,
        spark: SparkNodes,
        source_lock: AdoptedLock,
        build_profile: BuildProfile,
        dep_trees: DepTrees,
    ):
        yield from _build_on_node(context, site, git, spark, source_lock, build_profile, dep_trees)

    return image


@dg.asset(
    key=DISTRIBUTED,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"ssh", "docker"},
    code_version="1",
    description=(
        "The image on every lane node: ONE `docker save` on the build node streamed to every "
        "lane node's "
        '`docker load` in parallel (or, with [jovian] distribute = "relay", to the first lane '
        "node, each node "
        "forwarding to the next over its own ssh), then the image ID on each node compared with "
        "the built one (never a "
        "registry digest: `docker load` keeps only the config digest). A mismatch or partial "
        "load fails, naming the node."
    ),
)
def distributed_image(
    context: dg.AssetExecutionContext, site: SiteResource, spark: SparkNodes, image: NodeImage
) -> dg.Output[Distribution]:
    config = site.config()
    jovian = jovian_of(site)
    if jovian.lane is None:
        raise NodeBuildFailed(f"{config.path}: no [jovian.lane]: nothing to distribute to")
    from jovian_assets.node_build import distribute_image

    done = distribute_image(
        spark,
        image,
        nodes=jovian.lane.nodes,
        mode=jovian.distribute,
        heartbeat=step_heartbeat(config, f"distribution of {image.tag}", None, context),
    )
    return dg.Output(
        done,
        metadata={
            "image_id": dg.MetadataValue.text(image.image_id),
            "nodes": string_table(
                [{"node": n, "image_id": i} for n, i in done.nodes.items()], ["node", "image_id"]
            ),
            "bytes": dg.MetadataValue.int(done.bytes),
            "mode": dg.MetadataValue.text(done.mode),
        },
    )
