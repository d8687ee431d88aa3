"""The `tpu` code location the crash test's daemon serves: the real definitions (site from
LOCKSTEP_SITE), with the registry swapped for HeldAfterPut, armed by the file LOCKSTEP_TEST_ARM
names. Used by tests/tpu/test_floating_tag_log.py's run-monitoring test only."""

from __future__ import annotations

import os

import dagster as dg

from resources.registry import ImageRef
from resources.site import site_at_load
from tests.tpu.registries import ARM_ENV, HeldAfterPut
from tpu_assets.definitions import build_defs


def _defs() -> dg.Definitions:
    site = site_at_load()
    assert site is not None, "LOCKSTEP_SITE must name the test's site file"
    real = build_defs(site)
    registry = HeldAfterPut(host=ImageRef.parse(site.tpu.image).registry, arm=os.environ[ARM_ENV])
    return dg.Definitions(assets=real.assets, asset_checks=real.asset_checks, jobs=real.jobs, sensors=real.sensors,
                          resources={**(real.resources or {}), "registry": registry})


defs = _defs()
