"""One sensor tick, evaluated the way the daemon evaluates
it: `tick(name, resources, instance, cursor)`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import dagster as dg

from jovian_assets.definitions import lab_sensor
from tpu_assets.definitions import consumer_rebuild_sensor, defs, harbor_sensor

# Sensors built from the location's resource objects (sensors/tick_resources.py): a tick initializes
# neither `site` nor `git`, so they are handed to the factory, not to the context.
FACTORIES: dict[str, Callable[[Mapping[str, object]], dg.SensorDefinition]] = {
    "harbor_branch_sensor": harbor_sensor,
    "consumer_rebuild_sensor": consumer_rebuild_sensor,
    "lab_rev_sensor": lab_sensor,
}


def tick(
    name: str,
    resources: Mapping[str, object],
    instance: dg.DagsterInstance,
    cursor: str | None = None,
) -> dg.SensorResult:
    """One evaluation of sensor `name` on `instance` from `cursor`: a factory-built sensor over
    `resources`, any other TPU sensor resolved from
    the definitions with `resources` in its context."""
    factory = FACTORIES.get(name)
    if factory is not None:
        with dg.build_sensor_context(cursor=cursor, instance=instance) as context:
            return factory(resources)(context)  # type: ignore[return-value]
    with dg.build_sensor_context(
        cursor=cursor, instance=instance, resources=dict(resources)
    ) as context:
        return defs.resolve_sensor_def(name)(context)  # type: ignore[return-value]
