"""The two-builds world of the floating-tag tests: a sandbox whose consumer was built and verified
twice (relock -> build -> checks -> smoke -> verified,
twice), made once per module, and what each test
world does with it: a site file with a floating tag
of its own, an instance that knows the two builds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from sandbox.world import Sandbox, up
from tests.conftest import sandbox_resources, stop_sandbox
from tests.support.runs import Pipeline, two_verified_builds


@dataclass(frozen=True)
class Built:
    sb: Sandbox
    repository: str
    records: list[dg.AssetMaterialization]  # the real verified_image records, oldest first
    builds: tuple[str, str]
    digests: dict[str, str]


@contextmanager
def two_builds(tmp: Path, registry: str | None = None) -> Iterator[Built]:
    """Two verified builds on a sandbox under `tmp`
    (pushing to `registry`, host:port, if given; else
    the sandbox's own), its jobs and engines stopped afterwards."""
    sb = up(tmp / "sandbox", registry=registry)
    with dg.instance_for_test() as instance:
        p = Pipeline(sb, sandbox_resources(sb, tmp / "cache"), instance)
        try:
            builds, records = two_verified_builds(p)
            yield Built(
                sb=sb,
                repository=p.repository,
                records=records,
                builds=(builds[0], builds[1]),
                digests={b: p.pinned(b) or "" for b in builds},
            )
        finally:
            stop_sandbox(sb)


def site_with_own_tag(built: Built, tag: str) -> Path:
    """A copy of the sandbox's site file whose floating
    tag is `tag`, next to the original (its relative
    paths hold), so that tests sharing the builds never move each other's tag."""
    site_file = built.sb.root / f"site-{tag}.toml"
    text = built.sb.site_file.read_text(encoding="utf-8")
    assert 'floating_tag = "tpu"' in text
    site_file.write_text(
        text.replace('floating_tag = "tpu"', f'floating_tag = "{tag}"'), encoding="utf-8"
    )
    return site_file


def record_builds(instance: dg.DagsterInstance, built: Built) -> None:
    """`instance` knows the two builds: their partitions and
    the same verified records the pipeline wrote, in order."""
    for record in built.records:
        if not instance.has_dynamic_partition("tpu_builds", record.partition or ""):
            instance.add_dynamic_partitions("tpu_builds", [record.partition or ""])
        instance.report_runless_asset_event(record)
