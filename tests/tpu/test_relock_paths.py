"""A re-lock reads and writes only inside its checkout: a symlink the consumer repo commits cannot
point the Dockerfile (or the lock uv rewrites) at a file elsewhere on the machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.errors import FileFormatError
from resources.site.tpu import TpuSection
from tests.support.uv_lock import LOCK
from tpu_assets.relock import read_state

TPU = TpuSection(
    harbor_repo="file:///r/harbor.git",
    harbor_branch="main",
    harbor_package="Harbor_X",
    consumer_repo="https://example.invalid/consumer.git",
    consumer_branch="main",
    image="ghcr.io/org/image",
)


@pytest.mark.parametrize("linked", ["uv.lock", "pyproject.toml", "docker/Dockerfile.tpu"])
def test_a_symlink_out_of_the_checkout_is_refused_before_it_is_read(
    tmp_path: Path, linked: str
) -> None:
    wt, outside = tmp_path / "wt", tmp_path / "outside"
    (wt / "docker").mkdir(parents=True)
    outside.write_text("ARG HARBOR_COMMIT=" + "0" * 40 + "\n")
    (wt / "uv.lock").write_text(LOCK)
    (wt / "pyproject.toml").write_text(
        '[project]\nname = "c"\ndependencies = ["Harbor_X @ git+file:///r/harbor.git@main"]\n'
    )
    (wt / "docker/Dockerfile.tpu").write_text("ARG HARBOR_COMMIT=" + "0" * 40 + "\n")
    (wt / linked).unlink()
    (wt / linked).symlink_to(outside)
    with pytest.raises(FileFormatError, match=f"^{linked}: .*outside .*only inside the checkout"):
        read_state(wt, TPU)
    assert outside.read_text().startswith("ARG HARBOR_COMMIT=")
