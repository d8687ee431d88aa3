"""The `lab` fixture: the sandbox's Jovian side on a throw-away Dagster instance."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from sandbox.fake_containers import stop_sandbox_containers
from sandbox.world import Sandbox
from tests.jovian.lab import Lab


@pytest.fixture
def lab(sb: Sandbox, resources: dict[str, object]) -> Iterator[Lab]:
    try:
        with dg.instance_for_test() as instance:
            yield Lab(sb, {k: resources[k] for k in ("site", "git", "spark")}, instance)
    finally:
        stop_sandbox_containers(sb.root)  # what jovian/lane_serving started, by the PIDs the nodes' docker recorded
