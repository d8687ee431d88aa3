"""The `lab` fixture: the sandbox's Jovian side on a throw-away Dagster instance."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from sandbox.world import Sandbox
from tests.support.jovian.lab import Lab


@pytest.fixture
def lab(sb: Sandbox, resources: dict[str, object]) -> Iterator[Lab]:
    # What jovian/lane_serving started runs in the
    # nodes' engines: the `sb` fixture stops them by PID.
    with dg.instance_for_test() as instance:
        yield Lab(sb, {k: resources[k] for k in ("site", "git", "spark")}, instance)
