"""The `tpu` code location the crash test's daemon serves (tests/tpu/test_floating_tag_log.py): the
real definitions (site from LOCKSTEP_SITE), with the registry swapped for HeldAfterPut, armed by the
file LOCKSTEP_TEST_ARM names, and one more sensor that submits the test's runs, so the test needs no
webserver: when `<arm>.submit` appears it is consumed and its text (a build) becomes two promote_tpu
runs of that build, executed in the run worker's own process (in_process), queued in that order."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from resources.registry import ImageRef
from resources.site.load import site_at_load
from tests.support.tpu.registries import ARM_ENV, HeldAfterPut
from tpu_assets.definitions import build_defs
from tpu_assets.jobs import promote_tpu


@dg.sensor(
    job=promote_tpu, minimum_interval_seconds=1, default_status=dg.DefaultSensorStatus.RUNNING
)
def submit_test_runs(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    submit = Path(f"{os.environ[ARM_ENV]}.submit")
    try:
        build = submit.read_text().strip()
    except FileNotFoundError:
        return dg.SkipReason("nothing to submit")
    submit.unlink()
    run_config = {
        "ops": {"tpu__floating_tag": {"config": {"action": "promote", "build": build}}},
        # the move runs in the run worker itself
        "execution": {"config": {"in_process": {}}},
    }
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(run_key=f"{context.cursor or ''}{n}", run_config=run_config)
            for n in ("first", "second")
        ],
        cursor="submitted",
    )


def _defs() -> dg.Definitions:
    site = site_at_load()
    assert site is not None, "LOCKSTEP_SITE must name the test's site file"
    real = build_defs(site)
    registry = HeldAfterPut(host=ImageRef.parse(site.tpu.image).registry, arm=os.environ[ARM_ENV])
    return dg.Definitions(
        assets=real.assets,
        asset_checks=real.asset_checks,
        jobs=real.jobs,
        sensors=[*(real.sensors or []), submit_test_runs],
        resources={**(real.resources or {}), "registry": registry},
    )


defs = _defs()
