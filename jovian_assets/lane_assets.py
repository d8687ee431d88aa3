"""`jovian/lane_serving`: the rev booted on the lane before it is benched; `jovian/lane`: what the
lane served after every boot and restore (its materializations are the lane's serving history).

The lane code (jovian_assets.lane) loads with the first run that boots, not with the location."""

import dagster as dg

from jovian_assets.asset_results import jovian_of, rev_of, string_table
from jovian_assets.keys import LANE, LANE_SERVING
from jovian_assets.models import LaneServing
from jovian_assets.node_build import Distribution
from jovian_assets.partitions import lab_revs
from resources.site.resource import SiteResource
from resources.spark import SparkNodes

lane = dg.AssetSpec(
    LANE,
    deps=[LANE_SERVING],
    group_name="jovian",
    kinds={"docker"},
    description=(
        "What the lane serves. Each materialization is one state it reached: `boot` (a rev "
        "started for its "
        "bench), `restore` (the image it served before put back: a rev that failed to boot or "
        "failed its "
        "quality gate) or `stop` (nothing to put back). Metadata: rev, tag, image ID, the image "
        "ID on each "
        "node, the reason, and what it served before. Recorded by the runs that change the lane; "
        "the "
        "history to read when choosing what the lane should serve."
    ),
)


@dg.asset(
    key=LANE_SERVING,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"ssh", "docker"},
    code_version="1",
    description=(
        "The rev's image serving on the lane: what the lane served is recorded (`docker "
        "container inspect` "
        "of `lockstep-<lane>` on the head), its container stopped, the recipe's serve command "
        "started "
        "detached with the rev's image on every lane node (`docker run -d`; the head binds the "
        "endpoint, the "
        "others run as headless workers), the head's log followed for the site's readiness lines "
        "and then "
        "`/v1/models` asked on the head, within the warm budget when every node's JIT cache was "
        "populated "
        "before the start, else the cold one. The image ID each container runs must be "
        "jovian/distributed_image's. "
        "A server that dies or times out fails with its log tail and exit code, and the lane "
        "gets its "
        "previous image back. The bench targets `base_url` on the head."
    ),
)
def lane_serving(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    spark: SparkNodes,
    distributed_image: Distribution,
) -> dg.Output[LaneServing]:
    from jovian_assets.lane import LaneBootFailed, boot_rev

    config = site.config()
    section = jovian_of(site).lane
    if section is None:
        raise LaneBootFailed(
            f"{config.path}: no [jovian.lane]: no lane to boot {rev_of(context)} on"
        )
    serving = boot_rev(
        context,
        spark,
        config,
        section,
        rev=rev_of(context),
        tag=distributed_image.tag,
        image_id=distributed_image.image_id,
    )
    return dg.Output(
        serving, data_version=dg.DataVersion(serving.image_id), metadata=serving_metadata(serving)
    )


def serving_metadata(serving: LaneServing) -> dict[str, dg.MetadataValue]:
    """What the UI shows on the asset: readiness, warm or cold, the image ID actually serving."""
    from jovian_assets.lane import ENDPOINT

    previous = serving.previous
    return {
        "served_image_id": dg.MetadataValue.text(serving.image_id),
        "start": dg.MetadataValue.text("warm" if serving.warm else "cold"),
        "seconds_to_endpoint": dg.MetadataValue.float(serving.seconds_to.get(ENDPOINT, 0.0)),
        "readiness": string_table(
            [{"mark": mark, "seconds": seconds} for mark, seconds in serving.seconds_to.items()],
            ["mark", "seconds"],
        ),
        "budget_s": dg.MetadataValue.float(serving.budget_s or 0.0),
        "nodes": string_table(
            [
                {
                    "node": n,
                    "image_id": i,
                    "jit_cache": "warm" if serving.jit_warm.get(n) else "cold",
                    "role": "head (endpoint)" if n == serving.bench_node else "worker",
                }
                for n, i in serving.nodes.items()
            ],
            ["node", "role", "image_id", "jit_cache"],
        ),
        "base_url": dg.MetadataValue.text(f"{serving.base_url} (on {serving.bench_node})"),
        "model": dg.MetadataValue.text(serving.model),
        "previous": dg.MetadataValue.text(
            f"{previous.tag} {previous.image_id} ({previous.rev or 'not booted by lockstep'})"
            if previous
            else "nothing"
        ),
    }
