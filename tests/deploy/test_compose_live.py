"""The compose deployment, live: deploy/docker/ brought up on a real engine and driven through the
webserver's GraphQL as the UI does (tests/support/deploy/compose_stack.py
says what differs from a team's host).

relock_harbor -> build_tpu -> promote_tpu, each run launched by DockerRunLauncher in a container of
its own; the history lands in the stack's Postgres; `:tpu` moves and the promotion log equals the
registry. Then the host loses the daemon and a promote's run container mid-run: run monitoring fails
the run and frees its `tag_moves` slot, and the next promote runs and leaves the log equal to the
registry. Every secret the site names (push token, attestation key, two webhooks, an SSH passphrase)
reaches the run containers, and none of their values is in the stack's Postgres, its containers'
logs or its volumes. An edited site is seen through the directory mount; a code server that loaded
the old one says what to do on compose. `down -v` leaves no container, network or volume.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import git
import pytest
import sqlalchemy as sa
import tomli_w
import yaml
from cryptography.hazmat.primitives import serialization
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError
from sqlalchemy.pool import NullPool

from resources.registry import ImageRef, registry_for
from resources.site.load import load_site
from resources.site.reload import COMPOSE_RESTART
from sandbox.engines import Engine
from sandbox.processes import command_lines
from sandbox.world import (
    CONSUMER_BRANCH,
    HARBOR_BRANCH,
    SANDBOX_ATTEST_KEY_ENV,
    SANDBOX_TOKEN_ENV,
    Sandbox,
    advance_harbor,
    up,
)
from tests.conftest import stop_sandbox
from tests.support.canary_scan import Canary, attest_key_canary, scan
from tests.support.deploy.compose_stack import (
    REPO,
    Stack,
    compose_binary,
    container_env,
    start_stack,
    stop_stack,
    wait_for_webserver,
)
from tpu_assets.history import tag_history
from tpu_assets.promotion import floating_tag_lock_name
from tpu_assets.tag_lock import advisory_key
from tpu_assets.tag_log import log_disagreement

# seconds, about: an image build, the stack, four runs, a daemon restart
pytestmark = pytest.mark.heavy(240)

WEBHOOKS = ("LOCKSTEP_SLACK_WEBHOOK", "LOCKSTEP_TPU_ONCALL_WEBHOOK")
PASSPHRASE = "SPARK_SSH_PASSPHRASE"
RUN_TIMEOUT_S = 600


def _canary(env: str) -> str:
    return f"canary-{env.lower()}-{secrets.token_hex(12)}"


def _site_with_every_secret(sb: Sandbox, attest_key: str) -> None:
    """The sandbox site plus two webhooks and a key
    passphrase, signing with a fresh attestation key."""
    data = tomllib.loads(sb.site_file.read_text())
    public = serialization.load_pem_private_key(attest_key.encode(), password=None).public_key()
    data["attest"]["trusted_keys"] = [
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()
    ]
    data["alerts"]["webhook"] = [
        {"name": "ml-infra-slack", "url_env": WEBHOOKS[0]},
        {"name": "tpu-oncall", "url_env": WEBHOOKS[1], "events": ["hold", "tag_moved"]},
    ]
    data["spark"]["passphrase_env"] = PASSPHRASE
    sb.site_file.write_text(tomli_w.dumps(data))


@dataclass
class Live:
    sb: Sandbox
    stack: Stack
    canaries: dict[str, str]
    client: DagsterGraphQLClient
    root: Path
    down: dict[str, list[str]] | None = None

    def launch(self, job: str, *, tags: dict[str, str] | None = None) -> str:
        return self.client.submit_job_execution(
            job, repository_location_name="tpu", repository_name="__repository__", tags=tags or {}
        )

    def wait(self, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.client.get_run_status(run_id).value
            if status in {"SUCCESS", "FAILURE", "CANCELED"}:
                return status
            time.sleep(2)
        raise AssertionError(f"run {run_id} still {status} after {timeout_s:.0f} s")

    def why(self, run_id: str) -> str:
        """A failed run's story from the stack's event log:
        its failure events and its container's output."""
        with self.instance() as instance:
            said = [
                f"{e.dagster_event.event_type_value if e.dagster_event else 'log'}: {e.message}"
                for e in instance.all_logs(run_id)
                if e.dagster_event is None
                or "FAIL" in e.dagster_event.event_type_value
                or e.level >= 40
            ]
            for e in instance.all_logs(run_id):
                if e.dagster_event and e.dagster_event.is_step_failure:
                    said.append(str(e.dagster_event.step_failure_data.error))
                data = e.dagster_event.event_specific_data if e.dagster_event else None
                if getattr(data, "error", None) is not None:
                    said.append(str(data.error))
        container = self.stack.run_containers().get(run_id)
        logs = (
            self.stack.docker("logs", container["Id"], check=False)[-3000:]
            if container
            else "(no container)"
        )
        jobs = "".join(
            f"\n--- iris job {p} ---\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(self.sb.iris_home.glob("**/log"))[-2:]
        )
        return "\n".join(said)[-4000:] + "\n--- container ---\n" + logs + jobs

    def add_kubeconfig(self) -> None:
        """What the message says: the kubeconfig as `config`
        in LOCKSTEP_KUBE_DIR, KUBECONFIG in .env, `up -d`.
        (The sandbox's iris does not read it; a real one would.)"""
        kube = Path(self.stack.env["LOCKSTEP_KUBE_DIR"])
        (kube / "config").write_text(
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"
        )
        self.stack.env["KUBECONFIG"] = "/etc/lockstep/kube/config"
        self.stack.write_env()
        self.stack.compose("up", "-d", "--no-build")
        wait_for_webserver(self.stack)

    def step_started(self, run_id: str) -> bool:
        with self.instance() as instance:
            return any(
                e.dagster_event and e.dagster_event.event_type_value == "STEP_START"
                for e in instance.all_logs(run_id)
            )

    def status(self, run_id: str) -> str:
        return self.client.get_run_status(run_id).value

    def graphql(self, query: str, variables: dict[str, object]) -> dict[str, object]:
        # the UI's own mutations, which the client does not wrap
        return self.client._execute(query, variables)

    def add_build(self, sha: str) -> None:
        answer = self.graphql(
            """mutation($r: RepositorySelector!, $p: String!, $k: String!) {
                 addDynamicPartition(repositorySelector: $r, partitionsDefName: $p, partitionKey: $k) {
                   __typename ... on PythonError { message } ... on UnauthorizedError { message } } }""",  # noqa: E501
            {
                "r": {"repositoryLocationName": "tpu", "repositoryName": "__repository__"},
                "p": "tpu_builds",
                "k": sha,
            },
        )
        # The re-lock may have added it already (it
        # records the commit it pushed as a build to make).
        assert answer["addDynamicPartition"]["__typename"] in {  # type: ignore[index]
            "AddDynamicPartitionSuccess",
            "DuplicateDynamicPartitionError",
        }, answer

    def instance(self) -> dg.DagsterInstance:
        home = self.root / "reader-home"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text(
            yaml.safe_dump(
                {
                    "storage": {"postgres": {"postgres_url": self.stack.postgres_url()}},
                    "telemetry": {"enabled": False},
                }
            )
        )
        return dg.DagsterInstance.from_config(str(home))

    def floating(self) -> str | None:
        site = load_site(self.sb.site_file)
        assert site.tpu is not None
        return registry_for(site).resolve(
            repository=ImageRef.parse(site.tpu.image).repository, reference=site.tpu.floating_tag
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("compose-live")
    sb = up(root / "sandbox")
    attest_key = attest_key_canary()
    _site_with_every_secret(sb, attest_key)
    site = load_site(sb.site_file)
    canaries = {
        env: _canary(env) for env in site.secret_env_names() if env != SANDBOX_ATTEST_KEY_ENV
    }
    canaries[SANDBOX_ATTEST_KEY_ENV] = attest_key
    assert set(canaries) == {SANDBOX_TOKEN_ENV, SANDBOX_ATTEST_KEY_ENV, PASSPHRASE, *WEBHOOKS}
    # The sandbox, this checkout (the iris stand-in runs
    # from it) and the iris engine's socket directory.
    iris_engine = Engine(sb.root / "iris" / "engine")
    iris_engine.state.mkdir(parents=True, exist_ok=True)
    iris_engine.start()
    # the consumer's FROM: made from this machine's files, which runs cannot read
    iris_engine.ensure_bases(["python"])
    mounts = [
        f"{sb.root}:{sb.root}",
        f"{REPO}:{REPO}:ro",
        f"{iris_engine.run_dir}:{iris_engine.run_dir}",
    ]
    # the checkout's venv runs on a Python of its own
    if not Path(sys.base_prefix).is_relative_to("/usr"):
        mounts.append(f"{sys.base_prefix}:{sys.base_prefix}:ro")
    env_values = {k: v.replace("\n", "\\n") for k, v in canaries.items()}
    stack = start_stack(
        root=root,
        site_file=sb.site_file,
        site_dir=sb.root,
        extra_mounts=mounts,
        secrets_env=env_values,
    )
    world = Live(
        sb=sb,
        stack=stack,
        canaries=canaries,
        root=root,
        client=DagsterGraphQLClient("127.0.0.1", port_number=stack.ui_port, timeout=60),
    )
    try:
        yield world
    finally:
        if world.down is None:
            stop_stack(stack)
        stop_sandbox(sb)
        # A code server or run container (root, the sandbox mounted) may have restarted the
        # sandbox's git daemon and rewritten its pid file with a pid of its own namespace: stop by
        # PID whatever of this module still runs from the sandbox.
        for pid, argv in command_lines():
            if pid != os.getpid() and any(str(root) in arg for arg in argv):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_relock_build_promote_each_run_in_its_own_container(live: Live) -> None:
    # a harbor whose drift guard warns (the file probe passes)
    advance_harbor(live.sb.root, fix=True)
    relock = live.launch("relock_harbor")
    assert live.wait(relock) == "SUCCESS", live.why(relock)
    tip = git.Repo(live.sb.consumer).commit(CONSUMER_BRANCH).hexsha
    live.add_build(tip)
    # Day one: the iris cluster's kubeconfig is not there yet. The first build says so, submits
    # nothing, and says how to add it; doing exactly that makes the next build go.
    first = live.launch("build_tpu", tags={"dagster/partition": tip})
    assert live.wait(first) == "FAILURE"
    why = live.why(first)
    assert "nothing was submitted" in why and "KUBECONFIG is not set" in why, why[-3000:]
    assert (
        "LOCKSTEP_KUBE_DIR" in why
        and "KUBECONFIG=/etc/lockstep/kube/config in deploy/docker/.env" in why
    )
    assert not list((live.sb.iris_home / "jobs").glob("*/*"))  # no iris job
    live.add_kubeconfig()
    build = live.launch("build_tpu", tags={"dagster/partition": tip})
    assert live.wait(build) == "SUCCESS", live.why(build)
    before = live.floating()
    promote = live.launch("promote_tpu")
    assert live.wait(promote) == "SUCCESS", live.why(promote)

    containers = live.stack.run_containers()
    for run_id in (relock, first, build, promote):
        state = containers[run_id]["State"]
        if run_id == first:
            # the run's verdict is in the event log, not its exit code
            assert state["Status"] == "exited", state
            continue
        state = containers[run_id]["State"]
        assert state["Status"] == "exited" and state["ExitCode"] == 0, (run_id, state)
        assert containers[run_id]["Config"]["Image"] == live.stack.env["LOCKSTEP_IMAGE"]
    assert len({c["Id"] for c in containers.values()}) == len(containers)  # one container per run

    with live.instance() as instance:
        runs = {r.run_id: r for r in instance.get_runs()}
        assert {relock, build, promote} <= set(runs)
        assert all(runs[r].status == dg.DagsterRunStatus.SUCCESS for r in (relock, build, promote))
        log = list(reversed(tag_history(instance)))
    now = live.floating()
    assert now is not None and now != before
    assert log_disagreement(log, now) is None and log[-1].to_digest == now


def test_a_promote_lost_with_the_daemon_is_failed_by_run_monitoring_and_the_next_one_runs(
    live: Live,
) -> None:
    stack = live.stack
    # A second verified build, so the promote has a move to make (harbor's guard is already fixed).
    advance_harbor(live.sb.root)
    relock = live.launch("relock_harbor")
    assert live.wait(relock) == "SUCCESS", live.why(relock)
    tip = git.Repo(live.sb.consumer).commit(CONSUMER_BRANCH).hexsha
    live.add_build(tip)
    build = live.launch("build_tpu", tags={"dagster/partition": tip})
    assert live.wait(build) == "SUCCESS", live.why(build)
    before = live.floating()
    # The test holds the floating tag's lock (the Postgres advisory lock every writer takes), so the
    # promote is caught inside its step, where a host losing it would leave it.
    site = load_site(live.sb.site_file)
    holder = sa.create_engine(stack.postgres_url(), poolclass=NullPool).connect()
    try:
        key = advisory_key(floating_tag_lock_name(site))
        assert holder.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
        promote = live.launch("promote_tpu")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not live.step_started(promote):
            assert time.monotonic() < deadline and live.status(promote) not in {
                "SUCCESS",
                "FAILURE",
            }, live.why(promote)
            time.sleep(0.5)
        # The host loses both: the daemon and the run's container (an engine restart, an OOM kill).
        stack.docker("kill", stack.container("daemon"))
        stack.docker("kill", stack.run_containers()[promote]["Id"])
    finally:
        holder.close()
    stack.compose("start", "daemon")
    # run monitoring, not a run STARTED forever
    assert live.wait(promote, timeout_s=300) == "FAILURE"
    assert live.floating() == before  # it died before its PUT
    after = live.launch("promote_tpu")
    assert live.wait(after) == "SUCCESS", live.why(after)  # its tag_moves slot was freed
    with live.instance() as instance:
        log = list(reversed(tag_history(instance)))
    now = live.floating()
    assert now != before and log_disagreement(log, now) is None and log[-1].to_digest == now


SENSOR_DRY_RUN = """mutation($s: SensorSelector!) { sensorDryRun(selectorData: $s, cursor: null) {
  __typename ... on PythonError { message }
  ... on DryRunInstigationTick { evaluationResult { skipReason runRequests { runKey } error { message } } } } }"""  # noqa: E501


def _dry_run(live: Live) -> dict[str, object]:
    """One harbor_branch_sensor evaluation in the tpu
    code server, as the UI's "Test sensor" makes it."""
    answer = live.graphql(
        SENSOR_DRY_RUN,
        {
            "s": {
                "repositoryLocationName": "tpu",
                "repositoryName": "__repository__",
                "sensorName": "harbor_branch_sensor",
            }
        },
    )["sensorDryRun"]
    assert answer["__typename"] == "DryRunInstigationTick", answer  # type: ignore[index]
    return answer["evaluationResult"]  # type: ignore[index,return-value]


def test_an_edited_site_is_refused_with_the_compose_restart_and_the_restart_clears_it(
    live: Live,
) -> None:
    stack = live.stack
    assert _dry_run(live)["runRequests"], "the sensor sees harbor's tip before the edit"
    with live.sb.site_file.open("a", encoding="utf-8") as f:
        f.write("# an edit on the host, after the code servers loaded the file\n")
    # The site's directory is mounted, not the file: the code server reads the edited bytes at once.
    inside = stack.docker(
        "exec", stack.container("tpu"), "sha256sum", stack.env["LOCKSTEP_SITE"]
    ).split()[0]
    assert inside == hashlib.sha256(live.sb.site_file.read_bytes()).hexdigest()
    said = str(_dry_run(live)["skipReason"])
    assert "changed since this code location loaded it" in said and COMPOSE_RESTART in said, said
    # Do exactly what it says, from a checkout's root (compose
    # v1, Debian's, spells `docker compose` with a dash).
    argv = COMPOSE_RESTART.split()
    assert argv[:2] == ["docker", "compose"]
    checkout = live.root / "checkout"
    (checkout / "deploy").mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (checkout / "deploy" / "docker").symlink_to(stack.project, target_is_directory=True)
    restarted = subprocess.run(
        [compose_binary(), *argv[2:]],
        cwd=checkout,
        env=stack.engine.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    deadline = time.monotonic() + 180
    while True:
        try:
            result = _dry_run(live)
        # the webserver reconnecting to the new servers
        except (AssertionError, DagsterGraphQLClientError) as exc:
            result = {"skipReason": f"not answered: {exc}", "runRequests": None}
        if result["runRequests"]:
            break
        assert time.monotonic() < deadline, f"after the restart the sensor still says: {result}"
        time.sleep(3)
    assert [r["runKey"] for r in result["runRequests"]] == [  # type: ignore[union-attr,index]
        f"harbor:{git.Repo(live.sb.harbor).commit(HARBOR_BRANCH).hexsha}"
    ]


def test_every_secret_reaches_the_runs_and_no_value_lands_in_the_stack(live: Live) -> None:
    stack = live.stack
    for run_id, container in stack.run_containers().items():
        env = container_env(container)
        for name, value in live.canaries.items():
            assert env.get(name, "").replace("\\n", "\n") == value, (run_id, name)
    evidence = live.root / "evidence"
    evidence.mkdir(exist_ok=True)
    dump = subprocess.run(
        [
            "/usr/bin/docker",
            "exec",
            stack.container("postgres"),
            "pg_dump",
            "-U",
            stack.env["DAGSTER_POSTGRES_USER"],
            stack.env["DAGSTER_POSTGRES_DB"],
        ],
        env=stack.engine.env(),
        capture_output=True,
        timeout=300,
        check=True,
    )
    (evidence / "postgres.sql").write_bytes(dump.stdout)
    assert b"CREATE TABLE public.runs" in dump.stdout and b"promote_tpu" in dump.stdout
    ids = stack.docker("ps", "-a", "-q").split()
    for cid in ids:
        logs = subprocess.run(
            ["/usr/bin/docker", "logs", cid],
            env=stack.engine.env(),
            capture_output=True,
            timeout=120,
            check=False,
        )
        (evidence / f"logs-{cid}.txt").write_bytes(logs.stdout + logs.stderr)
    volumes = stack.engine.state / "root" / "volumes"
    roots = [
        evidence,
        *(volumes / v / "_data" for v in ("lockstep_dagster_storage", "lockstep_git_cache")),
    ]
    assert (volumes / "lockstep_dagster_storage" / "_data" / "storage").exists() or any(
        roots[1].iterdir()
    )
    canaries = [Canary(env=name, value=value) for name, value in live.canaries.items()]
    canaries.append(
        Canary(
            env=f"{SANDBOX_ATTEST_KEY_ENV} (a line of its PEM)",
            value=live.canaries[SANDBOX_ATTEST_KEY_ENV].splitlines()[2],
        )
    )
    canaries.append(
        Canary(
            env=f"{SANDBOX_ATTEST_KEY_ENV} (one line, as .env holds it)",
            value=live.canaries[SANDBOX_ATTEST_KEY_ENV].replace("\n", "\\n"),
        )
    )
    report = scan(canaries, roots)
    assert report.files > len(ids) and not report.findings, report.by_canary()


def test_down_leaves_no_container_network_or_volume(live: Live) -> None:
    live.down = stop_stack(live.stack)
    assert live.down == {"containers": [], "volumes": [], "networks": []}
    assert not live.stack.engine.running()
