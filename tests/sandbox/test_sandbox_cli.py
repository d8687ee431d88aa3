"""`lockstep sandbox up` / `advance-harbor`: real
repos, idempotent, shaped like the runbook's world."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import git
import pytest
from click.testing import CliRunner

from lockstep.cli import main
from resources.site.load import load_site
from resources.uv import UvLock
from sandbox.harbor_source import BUG, FIX, GUARD
from sandbox.teardown import stop_sandbox
from tests.conftest import remote_file, remote_head


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """Where the test's sandbox lives; `sandbox up`
    starts its nodes' engines: stopped by PID after."""
    yield tmp_path / "sb"
    stop_sandbox(tmp_path / "sb")


def test_up_creates_real_repos_and_a_valid_site_and_is_idempotent(root: Path) -> None:
    run("sandbox", "up", "--dir", str(root))
    site = load_site(root / "site.toml")
    harbor, consumer = root / "repos/harbor.git", root / "repos/openthoughts-agent.git"
    assert site.tpu.harbor_repo == harbor.as_uri() and site.tpu.consumer_repo == consumer.as_uri()
    heads = (remote_head(harbor), remote_head(consumer))
    site_text = (root / "site.toml").read_text()

    run("sandbox", "up", "--dir", str(root))
    assert (remote_head(harbor), remote_head(consumer)) == heads
    assert (root / "site.toml").read_text() == site_text

    # The consumer locks harbor by branch, and its Dockerfile bakes the same commit.
    lock = UvLock.read(Path("uv.lock"), remote_file(consumer, "uv.lock"))
    pkg, src = lock.git_package("harbor")
    # The real consumer's shape: a direct reference following the branch, which uv locks as a rev.
    assert (pkg.version, src.rev, src.commit) == ("0.8.0", "penfever/working", heads[0])
    assert f'"harbor[daytona] @ git+{harbor.as_uri()}@penfever/working"' in remote_file(
        consumer, "pyproject.toml"
    )
    dockerfile = remote_file(consumer, "docker/Dockerfile.tpu")
    assert f"ENV HARBOR_COMMIT={heads[0]}" in dockerfile and "--force-reinstall" in dockerfile
    assert ': "${GITSHA:?' in remote_file(consumer, "docker/build_tpu_kaniko.sh")

    job = remote_file(harbor, "harbor/job.py", "penfever/working")
    lines = job.splitlines()
    guard = next(n for n, line in enumerate(lines, 1) if "existing_config != self.config" in line)
    raises = [n for n, line in enumerate(lines, 1) if "raise FileExistsError" in line]
    assert GUARD + BUG in job + "\n" and guard + 1 in raises  # the bug: a raise at the guard
    assert max(raises) - guard > 400  # and the legitimate per-trial raise far below


def test_up_makes_the_other_consumer_shape_when_asked(root: Path) -> None:
    run("sandbox", "up", "--dir", str(root), "--consumer-shape", "uv_source")
    consumer = root / "repos/openthoughts-agent.git"
    pyproject = remote_file(consumer, "pyproject.toml")
    assert (
        "[tool.uv.sources]" in pyproject
        and 'branch = "penfever/working"' in pyproject
        and "git+" not in pyproject
    )
    src = UvLock.read(Path("uv.lock"), remote_file(consumer, "uv.lock")).git_package("harbor")[1]
    assert (src.branch, src.rev) == ("penfever/working", None)


def test_advance_harbor_bumps_version_or_not_and_can_fix(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    harbor = root / "repos/harbor.git"
    sha = run("sandbox", "advance-harbor", "--dir", str(root)).strip()
    assert sha == remote_head(harbor, "penfever/working")
    assert 'version = "0.8.1"' in remote_file(harbor, "pyproject.toml", sha)

    same = run("sandbox", "advance-harbor", "--dir", str(root), "--no-version-bump").strip()
    assert 'version = "0.8.1"' in remote_file(harbor, "pyproject.toml", same)
    assert git.Repo(harbor).commit(same).parents[0].hexsha == sha

    fixed = run("sandbox", "advance-harbor", "--dir", str(root), "--fix").strip()
    job = remote_file(harbor, "harbor/job.py", fixed)
    assert GUARD + FIX in job + "\n" and "raise FileExistsError" in job  # the far raise stays
    assert 'version = "0.8.2"' in remote_file(harbor, "pyproject.toml", fixed)
