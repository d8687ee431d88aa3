"""The `tpu` code location: the TPU runtime image graph (runbook 000_42bc23b59d697b5b)."""

import gc
from collections.abc import Mapping

import dagster as dg

# Importing dagster leaves ~110k long-lived objects, and the first full collection after it, which
# the imports below would set off, rescans them all: a sixth of loading a location. They live as
# long as the process does, so they go where no collection looks again.
gc.freeze()

from resources.git import git_for
from resources.iris.cli import iris_for
from resources.registry import registry_for
from resources.signing import signer_for
from resources.site.load import site_at_load
from resources.site.resource import location_owners, needs_site, site_resource, with_owners
from resources.site.schema import SiteConfig
from resources.uv import UvCli
from sensors.alerts import build_alert_sensor
from sensors.floating_tag import build_floating_tag_watch
from sensors.harbor import build_harbor_branch_sensor
from sensors.status import build_status_sensor
from sensors.tpu_builds import build_auto_promote_sensor, build_consumer_rebuild_sensor
from tpu_assets.image_assets import image, smoke, verified_image
from tpu_assets.jobs import (
    build_tpu,
    promote_tpu,
    refresh_status,
    reject_tpu_build,
    release_harbor_hold,
    release_tpu_build,
    release_tpu_hold,
    relock_harbor,
    rollback_tpu,
)
from tpu_assets.keys import HARBOR_HEAD, HARBOR_LOCK
from tpu_assets.lock_assets import (
    harbor_head,
    harbor_lock,
    harbor_version_moved,
    lock_and_dockerfile_agree,
    uv_lock_check,
)
from tpu_assets.partitions import tpu_builds
from tpu_assets.promotion_assets import (
    floating_tag,
    floating_tag_bakes_locked_harbor,
)
from tpu_assets.status_assets import status_spec


def tpu_resources(site: SiteConfig | None) -> dict[str, object]:
    """The outside systems, built from the site file the location loaded (secrets as dg.EnvVar)."""
    return {
        "site": site_resource(site),
        "git": git_for(site),
        "uv": UvCli(),
        "registry": registry_for(site, env_vars=True) if site else needs_site("registry"),
        "iris": iris_for(site, env_vars=True) if site and site.iris else needs_site("iris"),
        "attest_signer": signer_for(site, env_vars=True),
    }


def harbor_sensor(resources: Mapping[str, object]) -> dg.SensorDefinition:
    """harbor_branch_sensor over these resources' `site`
    and `git` objects (a tick initializes neither)."""
    return build_harbor_branch_sensor(
        job_name=relock_harbor.name,
        observed=HARBOR_HEAD,
        lock_key=HARBOR_LOCK,
        site=resources["site"],
        git=resources["git"],
    )


def consumer_rebuild_sensor(resources: Mapping[str, object]) -> dg.SensorDefinition:
    """consumer_rebuild_sensor over these resources' `site`
    and `git` objects (a tick initializes neither)."""
    return build_consumer_rebuild_sensor(
        job_name=build_tpu.name,
        partitions_def=tpu_builds,
        site=resources["site"],
        git=resources["git"],
    )


def build_defs(site: SiteConfig | None) -> dg.Definitions:
    """The location's definitions from the site file
    read at load: owners on every asset, resources."""
    resources = tpu_resources(site)
    return dg.Definitions(
        assets=with_owners(
            [harbor_head, harbor_lock, image, smoke, verified_image, floating_tag, status_spec],
            location_owners(site, "tpu"),
        ),
        asset_checks=[
            lock_and_dockerfile_agree,
            harbor_version_moved,
            uv_lock_check,
            floating_tag_bakes_locked_harbor,
        ],
        jobs=[
            relock_harbor,
            release_harbor_hold,
            build_tpu,
            promote_tpu,
            rollback_tpu,
            release_tpu_hold,
            reject_tpu_build,
            release_tpu_build,
            refresh_status,
        ],
        sensors=[
            harbor_sensor(resources),
            consumer_rebuild_sensor(resources),
            build_auto_promote_sensor(job_name=promote_tpu.name),
            build_floating_tag_watch(),
            build_status_sensor(git=resources["git"]),
            # The one alert path (the event log is the instance's, not a location's: a second copy
            # would post every event twice).
            build_alert_sensor(),
        ],
        resources=resources,
    )


defs = build_defs(site_at_load())
