"""Every outside call ends at its deadline against
a hostile remote, with an error naming the remote.

Issue 25, item 2: a registry that drips its body one byte a second held a promote for over 100 s,
and a git remote that accepts the connection and never answers held a sensor tick past Dagster's 60
s limit. Here each hostile server (tests/support/fault_servers.py: a child process, stopped by its
PID) meets the resource a site file builds, with small deadlines set in that site's [timeouts] (or
[spark]) table. What is asserted is the outcome: the error (or the tick's skip reason) names the
remote and what to raise, the read was retried within its budget, and git left no process behind.
The pytest-timeout guard (pyproject) is the only clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from resources.git import GitRemotes, RemoteUnreachable, git_for
from resources.registry import RegistryError, transport
from resources.registry.backends import registry_for
from resources.site.load import load_site
from resources.site.resource import SiteResource
from resources.site.schema import SiteConfig
from resources.spark import spark_for
from resources.spark.results import SparkError
from sensors.harbor import build_harbor_branch_sensor
from tests.support.fault_servers import FaultServer, running
from tests.support.site_example import EXAMPLE, example_site

IMAGE_REPO = "open-thoughts/openthoughts-agent"


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[FaultServer]:
    with running("silent", tmp_path / "silent") as server:
        yield server


@pytest.fixture
def drip(tmp_path: Path) -> Iterator[FaultServer]:
    with running("drip", tmp_path / "drip") as server:
        yield server


def site_at(
    tmp_path: Path,
    *,
    harbor: str = "https://github.com/marin-community/harbor.git",
    image_host: str = "ghcr.io",
    spark_port: int | None = None,
    **timeouts: float,
) -> SiteConfig:
    """deploy/site.example.toml with git:// allowed,
    the harbor remote, the image's registry, dgx4 on
    127.0.0.1:`spark_port`, and `timeouts` written into
    its [timeouts] table (or [spark] for *_timeout_s)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    text = text.replace('url_schemes = ["https", "ssh"]', 'url_schemes = ["https", "ssh", "git"]')
    text = re.sub(r'(?m)^harbor_repo = "[^"]*"', f'harbor_repo = "{harbor}"', text)
    text = text.replace('image = "ghcr.io/', f'image = "{image_host}/')
    if spark_port is not None:
        text = text.replace(
            'host = "dgx4.lab.internal"', f'host = "127.0.0.1"\nport = {spark_port}'
        )
        text = text.replace(
            'known_hosts = "/etc/lockstep/ssh/known_hosts"', 'known_hosts = "known_hosts"'
        )
        text = re.sub(r"(?m)^key_path = .*$", "", text)
        (tmp_path / "site").mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / "known_hosts").write_text("")
    for key, value in timeouts.items():
        text, n = re.subn(rf"(?m)^{key} = [0-9.]+", f"{key} = {value}", text)
        assert n == 1, key
    return load_site(example_site(tmp_path / "site", text))


