"""deploy/k8s/values.yaml and deploy/Dockerfile, checked offline (no cluster, no Helm, no network).

1. The values validate against the Dagster Helm chart's own values schema (an excerpt vendored in
   helm_schema/, see its README), with a small validator since `jsonschema` is not a dependency.
2. The dagster.yaml the chart would render from them (reproduced below from the chart's
   templates/configmap-instance.yaml and templates/helpers/instance/*.tpl, for the parts we set) is
   accepted by Dagster's own instance schema, each configurable class accepts its section, and a
   real instance built from it reads our concurrency, monitoring, retry and retention settings back.
3. The Kubernetes Job that a real K8sRunLauncher
   creates for a `build_jovian_rev` (and a `build_tpu`)
   run, with the code location's container context built as the chart's user-deployments subchart
   builds it: image, run-worker args, env from Secrets only, resources, labels.
4. The Dockerfile: frozen lock, no dev tools, non-root, no secrets, the gRPC port the chart uses.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import jsonschema
import pytest
import yaml
from dagster._config import validate_config
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.events import RunFailureReason
from dagster._core.execution.retries import auto_reexecution_should_retry_run
from dagster._core.instance.config import PoolGranularity, dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test
from dagster._serdes import ConfigurableClassData
from dagster._serdes.config_class import class_from_code_pointer
from dagster_k8s import K8sRunLauncher

from jovian_assets.definitions import defs as jovian_defs
from tests.support.deploy.k8s_chart import (
    REPO,
    SCHEMA,
    deployment,
    launch_run_job,
    load_values,
    module_of,
    render_instance,
    run_for_location,
)
from tpu_assets.definitions import defs as tpu_defs

DOCKERFILE = REPO / "deploy" / "Dockerfile"
# Jobs the daemon must never re-run on its own: they move tags, or restart an hours-long build and
# file a second bench report. (relock_harbor may be retried: it fetches, checks and pushes
# fast-forward only, and a re-lock at the tip pushes nothing.)
NON_IDEMPOTENT_JOBS = {
    "tpu": ("promote_tpu", "rollback_tpu", "release_tpu_hold"),
    "jovian": ("build_jovian_rev",),
}
# Stand-ins for what the real Secrets hold. They are also put in the launching process's
# environment: a config that copied an env var's value into the Job would leak them.
FAKE_SECRETS = {
    "GHCR_TOKEN": "ghp_FAKE0ghcr0token0do0not0use0000000",
    "IRIS_DOCKER_TOKEN": "ghp_FAKE0iris0docker0token0000000000",
    "SPARK_SSH_PASSPHRASE": "fake-ssh-passphrase-7c1e",
    "DAGSTER_PG_PASSWORD": "fake-postgres-password-93ab",
}
# What every run and code server is given inline (values.yaml `x-lockstep-env`; never a secret).
RUN_ENV = (
    "LOCKSTEP_SITE",
    "LOCKSTEP_CACHE",
    "LOCKSTEP_DEPLOYMENT",
    "KUBECONFIG",
    "GIT_SSH_COMMAND",
)
FAKE_SSH_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKEFAKEFAKEb3BlbnNzaC1rZXktdjEAAAA\n-----END "
    "OPENSSH PRIVATE KEY-----\n"
)


# ---- 1. the chart's values schema ---------------------------------------------------------------


class ValuesSchema:
    """The chart's values schema, checked with jsonschema, adapted the way `helm install` applies
    it: Helm validates our values MERGED over the chart's defaults, whose maps supply every required
    key, so `required` holds only inside list items (a list we give replaces the chart's whole) —
    each `$defs` entry gets an in-item twin that keeps
    it; and the refs to kubernetesjsonschema.dev are
    dropped (offline; their sibling `type` still holds)."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.root = schema
        adapted = _as_helm_applies_it(
            {k: v for k, v in schema.items() if k != "$defs"}, in_item=False
        )
        defs = schema.get("$defs", {})
        adapted["$defs"] = {
            name: _as_helm_applies_it(d, in_item=False) for name, d in defs.items()
        } | {f"{name}__item": _as_helm_applies_it(d, in_item=True) for name, d in defs.items()}
        self._validator = jsonschema.Draft202012Validator(adapted)

    def errors(self, value: Any) -> list[str]:
        return [
            f"{_path(e)}: {e.message}" for e in map(_deepest, self._validator.iter_errors(value))
        ]


def _as_helm_applies_it(schema: Any, *, in_item: bool) -> Any:
    if isinstance(schema, list):
        return [_as_helm_applies_it(s, in_item=in_item) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, sub in schema.items():
        if key == "required" and not in_item:
            continue
        if key == "$ref":
            if str(sub).startswith("#/$defs/"):
                out[key] = f"{sub}__item" if in_item else sub
            continue
        if key == "properties":
            out[key] = {name: _as_helm_applies_it(s, in_item=in_item) for name, s in sub.items()}
        else:
            out[key] = _as_helm_applies_it(sub, in_item=in_item or key == "items")
    return out


def _deepest(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For `anyOf` (a value or null), the reason the real alternative failed."""
    while error.context:
        real = [e for e in error.context if e.schema.get("type") != "null"] or error.context
        error = jsonschema.exceptions.best_match(real)
    return error


def _path(error: jsonschema.ValidationError) -> str:
    """`values.a.b[1].c`, naming the offending key itself for unknown-key and missing-key errors."""
    path = "values" + "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
    )
    if error.validator == "additionalProperties":
        path += "." + ",".join(
            sorted(set(error.instance) - set(error.schema.get("properties", {})))
        )
    elif error.validator == "required":
        path += "." + str(error.message).split("'")[1]
    return path


@pytest.fixture(scope="module")
def chart_schema() -> ValuesSchema:
    return ValuesSchema(json.loads(SCHEMA.read_text(encoding="utf-8")))


def test_values_validate_against_the_chart_schema(chart_schema: ValuesSchema) -> None:
    values = load_values()
    assert chart_schema.errors(values) == []
    # The chart's root accepts any key, so a misspelt section would be ignored without a word.
    # `x-` keys only hold YAML anchors.
    unknown = {k for k in values if not k.startswith("x-")} - set(chart_schema.root["properties"])
    assert not unknown, f"top-level keys the chart does not read: {sorted(unknown)}"


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (
            lambda v: v["dagsterDaemon"].update(runRetry={"enabled": True}),
            "values.dagsterDaemon.runRetry",
        ),
        (lambda v: v["runLauncher"].update(type="K8sRunLaunchr"), "values.runLauncher.type"),
        (
            lambda v: v["runLauncher"]["config"]["k8sRunLauncher"].update(envSecret=[]),
            "k8sRunLauncher.envSecret",
        ),
        (
            lambda v: deployment(v, "jovian").pop("port"),
            "deployments[1].port: 'port' is a required property",
        ),
        (
            lambda v: deployment(v, "tpu")["image"].update(pullPolicy="Sometimes"),
            "deployments[0].image.pullPolicy",
        ),
        (
            lambda v: v["concurrency"]["pools"].update(defaultLimit="1"),
            "values.concurrency.pools.defaultLimit",
        ),
        (lambda v: v["concurrency"].update(pool={}), "values.concurrency.pool"),
        (
            lambda v: v["retention"]["sensor"]["purgeAfterDays"].update(skiped=7),
            "retention.sensor.purgeAfterDays",
        ),
    ],
)
def test_the_schema_check_catches_mistakes(
    chart_schema: ValuesSchema, mistake: Callable[[dict[str, Any]], object], expected: str
) -> None:
    values = load_values()
    mistake(values)
    assert any(expected in error for error in chart_schema.errors(values)), chart_schema.errors(
        values
    )


# ---- 2. the instance config the chart renders ----------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    return render_instance(load_values())


@pytest.fixture
def instance_dir(rendered: dict[str, Any], tmp_path: Path) -> Path:
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(rendered), encoding="utf-8")
    return tmp_path


def test_rendered_instance_is_valid_dagster_config(
    rendered: dict[str, Any], instance_dir: Path
) -> None:
    # The same load (schema + concurrency rules) the daemon, webserver and every run worker do.
    dagster_instance_config(str(instance_dir))
    for section in (
        "run_storage",
        "event_log_storage",
        "schedule_storage",
        "run_coordinator",
        "run_launcher",
    ):
        # The class as the instance resolves it (module aliases included), its config checked
        # without building it (the storages would connect to PostgreSQL).
        data = ConfigurableClassData(rendered[section]["module"], rendered[section]["class"], "{}")
        klass = class_from_code_pointer(data.module_name, data.class_name)
        result = validate_config(klass.config_type(), rendered[section].get("config", {}))  # type: ignore[attr-defined]
        assert result.success, (section, [e.message for e in result.errors])
    assert rendered["run_launcher"]["class"] == "K8sRunLauncher"
    launcher = validate_config(K8sRunLauncher.config_type(), rendered["run_launcher"]["config"])
    assert launcher.success, [e.message for e in launcher.errors]
    # The PostgreSQL password reaches the instance only
    # as a reference to the chart's secret env var.
    assert rendered["run_storage"]["config"]["postgres_db"]["password"] == {
        "env": "DAGSTER_PG_PASSWORD"
    }


def test_runs_use_the_default_executor() -> None:
    """One run = one Kubernetes Job: the per-location resources and the pools count whole runs. A
    k8s_job_executor would put each step in its own pod, outside both."""
    for defs, job_name in (
        (jovian_defs, "build_jovian_rev"),
        (tpu_defs, "build_tpu"),
        (tpu_defs, "relock_harbor"),
    ):
        # The run config a sensor or the launchpad sends (none), validated and defaulted by Dagster.
        execution = dg.validate_run_config(defs.resolve_job_def(job_name), {})["execution"]
        assert list(execution) == ["multi_or_in_process_executor"], (job_name, execution)
        assert list(execution["multi_or_in_process_executor"]) == ["multiprocess"], (
            job_name,
            execution,
        )


@pytest.fixture
def instance(rendered: dict[str, Any]) -> Iterator[dg.DagsterInstance]:
    """A real instance with our coordinator, concurrency, monitoring, retries and retention (storage
    stays the test's SQLite: PostgreSQL is not reachable offline)."""
    sections = ("run_coordinator", "concurrency", "run_monitoring", "run_retries", "retention")
    overrides = {k: rendered[k] for k in sections}
    with dg.instance_for_test(overrides=overrides) as inst:
        yield inst


def test_instance_reads_our_settings_back(instance: dg.DagsterInstance) -> None:
    concurrency = instance.get_concurrency_config()
    assert concurrency.pool_config.pool_granularity == PoolGranularity.RUN
    # tag_moves and every spark_node/<node> pool
    assert concurrency.pool_config.default_pool_limit == 1
    assert concurrency.run_queue_config is not None
    assert concurrency.run_queue_config.max_concurrent_runs == 10
    assert instance.run_monitoring_enabled
    assert instance.run_monitoring_start_timeout_seconds == 600
    assert instance.run_monitoring_cancel_timeout_seconds == 300
    assert instance.run_monitoring_max_runtime_seconds == 12 * 3600
    assert instance.run_monitoring_max_resume_run_attempts == 0
    assert instance.get_tick_retention_settings(InstigatorType.SENSOR) == {
        TickStatus.SKIPPED: 7,
        TickStatus.FAILURE: 30,
        TickStatus.SUCCESS: -1,
        TickStatus.STARTED: -1,
    }


def test_run_retries_only_after_a_crash_and_never_for_opted_out_jobs(
    instance: dg.DagsterInstance,
) -> None:
    def failed(defs: dg.Definitions, job_name: str) -> dg.DagsterRun:
        # A run carries its job's tags, as when a sensor or the launchpad starts it.
        tags = defs.resolve_job_def(job_name).tags
        return create_run_for_test(
            instance, job_name=job_name, status=DagsterRunStatus.FAILURE, tags=tags
        )

    crashed = RunFailureReason.UNEXPECTED_TERMINATION
    assert auto_reexecution_should_retry_run(instance, failed(tpu_defs, "build_tpu"), crashed)
    assert not auto_reexecution_should_retry_run(
        instance, failed(tpu_defs, "build_tpu"), RunFailureReason.STEP_FAILURE
    )
    assert not auto_reexecution_should_retry_run(instance, failed(tpu_defs, "promote_tpu"), crashed)
    assert not auto_reexecution_should_retry_run(
        instance, failed(jovian_defs, "build_jovian_rev"), crashed
    )


def test_non_idempotent_jobs_opt_out_of_run_retries() -> None:
    """values.yaml turns daemon retries on and relies on these jobs' own tag to stay out."""
    for defs, location in ((tpu_defs, "tpu"), (jovian_defs, "jovian")):
        for name in NON_IDEMPOTENT_JOBS[location]:
            assert defs.resolve_job_def(name).tags.get("dagster/max_retries") == "0", name


# ---- 3. the run worker Job -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "job_name"), [("jovian", "build_jovian_rev"), ("tpu", "build_tpu")]
)
def test_run_worker_job(
    location: str,
    job_name: str,
    rendered: dict[str, Any],
    instance_dir: Path,
    instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = load_values()
    d = deployment(values, location)
    image = f"{d['image']['repository']}:{d['image']['tag']}"
    assert d["dagsterApiGrpcArgs"] == ["-m", module_of(location)]
    for name, value in FAKE_SECRETS.items():
        monkeypatch.setenv(name, value)

    # The job's own tags ride on every run (a
    # `dagster-k8s/config` tag there would beat values.yaml).
    defs = {"tpu": tpu_defs, "jovian": jovian_defs}[location]
    partition = {"tpu": "0" * 40, "jovian": "r35"}[location]
    run = run_for_location(
        values,
        instance,
        location=location,
        job_name=job_name,
        tags={**defs.resolve_job_def(job_name).tags, "dagster/partition": partition},
    )
    # A real K8sRunLauncher from the rendered config. Run workers get the production instance
    # (PostgreSQL) by reference, not the test's SQLite one.
    manifest = launch_run_job(
        run=run,
        instance=instance,
        instance_ref=InstanceRef.from_dir(str(instance_dir)),
        launcher_config=rendered["run_launcher"]["config"],
    )
    text = json.dumps(manifest)
    pod = manifest["spec"]["template"]
    container = pod["spec"]["containers"][0]

    # Nothing secret inline, anywhere: not in env, args (the instance ref), labels or annotations.
    leaked = [
        s[:8]
        for s in (*FAKE_SECRETS.values(), FAKE_SSH_KEY, FAKE_SSH_KEY.splitlines()[1])
        if s in text
    ]
    assert not leaked, f"secret values inline in the Job (starting {leaked})"
    assert manifest["spec"]["backoffLimit"] == 0  # only Dagster decides whether a run goes again

    assert container["image"] == image
    assert "command" not in container  # the image's own (empty) entrypoint runs the args
    assert container["args"][:3] == ["dagster", "api", "execute_run"]
    args = dg.deserialize_value(container["args"][3])
    assert args.job_origin.job_name == job_name
    assert args.job_origin.repository_origin.code_pointer.module == module_of(location)
    storage_yaml = args.instance_ref.storage_data.config_yaml
    assert (
        values["postgresql"]["postgresqlHost"] in storage_yaml
        and "DAGSTER_PG_PASSWORD" in storage_yaml
    )

    env = {e["name"]: e for e in container["env"]}
    assert len(env) == len(container["env"]), "an env var set twice"
    inline = {name for name, e in env.items() if "value" in e}
    assert inline <= {"DAGSTER_RUN_JOB_NAME", "DAGSTER_HOME", *RUN_ENV}, inline
    assert env["DAGSTER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": values["global"]["postgresqlSecretName"],
        "key": "postgresql-password",
    }
    assert not set(FAKE_SECRETS) & inline
    env_from = container["envFrom"]
    assert {"secretRef": {"name": "lockstep-secrets"}} in env_from
    assert env_from.count({"secretRef": {"name": "lockstep-secrets"}}) == 1
    assert any(
        ref.get("configMapRef", {}).get("name", "").endswith(f"-{location}-user-env")
        for ref in env_from
    )

    # The site file, the SSH key and the kubeconfig arrive as files, the shared claim as two
    # directories; each volume and each mount once (launcher and
    # location hand the same lists; dagster-k8s dedupes).
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert len(volumes) == len(pod["spec"]["volumes"])
    assert volumes["lockstep-site"]["configMap"]["name"] == "lockstep-site"
    assert volumes["lockstep-ssh"]["secret"]["secretName"] == "lockstep-ssh"
    assert volumes["lockstep-kube"]["secret"] == {
        "secretName": "lockstep-kube",
        "defaultMode": 0o440,
        "optional": True,
    }
    assert volumes["lockstep-shared"]["persistentVolumeClaim"] == {"claimName": "lockstep-shared"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert len(mounts) == len(container["volumeMounts"])
    # The site ConfigMap as a directory: no subPath, which would never see an edited ConfigMap.
    site = mounts["/etc/lockstep/site"]
    assert site["name"] == "lockstep-site" and "subPath" not in site and site["readOnly"]
    assert env["LOCKSTEP_SITE"]["value"] == "/etc/lockstep/site/site.toml"
    assert env["KUBECONFIG"]["value"] == f"{mounts['/etc/lockstep/kube']['mountPath']}/config"
    assert mounts["/etc/lockstep/kube"]["name"] == "lockstep-kube"
    assert env["LOCKSTEP_DEPLOYMENT"]["value"] == "kubernetes"
    # What runs share: the IO manager's storage under
    # the instance's DAGSTER_HOME, and LOCKSTEP_CACHE.
    storage = mounts[f"{env['DAGSTER_HOME']['value']}/storage"]
    cache = mounts[env["LOCKSTEP_CACHE"]["value"]]
    assert storage["name"] == cache["name"] == "lockstep-shared"
    assert (
        storage["subPath"] != cache["subPath"]
        and not storage.get("readOnly")
        and not cache.get("readOnly")
    )
    ssh_dir = next(path for path, m in mounts.items() if m["name"] == "lockstep-ssh")
    git_ssh = shlex.split(env["GIT_SSH_COMMAND"]["value"])
    assert git_ssh[git_ssh.index("-i") + 1].startswith(f"{ssh_dir}/")
    assert "BatchMode=yes" in git_ssh  # a prompt would hang a sensor tick
    # The code server (sensors) sees the same values through the location's env ConfigMap.
    for name in RUN_ENV:
        assert env[name]["value"] == d["env"][name], name

    assert container["resources"] == d["resources"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["allowPrivilegeEscalation"] is False

    labels = pod["metadata"]["labels"]
    assert {
        "app.kubernetes.io/name": "dagster",
        "app.kubernetes.io/instance": "dagster",
        "app.kubernetes.io/part-of": "dagster",
        "app.kubernetes.io/component": "run_worker",
        "dagster/job": job_name,
        "dagster/run-id": run.run_id,
        "dagster/code-location": location,
        "lockstep/location": location,
    }.items() <= labels.items()
    assert manifest["metadata"]["labels"]["dagster/job"] == job_name


def test_jovian_runs_get_more_memory_than_tpu_runs() -> None:
    def gib(quantity: str) -> float:
        number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
        return float(number) / (1024 if unit == "Mi" else 1)

    values = load_values()
    tpu, jovian = deployment(values, "tpu")["resources"], deployment(values, "jovian")["resources"]
    for kind in ("requests", "limits"):
        assert gib(jovian[kind]["memory"]) > gib(tpu[kind]["memory"]), kind
        assert gib(jovian[kind]["memory"]) >= 2


# ---- 4. the Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
    ]


def test_dockerfile() -> None:
    steps = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    kinds = [kind for kind, _ in steps]
    froms = [args for kind, args in steps if kind == "FROM"]
    # Production's images are the build arguments' defaults (a test builds it offline with others).
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    uv_version = re.search(
        r"^UV_VERSION=(\S+)$", (REPO / "dev").read_text(encoding="utf-8"), re.MULTILINE
    )
    assert uv_version is not None
    assert (
        froms[0].split()[0] == "${UV_IMAGE}"
        and args["UV_IMAGE"] == f"ghcr.io/astral-sh/uv:{uv_version.group(1)}"
    )
    assert (
        args["BASE_IMAGE"] == "python:3.11-slim"
        and args["SYSTEM_PACKAGES"] == "apt"
        and args["WITH_IRIS"] == "1"
    )
    assert froms[-1] == "system-${SYSTEM_PACKAGES}"
    assert {f.split()[0] for f in froms[1:-1]} == {"${BASE_IMAGE}"}

    runs = [args for kind, args in steps if kind == "RUN"]
    apt = next(r for r in runs if "apt-get install" in r)
    assert {"git", "openssh-client"} <= set(apt.split())
    syncs = [shlex.split(r) for r in runs if "uv sync" in r]
    assert syncs and all({"--frozen", "--no-dev"} <= set(s) for s in syncs)
    assert all(
        not re.search(r"--(all-groups|group|extra|all-extras)\b", " ".join(s)) for s in syncs
    )
    # No .dockerignore: copying the whole context would bake in .sandbox, .venv and .git.
    copies = [args.split() for kind, args in steps if kind == "COPY"]
    assert all(not {".", "./"} & set(c[:-1]) for c in copies if not c[0].startswith("--from"))

    user = [args for kind, args in steps if kind == "USER"]
    assert user and user[-1].split(":")[0] not in {"root", "0"}
    for user_deployment in load_values()["dagster-user-deployments"]["deployments"]:
        # Kubernetes runs the image as this uid and gives the secret files to this group.
        pod = user_deployment["podSecurityContext"]
        assert (
            user[-1] == f"{pod['runAsUser']}:{pod['runAsGroup']}"
            and pod["fsGroup"] == pod["runAsGroup"]
        )
    last_user = max(i for i, kind in enumerate(kinds) if kind == "USER")
    assert kinds.index("CMD") > last_user
    assert "RUN" not in kinds[last_user:]
    assert "ENTRYPOINT" not in kinds  # the chart and K8sRunLauncher give the whole command as args
    assert any("/.venv/bin" in args for kind, args in steps if kind == "ENV" and "PATH=" in args)

    secretish = re.compile(
        r"token|passw|passphrase|secret|credential|api_key|private_key", re.IGNORECASE
    )
    for kind, args in steps:
        if kind in {"ARG", "ENV"}:
            assert not secretish.search(args), f"{kind} {args}"

    ports = {int(p.split("/")[0]) for kind, args in steps if kind == "EXPOSE" for p in args.split()}
    assert {d["port"] for d in load_values()["dagster-user-deployments"]["deployments"]} <= ports
