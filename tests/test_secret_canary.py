"""The secret canary: every secret the site names gets a unique random value, the full sandbox flows
run on them, and nothing lockstep wrote holds any of them, in any encoding a leak would take.

The site is the sandbox's, made to USE every secret it can name: the registry is a real
docker-registry with htpasswd basic auth (lockstep logs in with `[registry] token_env`; kaniko
pushes with the `[iris] docker_token_env` token the job gets as `-e DOCKER_TOKEN`), and lane node
spark-b is reached over a real sshd with a client key encrypted by `[spark] passphrase_env`. A flow
that succeeds on this site has read and used each value; one that got a value wrong fails.

Flows (one sandbox, one Dagster instance on SQLite with compute logs, for the whole module): TPU
relock -> a failing build (iris fault `fail`) -> build, verify, smoke -> promote -> relock -> a
build whose job prints its token (fault `leak`, which lockstep must catch and mask) -> build ->
promote -> rollback; Jovian adopt -> build -> distribute -> bench. Then tests/support/canary_scan.py
searches every file, SQLite row and git object under the module's directory (DAGSTER_HOME, the
sandbox, LOCKSTEP_CACHE, TMPDIR, the registry's storage).

What the simulated cluster itself keeps is not lockstep's writing and is left out, by rule, and then
shown to hold the leak: a job's log as iris stores it (the real iris does not mask; lockstep scans
what it reads) and the task container's own filesystem (where the build script writes its docker
login, as it does in its pod).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import secrets
import sqlite3
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import bcrypt
import dagster as dg
import pytest
import requests
import tomli_w
from cryptography.hazmat.primitives import serialization

from jovian_assets.definitions import jovian_resources
from jovian_assets.keys import DISTRIBUTED
from resources.site.load import load_site
from sandbox.fake_iris import queue_fault
from sandbox.jovian_world import new_lab_rev
from sandbox.teardown import stop_sandbox
from sandbox.world import (
    SANDBOX_ATTEST_KEY_ENV,
    SANDBOX_TOKEN_ENV,
    Sandbox,
    advance_harbor,
    up,
    use_iris_contract,
)
from tests.support.canary_scan import Canary, ScanReport, attest_key_canary, scan
from tests.support.jovian.lab import ASSETS as JOVIAN_ASSETS
from tests.support.jovian.lab import Lab, done
from tests.support.registry_server import RegistryServer, running_registry
from tests.support.report import count
from tests.support.runs import Pipeline, failure_message, metadata
from tests.support.sshd_server import SshdServer, running_sshd
from tpu_assets.definitions import tpu_resources

pytestmark = pytest.mark.heavy(100)  # seconds, about: the order parallel workers take modules in

REGISTRY_TOKEN_ENV = "LOCKSTEP_CANARY_REGISTRY_TOKEN"
PASSPHRASE_ENV = "LOCKSTEP_CANARY_SSH_PASSPHRASE"
REGISTRY_USER = "lockstep-reader"
PUSH_USER = "sandbox"  # the sandbox site's [iris] docker_user
SSH_NODE = "spark-b"
# Canary labels for a wrong value put in a secret's variable for one run (not variable names).
WRONG_REGISTRY_TOKEN = f"{REGISTRY_TOKEN_ENV} (wrong)"
WRONG_PASSPHRASE = f"{PASSPHRASE_ENV} (wrong)"
EVERYTHING = {
    "jovian/source_lock",
    "jovian/fork_cut",
    "jovian/build_profile",
    "jovian/dep_table",
    "jovian/dep_trees",
    "jovian/image",
    "jovian/distributed_image",
    "jovian/lane_serving",
    "jovian/lane",
    "jovian/bench_report",
}
# The cluster's own record of a job: its log, in jobs/<user>/<name>/, archive/<user>/<name>.<ms>/ or
# vanished/<name>.<ms>/ (sandbox/fake_iris_jobs.py). The task's own filesystem (root/, with the push
# login kaniko read) is not left out: it must be gone once the job ends, as a real container is.
_CLUSTER_SIDE = re.compile(r"/iris/(?:(?:jobs|archive)/[^/]+|vanished)/[^/]+/log$")


def canary_value(env: str) -> str:
    # The tail makes URL-encoding, JSON-escaping and base64 alignment each give a distinct form.
    return f'canary-{env.lower()}-{secrets.token_hex(12)}+&/"'


@dataclass
class World:
    base: Path
    sb: Sandbox
    home: Path
    registry: RegistryServer
    sshd: SshdServer
    canaries: list[Canary]
    outcomes: dict[str, dg.ExecuteInProcessResult]
    tpu: Pipeline

    def cluster_side(self, path: Path) -> bool:
        return (
            path.is_relative_to(self.sb.iris_home)
            and _CLUSTER_SIDE.search(path.as_posix()) is not None
        )


# The attestation key's canary is a real key (it must sign); its second PEM line, which holds
# private key bytes, is a canary of its own, so a leak of part of the key is found too.
ATTEST_KEY_LINE = f"{SANDBOX_ATTEST_KEY_ENV} (a line of its PEM)"


def _canaries() -> list[Canary]:
    """One per secret the site names, and a wrong value
    for two of them: the refusals must not echo it."""
    users = (REGISTRY_USER, PUSH_USER)
    attest = attest_key_canary()
    return [
        *(
            Canary(env=env, value=canary_value(env.split()[0]), users=users)
            for env in (
                REGISTRY_TOKEN_ENV,
                SANDBOX_TOKEN_ENV,
                PASSPHRASE_ENV,
                WRONG_REGISTRY_TOKEN,
                WRONG_PASSPHRASE,
            )
        ),
        Canary(env=SANDBOX_ATTEST_KEY_ENV, value=attest),
        Canary(env=ATTEST_KEY_LINE, value=attest.splitlines()[2]),
    ]


def _htpasswd(path: Path, logins: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # 4 rounds: the registry checks a bcrypt per request, and these are throw-away logins.
    path.write_text(
        "".join(
            f"{user}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
            for user, pw in logins.items()
        )
    )
    return path


def _client_key(root: Path, passphrase: str) -> None:
    """The client key sshd_server would make, but encrypted with the canary (make_keys keeps it)."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-a",
            "2",
            "-N",
            passphrase,
            "-C",
            "lockstep-canary",
            "-f",
            str(root / "client_ed25519"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _canary_site(sb: Sandbox, sshd: SshdServer, attest_key: str) -> None:
    """The sandbox site, naming a secret in every place a site can: registry login, push token, key
    passphrase, attestation signing key (trusted: its public half is the site's trusted key)."""
    data = tomllib.loads(sb.site_file.read_text())
    data["registry"].update(username=REGISTRY_USER, token_env=REGISTRY_TOKEN_ENV)
    public = serialization.load_pem_private_key(attest_key.encode(), password=None).public_key()
    data["attest"]["trusted_keys"] = [
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()
    ]
    spark = data["spark"]
    spark.update(
        known_hosts=str(sshd.known_hosts),
        key_path=str(sshd.client_key),
        passphrase_env=PASSPHRASE_ENV,
    )
    spark["nodes"] = [
        sshd.node(SSH_NODE, roles=["lane"]) if n["name"] == SSH_NODE else n for n in spark["nodes"]
    ]
    sb.site_file.write_text(tomli_w.dumps(data))
    site = load_site(sb.site_file)
    assert sorted(site.secret_env_names()) == sorted(
        [REGISTRY_TOKEN_ENV, SANDBOX_TOKEN_ENV, PASSPHRASE_ENV, SANDBOX_ATTEST_KEY_ENV]
    )
    use_iris_contract(sb.root, site.iris.sandbox_contract)  # type: ignore[union-attr]  # the pull secret


def _tpu_flows(p: Pipeline, out: dict[str, dg.ExecuteInProcessResult], wrong_token: str) -> None:
    advance_harbor(p.sb.root, fix=True)
    b1 = p.relock()
    queue_fault(p.sb.iris_home, "fail")
    out["failed build"] = p.build(b1)
    queue_fault(p.sb.iris_home, "push_fail")  # the script runs and writes its login; the push fails
    out["push refused"] = p.build(b1)
    out["build 1"] = p.build(b1)
    out["promote 1"] = p.tag("promote")
    advance_harbor(p.sb.root)
    b2 = p.relock()
    queue_fault(p.sb.iris_home, "leak")
    out["leaking build"] = p.build(b2)
    out["build 2"] = p.build(b2)
    out["promote 2"] = p.tag("promote")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(REGISTRY_TOKEN_ENV, wrong_token)
        out["rollback, wrong registry token"] = p.tag("rollback", build=b1[:8])
    out["rollback"] = p.tag("rollback", build=b1[:8])
    out["b1"], out["b2"] = b1, b2  # type: ignore[assignment]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("canary")
    canaries = _canaries()
    value = {c.env: c.value for c in canaries}
    with pytest.MonkeyPatch.context() as mp:
        for env, v in value.items():
            mp.setenv(env, v)
        mp.setenv("LOCKSTEP_CACHE", str(base / "cache"))
        # Whatever lockstep puts in a temp file lands
        # where the scan looks (and subprocesses follow).
        (base / "tmp").mkdir()
        mp.setenv("TMPDIR", str(base / "tmp"))
        mp.setattr(tempfile, "tempdir", str(base / "tmp"))
        _client_key(base / "sshd", value[PASSPHRASE_ENV])
        htpasswd = _htpasswd(
            base / "registry-auth" / "htpasswd",
            {REGISTRY_USER: value[REGISTRY_TOKEN_ENV], PUSH_USER: value[SANDBOX_TOKEN_ENV]},
        )
        with (
            running_registry(base / "registry", htpasswd=htpasswd) as registry,
            running_sshd(
                base / "sshd",
                extra_config=f"SetEnv PATH={base / 'sandbox/nodes' / SSH_NODE / 'bin'}"
                ":/usr/local/bin:/usr/bin:/bin "
                f"HOME={base / 'sandbox/nodes' / SSH_NODE / 'home'}\n",
            ) as sshd,
        ):
            sb = up(base / "sandbox", registry=registry.host)
            _canary_site(sb, sshd, value[SANDBOX_ATTEST_KEY_ENV])
            site = load_site(sb.site_file)
            home = base / "dagster_home"
            home.mkdir()
            (home / "dagster.yaml").write_text("")
            outcomes: dict[str, dg.ExecuteInProcessResult] = {}
            try:
                with dg.instance_for_test(temp_dir=str(home)) as instance:
                    # The Definitions' own wiring: every secret a dg.EnvVar, resolved in the run.
                    tpu = Pipeline(sb, tpu_resources(site), instance)
                    _tpu_flows(tpu, outcomes, value[WRONG_REGISTRY_TOKEN])
                    new_lab_rev(sb.root, "r28")
                    lab = Lab(sb, jovian_resources(site), instance)
                    outcomes["jovian"] = lab.adopt("r28", build=True)
                    with pytest.MonkeyPatch.context() as wrong:
                        wrong.setenv(PASSPHRASE_ENV, value[WRONG_PASSPHRASE])
                        outcomes["distribute, wrong passphrase"] = dg.materialize(
                            JOVIAN_ASSETS,
                            selection=[DISTRIBUTED],
                            partition_key="r28",
                            resources=lab.resources,
                            instance=instance,
                            raise_on_error=False,
                        )
                    yield World(
                        base=base,
                        sb=sb,
                        home=home,
                        registry=registry,
                        sshd=sshd,
                        canaries=canaries,
                        outcomes=outcomes,
                        tpu=tpu,
                    )
            finally:
                # iris jobs, the lane's containers, engines, the git daemon: by PID
                stop_sandbox(sb.root)


@pytest.fixture(scope="module")
def report(world: World) -> ScanReport:
    return scan(world.canaries, [world.base], exclude=world.cluster_side)


def test_every_flow_ran_and_used_every_secret(world: World) -> None:
    o = world.outcomes
    assert not o["failed build"].success and "ended failed" in failure_message(o["failed build"])
    assert not o["push refused"].success and "ended failed" in failure_message(o["push refused"])
    leak = failure_message(o["leaking build"])
    assert not o["leaking build"].success and f"contains the value of ${SANDBOX_TOKEN_ENV}" in leak
    for step in ("build 1", "promote 1", "build 2", "promote 2", "rollback", "jovian"):
        assert o[step].success, f"{step}: {failure_message(o[step])}"
    # Each promotion checked a signature made with the canary key (the only trusted one).
    assert str(metadata(o["promote 2"])["attestation"]).startswith("attested:")
    # A wrong value is refused naming its variable (and, by the scan, never echoed).
    assert not o["rollback, wrong registry token"].success
    assert REGISTRY_TOKEN_ENV in failure_message(o["rollback, wrong registry token"])
    assert not o["distribute, wrong passphrase"].success
    assert PASSPHRASE_ENV in failure_message(o["distribute, wrong passphrase"])
    assert done(o["jovian"]) == EVERYTHING
    p = world.tpu
    b1, b2 = str(o["b1"]), str(o["b2"])
    # The registry takes nobody without a login; kaniko's push and lockstep's tag moves got through.
    assert requests.get(f"http://{world.registry.host}/v2/", timeout=5).status_code == 401
    assert p.pinned(b1) and p.pinned(b2) and p.floating() == p.pinned(b1)
    assert metadata(o["rollback"])["from_digest"] == p.pinned(b2)
    # spark-b is the ssh node: the image reached it through a key only the canary passphrase opens.
    nodes = metadata(o["jovian"], dg.AssetKey(["jovian", "distributed_image"]))["nodes"]
    assert {r.data["node"] for r in nodes.records} == {"spark-a", SSH_NODE}  # type: ignore[attr-defined]
    wrong = subprocess.run(
        ["ssh-keygen", "-y", "-P", "", "-f", str(world.sshd.client_key)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert wrong.returncode != 0  # the key does not open without the passphrase


def test_nothing_lockstep_wrote_holds_a_canary(world: World, report: ScanReport) -> None:
    count("canary scan: files", report.files)
    count("canary scan: sqlite rows", report.sqlite_rows)
    count("canary scan: git objects", report.git_objects)
    count("canary occurrences", len(report.findings))
    assert report.files > 100 and report.sqlite_rows > 100 and report.git_objects > 100
    assert report.findings == [], json.dumps(report.by_canary(), indent=1)


def test_the_cluster_side_record_shows_the_leak_lockstep_masked(
    world: World, report: ScanReport
) -> None:
    """What was left out is only the cluster's own record,
    and it does hold the token: the leak was real."""
    assert report.excluded and all(world.cluster_side(p) for p in report.excluded)
    kept = scan(world.canaries, report.excluded)
    where = kept.by_canary()
    assert set(where) == {SANDBOX_TOKEN_ENV}, where  # only the push token went to the cluster
    logs = [
        w
        for w in where[SANDBOX_TOKEN_ENV]
        if w.startswith("file ") and "/log [" in w and "[raw]" in w
    ]
    assert len(logs) == 1 and "tpu-kaniko-" in logs[0]  # the leaking build's log, raw
    # and nothing else: no docker login outlived its job
    assert len(where[SANDBOX_TOKEN_ENV]) == 1, where


def _kaniko_jobs(world: World) -> list[tuple[Path, dict]]:
    """Every kaniko job the sandbox iris ran (current and archived records), with its state."""
    home = world.sb.iris_home
    states = [*home.glob("jobs/*/*/state.json"), *home.glob("archive/*/*/state.json")]
    return [
        (path.parent, s)
        for path in states
        if (s := json.loads(path.read_text()))["kind"] == "kaniko"
    ]


def test_the_scan_covered_the_job_area_after_finished_and_failed_kaniko_jobs(
    world: World, report: ScanReport
) -> None:
    """No secret outlives its job: a finished and a
    failed kaniko job (whose script wrote the push login)
    left only their record, and the scan above walked those very dirs after they had ended."""
    jobs = _kaniko_jobs(world)
    finished = [(jd, s) for jd, s in jobs if s["state"] == "succeeded"]
    failed = [(jd, s) for jd, s in jobs if s["state"] == "failed" and s["fault"] == "push_fail"]
    assert len(finished) >= 2 and len(failed) == 1, [
        (jd.name, s["state"], s["fault"]) for jd, s in jobs
    ]
    for jd, state in finished + failed:
        assert jd.resolve() in report.walked, jd  # the scan looked there...
        assert report.started_ms >= state["finished_at_ms"], jd  # ...after the job had ended
        # no root/, home/, rootfs/
        assert sorted(p.name for p in jd.iterdir() if p.is_dir()) == ["app"], jd
    assert not [p for p in world.sb.iris_home.rglob("config.json") if p.parent.name == ".docker"]
    ((failed_dir, _),) = failed
    # it got as far as the push
    assert "UNAUTHORIZED (fault injected)" in (failed_dir / "log").read_text()


def test_a_planted_canary_is_found_in_a_row_a_dangling_blob_and_a_file(world: World) -> None:
    """The positive control: the same scan over the
    same directories finds exactly what was planted."""
    control = Canary(
        env="LOCKSTEP_CANARY_CONTROL", value=canary_value("control"), users=(PUSH_USER,)
    )
    (db,) = world.home.rglob("runs.db")
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE canary_control (note TEXT)")
        con.execute("INSERT INTO canary_control VALUES (?)", (f"token={control.value}",))
    con.close()
    login = base64.b64encode(f"{PUSH_USER}:{control.value}".encode())
    blob = (
        subprocess.run(
            ["git", "--git-dir", str(world.sb.harbor), "hash-object", "-w", "--stdin"],
            input=b"Authorization: Basic " + login,
            capture_output=True,
            check=True,
            timeout=30,
        )
        .stdout.decode()
        .strip()
    )
    planted = world.base / "tmp" / "control.json.gz"
    planted.write_bytes(
        gzip.compress(json.dumps({"url": f"https://x/?t={quote(control.value, safe='')}"}).encode())
    )

    found = scan([*world.canaries, control], [world.base], exclude=world.cluster_side)
    assert [f for f in found.findings if f.canary != control.env] == []
    places = {f.where.split()[0]: f.forms for f in found.findings}
    assert len(found.findings) == 3 and set(places) == {"file", "git", "sqlite"}, places
    assert places["sqlite"] == ("raw",) and places["file"] == ("url-encoded",)
    assert f"base64 of {PUSH_USER}:value" in places["git"]
    assert any(blob in f.where for f in found.findings) and any(
        str(planted) in f.where for f in found.findings
    )
