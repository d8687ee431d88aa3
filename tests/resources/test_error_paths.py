"""Every resource's failure paths, driven in an
interpreter that loaded only what a code location loads.

The registry, git, iris and the Spark nodes are called against broken remotes on 127.0.0.1
(tests/support/broken_server.py: refused, reset, silent, an HTML error page, a body cut short) by
tests/support/resources/error_paths_child.py, a fresh interpreter that imported both definitions
modules and nothing else: the client libraries those modules defer (requests, paramiko, GitPython)
are not loaded yet, so an error path that names one it never imported raises NameError there, as it
did in a run (issue 25: `NameError: name 'requests' is not defined` on a registry's non-JSON error
body). What a person sees must be a lockstep error naming the remote (host:port) and what to do.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broken_server import BrokenServers, start_broken, stop_broken
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parents[1] / "support" / "resources" / "error_paths_child.py"

# case -> (the broken server it calls, the words its message must carry besides that server's
# 127.0.0.1:port: what failed and what to do). The iris cases name the controller (a refused port),
# or the binary that is not there.
RAISES = {
    "registry refused: resolve": ("refused", "cannot reach", "check the host"),
    "registry reset: manifest": ("reset", "cannot reach", "reachable from here"),
    "registry slow: resolve": ("silent", "no answer", "raise timeout_s"),
    "registry html 502: manifest": ("html", "HTTP 502", "run again later"),
    "registry html 404: push": ("html", "HTTP 404", "could not start a blob upload"),
    "registry cut: blob": ("cut", "broke off", "check the network"),
    "git refused: ls-remote": ("refused", "cannot reach"),
    "git silent: ls-remote": ("silent", "cannot reach", "timeout"),
    "git html 502: ls-remote": ("html", "502"),
    "git refused: fetch": ("refused", "cannot reach"),
    "git silent: fetch": ("silent", "cannot reach", "did not complete"),
    "iris failing: listed": ("refused", "failed (exit 1)", "Connection refused"),
    "iris slow: listed": ("refused", "did not answer", "is the cluster reachable"),
    "iris missing: listed": ("iris binary", "cannot run the iris CLI", "set [iris] binary"),
    "ssh refused: run": ("refused", "cannot connect", "is the node up"),
    "ssh reset: run": ("reset", "is the node up"),
    "ssh silent: run": ("silent", "is the node up"),
}
# A 404 whose body is an HTML page is "not there",
# not an error (and must not be a NameError either).
RETURNS = {
    "registry html 404: manifest": "None",
    "registry html 404: absence": "'absent'",
}
PROJECT_ERRORS = {
    "registry": "RegistryError",
    "git": "GitError",
    "iris": "IrisError",
    "ssh": "SparkError",
}


@pytest.fixture(scope="module")
def broken() -> Iterator[BrokenServers]:
    server = start_broken()
    try:
        yield server
    finally:
        stop_broken(server)


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture(scope="module")
def outcomes(broken: BrokenServers, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("error-paths")
    home, cwd = tmp / "home", tmp / "cwd"
    home.mkdir()
    cwd.mkdir()
    (home / "known_hosts").write_text("")
    refused = free_port()
    cfg = {
        "ports": {**broken.ports, "refused": refused},
        "known_hosts": str(home / "known_hosts"),
        # A CLI whose controller is down (what the real one says after its retries), one that hangs.
        "iris_failing": _script(
            tmp / "iris-failing",
            f'echo "error: controller http://127.0.0.1:{refused}: '
            'Connection refused (os error 111)" >&2\nexit 1\n',
        ),
        "iris_hanging": _script(tmp / "iris-hanging", "exec sleep 60\n"),
        "iris_missing": str(tmp / "no-such-iris"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "DAGSTER_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        HOME=str(home),
        DAGSTER_HOME=str(home / "dagster"),
        LOCKSTEP_CACHE=str(home / "cache"),
        SSH_AUTH_SOCK="",
    )
    done = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(cfg)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines[0] == {"preloaded": []}, (
        "a location loaded a client library: this test would prove nothing"
    )
    names = {
        **{server: f"127.0.0.1:{p}" for server, p in cfg["ports"].items()},
        "iris binary": cfg["iris_missing"],
    }
    return {line["case"]: {**line, "names": names} for line in lines[1:]}


def test_every_case_ran(outcomes: dict[str, dict]) -> None:
    assert sorted(outcomes) == sorted([*RAISES, *RETURNS])


@pytest.mark.parametrize("case", sorted(RAISES))
def test_a_broken_remote_is_a_lockstep_error_naming_it(
    outcomes: dict[str, dict], case: str
) -> None:
    got = outcomes[case]
    assert "type" in got, f"{case}: expected an error, it returned {got.get('returned')}"
    assert "NameError" not in got["mro"] and "ImportError" not in got["mro"], (
        f"{case}: {got['type']}: {got['message']}"
    )
    assert "LockstepError" in got["mro"], f"{case}: raw {got['type']}: {got['message']}"
    assert PROJECT_ERRORS[case.split()[0]] in got["mro"], got
    server, *words = RAISES[case]
    assert got["names"][server] in got["message"], got["message"]
    for word in words:
        assert word in got["message"], f"{case}: {word!r} not in {got['message']!r}"
    assert "Traceback" not in got["message"]


@pytest.mark.parametrize("case", sorted(RETURNS))
def test_an_html_404_is_absent_not_a_crash(outcomes: dict[str, dict], case: str) -> None:
    got = outcomes[case]
    assert "type" not in got, f"{case}: {got.get('type')}: {got.get('message')}"
    assert got["returned"].startswith(RETURNS[case].rstrip("'")), got