def leftovers(port: int) -> list[str]:
    """Command lines of git or ssh processes still
    running that name `port` (the kill took them all?)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if (
            state != "Z"
            and Path(argv[0]).name in ("git", "ssh")
            and any(str(port) in a for a in argv[1:])
        ):
            found.append(" ".join(argv))
    return found


def remotes(site: SiteConfig, tmp_path: Path) -> GitRemotes:
    return git_for(site, cache_dir=str(tmp_path / "cache"))


# -- git ------------------------------------------------------------------------------------------


def test_ls_remote_of_a_silent_git_daemon_is_killed_at_git_refs_s(
    silent: FaultServer, tmp_path: Path
) -> None:
    url = f"git://{silent.host}/harbor.git"
    git = remotes(site_at(tmp_path, git_refs_s=1.0), tmp_path)
    with pytest.raises(RemoteUnreachable) as info:
        git.ls_remote(url=url, branch="main")
    message = str(info.value)
    assert message.startswith(
        f"cannot reach {url}: timeout: git ls-remote did not complete in 1 secs"
    )
    assert "([timeouts] git_refs_s); git and its transport were killed" in message
    assert "or raise [timeouts] git_refs_s" in message
    assert leftovers(silent.port) == []


def test_ls_remote_of_a_silent_ssh_server_ends_at_ssh_connect_timeout(
    silent: FaultServer, tmp_path: Path
) -> None:
    url = f"ssh://{silent.host}/harbor.git"
    git = remotes(site_at(tmp_path, git_connect_s=1.0, git_refs_s=30.0), tmp_path)
    with pytest.raises(RemoteUnreachable) as info:
        git.ls_remote(url=url, branch="main")
    message = str(info.value)
    # ssh itself gave up (not the process deadline): its ConnectTimeout covers the banner exchange.
    assert message.startswith(f"cannot reach {url}: ") and "did not complete" not in message
    assert "timed out during banner exchange" in message and "[timeouts] git_connect_s" in message
    assert leftovers(silent.port) == []


def test_an_ssh_transport_outliving_the_deadline_is_killed_with_git(
    silent: FaultServer, tmp_path: Path
) -> None:
    url = f"ssh://{silent.host}/harbor.git"
    git = remotes(site_at(tmp_path, git_connect_s=10.0, git_refs_s=1.0), tmp_path)
    with pytest.raises(
        RemoteUnreachable,
        match=re.escape(f"cannot reach {url}: timeout: git ls-remote did not complete"),
    ):
        git.ls_remote(url=url, branch="main")
    assert leftovers(silent.port) == []  # ssh was in git's process group: killed with it


def test_fetch_from_a_silent_git_daemon_is_killed_at_git_transfer_s(
    silent: FaultServer, tmp_path: Path
) -> None:
    url = f"git://{silent.host}/harbor.git"
    git = remotes(site_at(tmp_path, git_transfer_s=1.0), tmp_path)
    with pytest.raises(RemoteUnreachable) as info:
        git.fetch(url=url, branches=["main"])
    assert str(info.value).startswith(
        f"cannot reach {url}: timeout: git fetch did not complete in 1 secs"
    )
    assert "or raise [timeouts] git_transfer_s" in str(info.value)
    assert leftovers(silent.port) == []


# -- a sensor tick ---------------------------------------------------------------------------------


def test_a_harbor_tick_against_a_silent_remote_skips_within_its_budget_naming_it(
    silent: FaultServer, tmp_path: Path
) -> None:
    url = f"git://{silent.host}/harbor.git"
    # git_refs_s stays long: only the tick's budget can end this ls-remote.
    site = site_at(tmp_path, harbor=url, sensor_tick_s=1.0, git_connect_s=0.5, git_refs_s=30.0)
    sensor = build_harbor_branch_sensor(
        job_name="relock",
        observed=dg.AssetKey("harbor_tip"),
        lock_key=dg.AssetKey("lock"),
        site=SiteResource(path=str(site.path)),
        git=remotes(site, tmp_path),
    )
    with (
        dg.DagsterInstance.ephemeral() as instance,
        dg.build_sensor_context(instance=instance, cursor="abc") as context,
    ):
        result = sensor(context)
    assert isinstance(result, dg.SensorResult) and not result.run_requests and result.cursor is None
    reason = result.skip_reason.skip_message if result.skip_reason else ""
    assert reason.startswith(
        f"cannot read main on {url}: cannot reach {url}: timeout: git ls-remote did not complete"
    )
    assert "the sensor tick's budget ([timeouts] sensor_tick_s), 1 s" in reason
    assert reason.endswith("(cursor kept at abc)")
    assert leftovers(silent.port) == []


# -- the registry ----------------------------------------------------------------------------------


def test_a_dripping_registry_body_fails_at_the_deadline_after_retries(
    drip: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[float] = []
    # the retries' waits are recorded, not waited
    monkeypatch.setattr(transport, "backoff_sleep", waited.append)
    registry = registry_for(site_at(tmp_path, image_host=drip.host, registry_request_s=1.0))
    with pytest.raises(RegistryError) as info:
        registry.manifest(repository=IMAGE_REPO, reference="v1")
    message = str(info.value)
    assert message.startswith(f"GET {drip.host}/{IMAGE_REPO}:v1: the download broke off at byte ")
    assert (
        f"{drip.host} sent " in message
        and "past the request's deadline ([timeouts] registry_request_s 1 s" in message
    )
    assert (
        "or raise [timeouts] registry_request_s" in message and "did not resume (5 tries" in message
    )
    gets = [r for r in drip.requests() if r == f"GET /v2/{IMAGE_REPO}/manifests/v1"]
    # retried within the retry budget (5 attempts), then given up
    assert len(gets) == 5 and len(waited) == 4


# -- Spark nodes -----------------------------------------------------------------------------------


def test_a_silent_spark_node_fails_at_connect_timeout_naming_the_node(
    silent: FaultServer, tmp_path: Path
) -> None:
    site = site_at(tmp_path, spark_port=silent.port, connect_timeout_s=1.0)
    with pytest.raises(SparkError) as info:
        spark_for(site).run(node="dgx4", argv=["true"])
    message = str(info.value)
    assert "dgx4" in message and str(silent.port) in message, message
    assert (
        "no answer within 1s ([spark] connect_timeout_s: connect, ssh banner, authentication)"
        in message
    )
