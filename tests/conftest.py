"""Shared fixtures: a real sandbox (bare git repos +
a uv-made lock) per test, and the resources on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import git
import pytest

from resources.git import git_for
from resources.iris.cli import iris_for
from resources.registry import registry_for
from resources.signing import signer_for
from resources.site.load import load_site
from resources.site.resource import SiteResource
from resources.spark import spark_for
from resources.uv import UvCli
from sandbox.world import (
    AUTHOR,
    CONSUMER_BRANCH,
    SANDBOX_ATTEST_KEY_ENV,
    SANDBOX_TOKEN_ENV,
    SANDBOX_TOKEN_VALUE,
    Sandbox,
    sandbox_attest_key,
    up,
)
from tests.support.registry_server import RegistryServer, running_registry


@pytest.fixture(scope="module")
def registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A real docker-registry on 127.0.0.1 for the module's tests, stopped by PID after them."""
    with running_registry(tmp_path_factory.mktemp("docker-registry")) as server:
        yield server


@pytest.fixture(autouse=True)
def private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Nothing a test does lands in ~/.cache/lockstep
    (the registry's blob cache follows LOCKSTEP_CACHE)."""
    cache = tmp_path_factory.mktemp("lockstep-cache")
    monkeypatch.setenv("LOCKSTEP_CACHE", str(cache))
    return cache


@pytest.fixture(autouse=True, scope="session")
def sandbox_push_token() -> Iterator[str]:
    """The sandbox's build script requires a push
    token, as the real one does (`lockstep demo` sets it
    too). Session-wide: module-scoped fixtures build images before any test-scoped fixture runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SANDBOX_TOKEN_ENV, SANDBOX_TOKEN_VALUE)
        # the sandbox signs its verified builds
        mp.setenv(SANDBOX_ATTEST_KEY_ENV, sandbox_attest_key())
        yield SANDBOX_TOKEN_VALUE


@pytest.fixture(autouse=True, scope="session")
def stop_leftover_sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module-scoped sandboxes, and those the CLI tests make, run engines and a git daemon until the
    session ends: stop whatever still runs under this
    session's temp dir, by the PIDs they recorded."""
    yield
    from sandbox.engines import stop_engines
    from sandbox.git_server import running_servers

    base = tmp_path_factory.getbasetemp()
    for server in running_servers(base):
        server.stop()
    stop_engines(base)


@pytest.fixture
def sb(tmp_path: Path) -> Iterator[Sandbox]:
    """A fresh sandbox; afterwards whatever its iris jobs
    and its nodes' containers still run (a lane keeps
    serving after a boot, by design) is stopped by the PIDs they recorded."""
    world = up(tmp_path / "sandbox")
    yield world
    stop_sandbox(world)


def stop_sandbox(world: Sandbox) -> list[str]:
    """What `lockstep sandbox down` does: iris jobs,
    the lane's containers, engines, the git daemon."""
    from sandbox.teardown import stop_sandbox as down

    return down(world.root)


def sandbox_resources(sb: Sandbox, cache: Path) -> dict[str, object]:
    """What both code locations' Definitions wire,
    built from the sandbox's site file (as at load)."""
    site = load_site(sb.site_file)
    return {
        "site": SiteResource(path=str(sb.site_file)),
        "git": git_for(site, cache_dir=str(cache), timeout_s=60),
        "uv": UvCli(timeout_s=120),
        "registry": registry_for(site),
        "iris": iris_for(site),
        "spark": spark_for(site),
        "attest_signer": signer_for(site),
    }


@pytest.fixture
def resources(sb: Sandbox, tmp_path: Path) -> dict[str, object]:
    return sandbox_resources(sb, tmp_path / "cache")


def remote_head(bare: Path, branch: str = CONSUMER_BRANCH) -> str:
    return git.Repo(bare).commit(branch).hexsha


def remote_file(bare: Path, path: str, ref: str = CONSUMER_BRANCH) -> str:
    # The file as git stores it: GitPython strips the last newline by default, and a lock
    # republished without it reads as cut short (jovian_assets/source_lock.py).
    return git.Repo(bare).git.show(f"{ref}:{path}", strip_newline_in_stdout=False)


def commit_count(bare: Path, branch: str = CONSUMER_BRANCH) -> int:
    return int(git.Repo(bare).git.rev_list("--count", branch))


@pytest.fixture
def push_repo(tmp_path: Path) -> Callable[..., str]:
    """Commit edits to a sandbox bare repo's branch as a teammate would; returns the new sha."""

    def push(
        bare: Path, branch: str, edit: Callable[[Path], None], message: str = "teammate edit"
    ) -> str:
        wt = tmp_path / f"teammate-{len(list(tmp_path.glob('teammate-*')))}"
        repo = git.Repo.clone_from(bare.as_uri(), wt, branch=branch)
        edit(wt)
        repo.git.add("-A")
        repo.index.commit(message, author=AUTHOR, committer=AUTHOR)
        repo.git.push("origin", f"HEAD:refs/heads/{branch}")
        return repo.head.commit.hexsha

    return push


@pytest.fixture
def push_consumer(push_repo: Callable[..., str]) -> Callable[..., str]:
    """Commit edits to the sandbox consumer repo as a teammate would; returns the new sha."""

    def push(sb: Sandbox, edit: Callable[[Path], None], message: str = "teammate edit") -> str:
        return push_repo(sb.consumer, CONSUMER_BRANCH, edit, message)

    return push


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked `heavy` (minutes each: a browser,
    the daemon, the real iris controller) run first, so
    `-n` workers start on them and the quick modules fill in around them."""

    def weight(item: pytest.Item) -> float:
        mark = item.get_closest_marker("heavy")
        return -float(mark.args[0]) if mark else 0.0

    # stable, one weight per module: each module's tests stay together, in order
    items.sort(key=weight)


def pytest_configure(config: pytest.Config) -> None:
    """The controller marks the session: every process
    it, its workers and its tests start inherits the
    token, so whatever still carries it at the end has leaked (tests/support/leaks.py)."""
    from tests.support.leaks import mark_session

    if not hasattr(config, "workerinput"):
        config.stash[_SESSION_TOKEN] = mark_session()


_SESSION_TOKEN = pytest.StashKey[str]()
_LEAKS = pytest.StashKey[list[str]]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand the counts to the
    controller, which prints the summary. On the controller:
    the leak check: a process the session started that
    still runs is stopped, named, and fails the run."""
    from tests.support.leaks import check
    from tests.support.report import COUNTS

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["lockstep_counts"] = dict(COUNTS)
        return
    token = session.config.stash.get(_SESSION_TOKEN, None)
    leaks = check(token) if token else []
    if leaks:
        session.config.stash[_LEAKS] = [str(leak) for leak in leaks]
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    from tests.support.report import COUNTS

    COUNTS.update(getattr(node, "workeroutput", {}).get("lockstep_counts", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.support.report import COUNTS

    leaks = terminalreporter.config.stash.get(_LEAKS, [])
    if leaks:
        terminalreporter.section(
            "lockstep: processes the test session left running (stopped now)", red=True
        )
        for line in leaks:
            terminalreporter.write_line(f"LEAKED {line}")
        terminalreporter.write_line(
            "a test (or fixture) must stop what it starts, by PID: this run fails"
        )

    if COUNTS and not hasattr(terminalreporter.config, "workeroutput"):
        terminalreporter.section("lockstep: inputs tried")
        for what, n in sorted(COUNTS.items()):
            terminalreporter.write_line(f"{what}: {n}")
