"""Fixtures of the TPU tests: a `Pipeline` on a fresh SQLite instance over the test's sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from sandbox.world import Sandbox
from tests.conftest import stop_sandbox
from tests.support.runs import Pipeline


@pytest.fixture
def pipeline(sb: Sandbox, resources: dict[str, object], tmp_path: Path) -> Iterator[Pipeline]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield Pipeline(sb, resources, instance)
    stop_sandbox(sb)
