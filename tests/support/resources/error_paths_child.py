"""Run by tests/resources/test_error_paths.py in a fresh interpreter: load both code locations the
way a code server does, then call each resource against
a broken remote and print one JSON line per case.

Nothing else is imported before the calls, so a module that defers a client library (requests,
paramiko, GitPython) and still names it on an error path fails here with NameError, as it would in
a run worker; in a pytest process the test modules would have imported the library already.
Usage: error_paths_child.py '<json: ports, iris binaries, known_hosts>'
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import dagster  # noqa: F401  (first, as a code server imports it)

import jovian_assets.definitions as jovian
import tpu_assets.definitions as tpu

for defs in (tpu.defs, jovian.defs):
    defs.get_repository_def()
CLIENT_LIBRARIES = ("requests", "urllib3", "paramiko", "git")
print(json.dumps({"preloaded": [m for m in CLIENT_LIBRARIES if m in sys.modules]}), flush=True)

from resources.git import GitRemotes
from resources.iris.cli import IrisCli
from resources.registry import HttpRegistry
from resources.spark import SparkNodes

cfg = json.loads(sys.argv[1])
port = cfg["ports"]
DIGEST = "sha256:" + "0" * 64


def registry(name: str) -> HttpRegistry:
    # Short timeouts and budgets: each case fails in seconds; the retry path still runs (2 tries).
    return HttpRegistry(
        host=f"127.0.0.1:{port[name]}",
        timeout_s=2.0,
        retry_attempts=2,
        retry_budget_s=5.0,
        retry_base_s=0.01,
        retry_max_wait_s=0.05,
        blob_cache_bytes=0,
    )


def read_blob(name: str) -> int:
    with registry(name).open_blob(repository="team/img", digest=DIGEST) as blob:
        return len(blob.read())


def git(timeout_s: float = 3.0) -> GitRemotes:
    return GitRemotes(timeout_s=timeout_s, url_schemes=["git", "http"])


def iris(binary: str) -> IrisCli:
    return IrisCli(
        binary=binary,
        controller_url=f"http://127.0.0.1:{port['refused']}",
        user="lockstep",
        timeout_s=3.0,
    )


def spark(name: str) -> SparkNodes:
    node = {
        "name": "spark-1",
        "transport": "ssh",
        "host": "127.0.0.1",
        "port": port[name],
        "user": "lockstep",
    }
    return SparkNodes(
        nodes=[node], known_hosts=cfg["known_hosts"], connect_timeout_s=2.0, keepalive_s=0
    )


CASES: dict[str, Callable[[], object]] = {
    "registry refused: resolve": lambda: registry("refused").resolve(
        repository="team/img", reference="v1"
    ),
    "registry reset: manifest": lambda: registry("reset").manifest(
        repository="team/img", reference="v1"
    ),
    "registry slow: resolve": lambda: registry("silent").resolve(
        repository="team/img", reference="v1"
    ),
    "registry html 502: manifest": lambda: registry("html").manifest(
        repository="team/img", reference="v1"
    ),
    # HEAD of the blob: 404 (a read that says "not there"),
    # then the upload's POST: 404 with an HTML body.
    "registry html 404: push": lambda: registry("html").push_blob(
        repository="missing/img", data=b"x", media_type="application/octet-stream"
    ),
    "registry html 404: manifest": lambda: registry("html").manifest(
        repository="team/img", reference="missing"
    ),
    "registry html 404: absence": lambda: registry("html").absence(
        repository="team/img", reference="missing"
    ),
    "registry cut: blob": lambda: read_blob("cut"),
    "git refused: ls-remote": lambda: git().ls_remote(
        url=f"git://127.0.0.1:{port['refused']}/r.git", branch="main"
    ),
    "git silent: ls-remote": lambda: git().ls_remote(
        url=f"git://127.0.0.1:{port['silent']}/r.git", branch="main"
    ),
    "git html 502: ls-remote": lambda: git().ls_remote(
        url=f"http://127.0.0.1:{port['html']}/r.git", branch="main"
    ),
    "git refused: fetch": lambda: git().fetch(
        url=f"git://127.0.0.1:{port['refused']}/r.git", branches=["main"]
    ),
    "git silent: fetch": lambda: git().fetch(
        url=f"git://127.0.0.1:{port['silent']}/r.git", branches=["main"]
    ),
    "iris failing: listed": lambda: iris(cfg["iris_failing"]).listed(job_id="/lockstep/build"),
    "iris slow: listed": lambda: iris(cfg["iris_hanging"]).listed(job_id="/lockstep/build"),
    "iris missing: listed": lambda: iris(cfg["iris_missing"]).listed(job_id="/lockstep/build"),
    "ssh refused: run": lambda: spark("refused").run(node="spark-1", argv=["true"]),
    "ssh reset: run": lambda: spark("reset").run(node="spark-1", argv=["true"]),
    "ssh silent: run": lambda: spark("silent").run(node="spark-1", argv=["true"]),
}

for case, call in CASES.items():
    started = time.monotonic()
    try:
        result: dict[str, object] = {"returned": repr(call())}
    except BaseException as exc:  # noqa: BLE001  (the parent judges every kind, NameError above all)
        result = {
            "type": type(exc).__name__,
            "mro": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
        }
    print(
        json.dumps({"case": case, "seconds": round(time.monotonic() - started, 1), **result}),
        flush=True,
    )
