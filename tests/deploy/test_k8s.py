"""deploy/k8s/values.yaml and deploy/Dockerfile, checked offline (no cluster, no Helm, no network).

1. The values validate against the Dagster Helm chart's own values schema (an excerpt vendored in
   helm_schema/, see its README), with a small validator since `jsonschema` is not a dependency.
2. The dagster.yaml the chart would render from them (reproduced below from the chart's
   templates/configmap-instance.yaml and templates/helpers/instance/*.tpl, for the parts we set) is
   accepted by Dagster's own instance schema, each configurable class accepts its section, and a real
   instance built from it reads our concurrency, monitoring, retry and retention settings back.
3. The Kubernetes Job that a real K8sRunLauncher creates for a `build_jovian_rev` (and a `build_tpu`)
   run, with the code location's container context built as the chart's user-deployments subchart
   builds it: image, run-worker args, env from Secrets only, resources, labels.
4. The Dockerfile: frozen lock, no dev tools, non-root, no secrets, the gRPC port the chart uses.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import jsonschema
import kubernetes.client
import pytest
import yaml
from dagster._config import process_config, validate_config
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.events import RunFailureReason
from dagster._core.execution.retries import auto_reexecution_should_retry_run
from dagster._core.instance.config import PoolGranularity, dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test
from dagster._serdes import ConfigurableClassData
from dagster._serdes.config_class import class_from_code_pointer
from dagster_k8s import K8sRunLauncher

from jovian_assets.definitions import defs as jovian_defs
from tpu_assets.definitions import defs as tpu_defs

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "deploy" / "k8s" / "values.yaml"
SCHEMA = Path(__file__).parent / "helm_schema" / "values.schema.json"
DOCKERFILE = REPO / "deploy" / "Dockerfile"

# As in values.yaml's header: `helm upgrade --install dagster dagster/dagster -n lockstep`.
RELEASE, NAMESPACE = "dagster", "lockstep"
# The chart defaults the rendering reads where values.yaml leaves them alone.
CHART_DEFAULTS: dict[str, Any] = {
    "global": {"dagsterHome": "/opt/dagster/dagster_home", "serviceAccountName": ""},
    "serviceAccount": {"name": ""},
    "dagsterDaemon": {"enabled": True},
    "concurrency": {"enabled": False},
    "retention": {"enabled": False},
}
# Jobs the daemon must never re-run on its own: they move tags, or restart an hours-long build and file
# a second bench report. (relock_harbor may be retried: it fetches, checks and pushes fast-forward only,
# and a re-lock at the tip pushes nothing.)
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
FAKE_SSH_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKEFAKEFAKEb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
)


def load_values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text(encoding="utf-8"))


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps deep-merged, everything else (lists too) replaced."""
    out = dict(copy.deepcopy(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---- 1. the chart's values schema ---------------------------------------------------------------

class ValuesSchema:
    """The chart's values schema, checked with jsonschema, adapted the way `helm install` applies it:
    Helm validates our values MERGED over the chart's defaults, whose maps supply every required key,
    so `required` holds only inside list items (a list we give replaces the chart's whole) — each
    `$defs` entry gets an in-item twin that keeps it; and the refs to kubernetesjsonschema.dev are
    dropped (offline; their sibling `type` still holds)."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.root = schema
        adapted = _as_helm_applies_it({k: v for k, v in schema.items() if k != "$defs"}, in_item=False)
        defs = schema.get("$defs", {})
        adapted["$defs"] = {name: _as_helm_applies_it(d, in_item=False) for name, d in defs.items()} | {
            f"{name}__item": _as_helm_applies_it(d, in_item=True) for name, d in defs.items()}
        self._validator = jsonschema.Draft202012Validator(adapted)

    def errors(self, value: Any) -> list[str]:
        return [f"{_path(e)}: {e.message}" for e in map(_deepest, self._validator.iter_errors(value))]


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
    path = "values" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    if error.validator == "additionalProperties":
        path += "." + ",".join(sorted(set(error.instance) - set(error.schema.get("properties", {}))))
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


def _deployment(values: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in values["dagster-user-deployments"]["deployments"] if d["name"] == name)


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (lambda v: v["dagsterDaemon"].update(runRetry={"enabled": True}), "values.dagsterDaemon.runRetry"),
        (lambda v: v["runLauncher"].update(type="K8sRunLaunchr"), "values.runLauncher.type"),
        (lambda v: v["runLauncher"]["config"]["k8sRunLauncher"].update(envSecret=[]), "k8sRunLauncher.envSecret"),
        (lambda v: _deployment(v, "jovian").pop("port"), "deployments[1].port: 'port' is a required property"),
        (lambda v: _deployment(v, "tpu")["image"].update(pullPolicy="Sometimes"), "deployments[0].image.pullPolicy"),
        (lambda v: v["concurrency"]["pools"].update(defaultLimit="1"), "values.concurrency.pools.defaultLimit"),
        (lambda v: v["concurrency"].update(pool={}), "values.concurrency.pool"),
        (lambda v: v["retention"]["sensor"]["purgeAfterDays"].update(skiped=7), "retention.sensor.purgeAfterDays"),
    ],
)
def test_the_schema_check_catches_mistakes(
    chart_schema: ValuesSchema, mistake: Callable[[dict[str, Any]], object], expected: str
) -> None:
    values = load_values()
    mistake(values)
    assert any(expected in error for error in chart_schema.errors(values)), chart_schema.errors(values)


# ---- 2. the instance config the chart renders -----------------------------------------------------


def _fullname(chart: str) -> str:
    """The charts' `dagster.fullname` helper, no overrides."""
    return RELEASE if chart in RELEASE else f"{RELEASE}-{chart}"


def _strict(section: Mapping[str, Any] | None, known: set[str], where: str) -> Mapping[str, Any]:
    """The template reads only `known`: any other key is a typo the chart would silently ignore."""
    section = section or {}
    unknown = set(section) - known
    assert not unknown, f"{where}: {sorted(unknown)} is not read by the chart's templates"
    return section


def _names(refs: list[Mapping[str, Any]] | None) -> list[str]:
    return [ref["name"] for ref in refs or [] if "name" in ref]


def _render_run_launcher(v: Mapping[str, Any]) -> dict[str, Any]:
    """templates/helpers/instance/_run-launcher.tpl, "dagsterYaml.runLauncher.k8s"."""
    assert v["runLauncher"]["type"] == "K8sRunLauncher"
    k = _strict(
        v["runLauncher"]["config"]["k8sRunLauncher"],
        {"image", "imagePullPolicy", "jobNamespace", "loadInclusterConfig", "kubeconfigFile", "envConfigMaps",
         "envSecrets", "envVars", "volumeMounts", "volumes", "labels", "failPodOnRunFailure", "resources",
         "schedulerName", "securityContext", "runK8sConfig"},
        "runLauncher.config.k8sRunLauncher",
    )
    config: dict[str, Any] = {
        "load_incluster_config": k["loadInclusterConfig"],
        "job_namespace": k.get("jobNamespace") or NAMESPACE,
        "image_pull_policy": k["imagePullPolicy"],
        "service_account_name": (
            v["global"]["serviceAccountName"] or v["serviceAccount"]["name"] or _fullname("dagster")
        ),
        "dagster_home": v["global"]["dagsterHome"],
        "instance_config_map": f"{_fullname('dagster')}-instance",
        "postgres_password_secret": v["global"]["postgresqlSecretName"],
    }
    if k.get("kubeconfigFile"):
        config["kubeconfig_file"] = k["kubeconfigFile"]
    if v.get("imagePullSecrets"):
        config["image_pull_secrets"] = v["imagePullSecrets"]
    if "image" in k:
        config["job_image"] = f"{k['image']['repository']}:{k['image']['tag']}"
    if k.get("envConfigMaps"):
        config["env_config_maps"] = _names(k["envConfigMaps"])
    if k.get("envSecrets"):
        config["env_secrets"] = _names(k["envSecrets"])
    for key, out in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes"),
                     ("labels", "labels"), ("resources", "resources"), ("schedulerName", "scheduler_name"),
                     ("securityContext", "security_context")):
        if k.get(key):
            config[out] = k[key]
    if k.get("failPodOnRunFailure"):
        config["fail_pod_on_run_failure"] = True
    if k.get("runK8sConfig"):
        run_k8s = _strict(k["runK8sConfig"], {"containerConfig", "podSpecConfig", "podTemplateSpecMetadata",
                                              "jobSpecConfig", "jobMetadata"}, "runK8sConfig")
        config["run_k8s_config"] = {
            re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value for key, value in run_k8s.items() if value
        }
    return {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": config}


def _render_run_coordinator(v: Mapping[str, Any]) -> dict[str, Any]:
    """templates/helpers/instance/_run-coordinator.tpl, "dagsterYaml.runCoordinator.queued" (the version
    that leaves max_concurrent_runs out when `concurrency` sets it). The chart still names the module
    `dagster.core...`; Dagster maps that to `dagster._core` when it loads the class."""
    rc = _strict(v["dagsterDaemon"]["runCoordinator"], {"enabled", "type", "config"}, "runCoordinator")
    assert rc["type"] == "QueuedRunCoordinator"
    q = _strict(
        rc["config"]["queuedRunCoordinator"],
        {"maxConcurrentRuns", "tagConcurrencyLimits", "dequeueIntervalSeconds", "dequeueNumWorkers",
         "dequeueUseThreads", "blockOpConcurrencyLimitedRuns"},
        "queuedRunCoordinator",
    )
    rendered: dict[str, Any] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}
    if not any(value not in (None, False, 0, "", [], {}) for value in q.values()):
        return rendered
    config: dict[str, Any] = {}
    if not v["concurrency"]["enabled"] or q.get("maxConcurrentRuns") is not None:
        config["max_concurrent_runs"] = -1 if q.get("maxConcurrentRuns") is None else q["maxConcurrentRuns"]
    for key, out in (("tagConcurrencyLimits", "tag_concurrency_limits"),
                     ("dequeueIntervalSeconds", "dequeue_interval_seconds"),
                     ("dequeueUseThreads", "dequeue_use_threads"), ("dequeueNumWorkers", "dequeue_num_workers")):
        if q.get(key):
            config[out] = q[key]
    if q.get("blockOpConcurrencyLimitedRuns"):
        block = q["blockOpConcurrencyLimitedRuns"]
        config["block_op_concurrency_limited_runs"] = {
            "enabled": block["enabled"], "op_concurrency_slot_buffer": block["opConcurrencySlotBuffer"],
        }
    return {**rendered, "config": config}


def _render_concurrency(v: Mapping[str, Any]) -> dict[str, Any]:
    """templates/helpers/instance/_concurrency.tpl, with its refusal to set a limit in two places."""
    c = _strict(v["concurrency"], {"enabled", "pools", "runs"}, "concurrency")
    pools = _strict(c.get("pools"), {"defaultLimit", "granularity", "opGranularityRunBuffer"}, "concurrency.pools")
    runs = _strict(c.get("runs"), {"maxConcurrentRuns", "tagConcurrencyLimits"}, "concurrency.runs")
    queued = v["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued.get("maxConcurrentRuns") is None or runs.get("maxConcurrentRuns") is None, "chart: set it once"
    assert not (queued.get("tagConcurrencyLimits") and runs.get("tagConcurrencyLimits")), "chart: set it once"
    out: dict[str, Any] = {}
    rendered_pools = {snake: pools[camel] for camel, snake in (
        ("defaultLimit", "default_limit"), ("granularity", "granularity"),
        ("opGranularityRunBuffer", "op_granularity_run_buffer")) if pools.get(camel) is not None}
    if rendered_pools:
        out["pools"] = rendered_pools
    rendered_runs: dict[str, Any] = {}
    if runs.get("maxConcurrentRuns") is not None:
        rendered_runs["max_concurrent_runs"] = runs["maxConcurrentRuns"]
    if runs.get("tagConcurrencyLimits"):
        rendered_runs["tag_concurrency_limits"] = runs["tagConcurrencyLimits"]
    if rendered_runs:
        out["runs"] = rendered_runs
    return out


def render_instance(values: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of templates/configmap-instance.yaml's dagster.yaml that values.yaml sets."""
    v = _merged(CHART_DEFAULTS, values)
    pg = _strict(v["postgresql"], {"enabled", "image", "postgresqlHost", "postgresqlUsername", "postgresqlPassword",
                                   "postgresqlDatabase", "postgresqlParams", "postgresqlScheme", "service"},
                 "postgresql")
    # templates/helpers/instance/_postgresql.tpl: the password is only ever an env reference.
    postgres_db: dict[str, Any] = {
        "username": pg["postgresqlUsername"],
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": pg["postgresqlHost"] if not pg["enabled"] else f"{_fullname('dagster')}-postgresql",
        "db_name": pg["postgresqlDatabase"],
        "port": pg["service"]["port"],
        "params": pg.get("postgresqlParams") or {},
    }
    if pg.get("postgresqlScheme"):
        postgres_db["scheme"] = pg["postgresqlScheme"]
    storage = {"postgres_db": postgres_db}
    instance: dict[str, Any] = {
        "schedule_storage": {"module": "dagster_postgres.schedule_storage", "class": "PostgresScheduleStorage",
                             "config": storage},
        "run_storage": {"module": "dagster_postgres.run_storage", "class": "PostgresRunStorage", "config": storage},
        "event_log_storage": {"module": "dagster_postgres.event_log", "class": "PostgresEventLogStorage",
                              "config": storage},
        "run_launcher": _render_run_launcher(v),
    }
    daemon = v["dagsterDaemon"]
    if daemon["enabled"] and daemon["runCoordinator"]["enabled"]:
        instance["run_coordinator"] = _render_run_coordinator(v)
    monitoring = _strict(daemon.get("runMonitoring"), {
        "enabled", "startTimeoutSeconds", "cancelTimeoutSeconds", "maxRuntimeSeconds", "maxResumeRunAttempts",
        "pollIntervalSeconds", "freeSlotsAfterRunEndSeconds"}, "dagsterDaemon.runMonitoring")
    if daemon["enabled"] and monitoring.get("enabled"):
        instance["run_monitoring"] = {
            "enabled": True,
            "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
            "free_slots_after_run_end_seconds": monitoring["freeSlotsAfterRunEndSeconds"],
            **{snake: monitoring[camel] for camel, snake in (
                ("cancelTimeoutSeconds", "cancel_timeout_seconds"), ("maxRuntimeSeconds", "max_runtime_seconds"),
                ("maxResumeRunAttempts", "max_resume_run_attempts")) if monitoring.get(camel) is not None},
        }
    retries = _strict(daemon.get("runRetries"), {"enabled", "maxRetries", "retryOnAssetOrOpFailure"},
                      "dagsterDaemon.runRetries")
    if daemon["enabled"] and retries.get("enabled"):
        instance["run_retries"] = {"enabled": True}
        if retries.get("maxRetries"):
            instance["run_retries"]["max_retries"] = retries["maxRetries"]
        if "retryOnAssetOrOpFailure" in retries:
            instance["run_retries"]["retry_on_asset_or_op_failure"] = retries["retryOnAssetOrOpFailure"]
    retention = _strict(v["retention"], {"enabled", "sensor", "schedule", "autoMaterialize"}, "retention")
    if retention["enabled"]:
        instance["retention"] = {
            key: {"purge_after_days": retention[camel]["purgeAfterDays"]}
            for camel, key in (("sensor", "sensor"), ("schedule", "schedule"), ("autoMaterialize", "auto_materialize"))
            if retention.get(camel)
        }
    if v["concurrency"]["enabled"]:
        instance["concurrency"] = _render_concurrency(v)
    return instance


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    return render_instance(load_values())


@pytest.fixture
def instance_dir(rendered: dict[str, Any], tmp_path: Path) -> Path:
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(rendered), encoding="utf-8")
    return tmp_path


def test_rendered_instance_is_valid_dagster_config(rendered: dict[str, Any], instance_dir: Path) -> None:
    # The same load (schema + concurrency rules) the daemon, webserver and every run worker do.
    dagster_instance_config(str(instance_dir))
    for section in ("run_storage", "event_log_storage", "schedule_storage", "run_coordinator", "run_launcher"):
        # The class as the instance resolves it (module aliases included), its config checked without
        # building it (the storages would connect to PostgreSQL).
        data = ConfigurableClassData(rendered[section]["module"], rendered[section]["class"], "{}")
        klass = class_from_code_pointer(data.module_name, data.class_name)
        result = validate_config(klass.config_type(), rendered[section].get("config", {}))  # type: ignore[attr-defined]
        assert result.success, (section, [e.message for e in result.errors])
    assert rendered["run_launcher"]["class"] == "K8sRunLauncher"
    launcher = validate_config(K8sRunLauncher.config_type(), rendered["run_launcher"]["config"])
    assert launcher.success, [e.message for e in launcher.errors]
    # The PostgreSQL password reaches the instance only as a reference to the chart's secret env var.
    assert rendered["run_storage"]["config"]["postgres_db"]["password"] == {"env": "DAGSTER_PG_PASSWORD"}


def test_runs_use_the_default_executor() -> None:
    """One run = one Kubernetes Job: the per-location resources and the pools count whole runs. A
    k8s_job_executor would put each step in its own pod, outside both."""
    for defs, job_name in ((jovian_defs, "build_jovian_rev"), (tpu_defs, "build_tpu"), (tpu_defs, "relock_harbor")):
        # The run config a sensor or the launchpad sends (none), validated and defaulted by Dagster.
        execution = dg.validate_run_config(defs.resolve_job_def(job_name), {})["execution"]
        assert list(execution) == ["multi_or_in_process_executor"], (job_name, execution)
        assert list(execution["multi_or_in_process_executor"]) == ["multiprocess"], (job_name, execution)


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
    assert concurrency.pool_config.default_pool_limit == 1  # tag_moves and every spark_node/<node> pool
    assert concurrency.run_queue_config is not None
    assert concurrency.run_queue_config.max_concurrent_runs == 10
    assert instance.run_monitoring_enabled
    assert instance.run_monitoring_start_timeout_seconds == 600
    assert instance.run_monitoring_cancel_timeout_seconds == 300
    assert instance.run_monitoring_max_runtime_seconds == 12 * 3600
    assert instance.run_monitoring_max_resume_run_attempts == 0
    assert instance.get_tick_retention_settings(InstigatorType.SENSOR) == {
        TickStatus.SKIPPED: 7, TickStatus.FAILURE: 30, TickStatus.SUCCESS: -1, TickStatus.STARTED: -1,
    }


def test_run_retries_only_after_a_crash_and_never_for_opted_out_jobs(instance: dg.DagsterInstance) -> None:
    def failed(defs: dg.Definitions, job_name: str) -> dg.DagsterRun:
        # A run carries its job's tags, as when a sensor or the launchpad starts it.
        tags = defs.resolve_job_def(job_name).tags
        return create_run_for_test(instance, job_name=job_name, status=DagsterRunStatus.FAILURE, tags=tags)

    crashed = RunFailureReason.UNEXPECTED_TERMINATION
    assert auto_reexecution_should_retry_run(instance, failed(tpu_defs, "build_tpu"), crashed)
    assert not auto_reexecution_should_retry_run(instance, failed(tpu_defs, "build_tpu"), RunFailureReason.STEP_FAILURE)
    assert not auto_reexecution_should_retry_run(instance, failed(tpu_defs, "promote_tpu"), crashed)
    assert not auto_reexecution_should_retry_run(instance, failed(jovian_defs, "build_jovian_rev"), crashed)


def test_non_idempotent_jobs_opt_out_of_run_retries() -> None:
    """values.yaml turns daemon retries on and relies on these jobs' own tag to stay out."""
    for defs, location in ((tpu_defs, "tpu"), (jovian_defs, "jovian")):
        for name in NON_IDEMPOTENT_JOBS[location]:
            assert defs.resolve_job_def(name).tags.get("dagster/max_retries") == "0", name


# ---- 3. the run worker Job --------------------------------------------------------------------------


def code_server_container_context(values: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What the user-deployments subchart hands the code server in DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT
    (charts/dagster-user-deployments/templates/helpers/_helpers.tpl, "k8sContainerContext"), which the
    server reports with every run it launches."""
    sub = values["dagster-user-deployments"]
    d = next(d for d in sub["deployments"] if d["name"] == name)
    known = set(json.loads(SCHEMA.read_text(encoding="utf-8"))["$defs"]["UserDeployment"]["properties"])
    _strict(d, known, f"deployment {name}")
    assert (d.get("includeConfigInLaunchedRuns") or {"enabled": True})["enabled"]
    subchart = _fullname("dagster-user-deployments")
    k8s: dict[str, Any] = {
        "image_pull_policy": d["image"]["pullPolicy"],
        "env_config_maps": [f"{subchart}-{name}-user-env", *_names(d.get("envConfigMaps"))],
        "namespace": NAMESPACE,
        "service_account_name": (
            values.get("global", {}).get("serviceAccountName") or f"{subchart}-user-deployments"
        ),
    }
    if sub.get("imagePullSecrets"):
        k8s["image_pull_secrets"] = sub["imagePullSecrets"]
    if d.get("envSecrets"):
        k8s["env_secrets"] = _names(d["envSecrets"])
    for key, out in (("volumeMounts", "volume_mounts"), ("volumes", "volumes"), ("labels", "labels"),
                     ("resources", "resources"), ("schedulerName", "scheduler_name")):
        if d.get(key):
            k8s[out] = d[key]
    if isinstance(d.get("env"), list) and d["env"]:
        k8s["env"] = d["env"]
    if d.get("sidecarContainers") or d.get("initContainers"):
        k8s["run_k8s_config"] = {"pod_spec_config": {
            **({"containers": d["sidecarContainers"]} if d.get("sidecarContainers") else {}),
            **({"init_containers": d["initContainers"]} if d.get("initContainers") else {}),
        }}
    # The chart passes it through `fromYaml | toJson`: a JSON round trip.
    return json.loads(json.dumps({"k8s": k8s}))


class RecordingBatchApi:
    """Stands in for kubernetes.client.BatchV1Api: keeps the Job instead of sending it."""

    def __init__(self) -> None:
        self.created: list[tuple[str, kubernetes.client.V1Job]] = []

    def create_namespaced_job(self, body: kubernetes.client.V1Job, namespace: str, **_: Any) -> None:
        self.created.append((namespace, body))


def _module_of(location: str) -> str:
    """The module workspace.yaml (what `dagster dev` and the demo load) gives the location."""
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text(encoding="utf-8"))
    modules = {e["python_module"]["location_name"]: e["python_module"]["module_name"]
               for e in workspace["load_from"]}
    return modules[location]


@pytest.mark.parametrize(("location", "job_name"), [("jovian", "build_jovian_rev"), ("tpu", "build_tpu")])
def test_run_worker_job(
    location: str,
    job_name: str,
    rendered: dict[str, Any],
    instance_dir: Path,
    instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = load_values()
    deployment = _deployment(values, location)
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    assert deployment["dagsterApiGrpcArgs"] == ["-m", _module_of(location)]
    for name, value in FAKE_SECRETS.items():
        monkeypatch.setenv(name, value)

    # A real K8sRunLauncher from the rendered config; only the cluster is missing.
    monkeypatch.setattr("dagster_k8s.launcher.load_kubernetes_config", lambda **_: None)
    batch = RecordingBatchApi()
    config = process_config(K8sRunLauncher.config_type(), rendered["run_launcher"]["config"])
    assert config.success, [e.message for e in config.errors]
    launcher = K8sRunLauncher(
        **config.value, k8s_client_batch_api=batch, k8s_client_core_api=object()  # type: ignore[arg-type]
    )
    launcher.register_instance(instance)
    # Run workers get the production instance (PostgreSQL) by reference, not the test's SQLite one.
    production_ref = InstanceRef.from_dir(str(instance_dir))
    monkeypatch.setattr(instance, "get_ref", lambda: production_ref)

    # The origin the code server reports: DAGSTER_CURRENT_IMAGE and the chart's container context.
    repository_origin = RepositoryPythonOrigin(
        executable_path="/opt/lockstep/.venv/bin/python",
        code_pointer=ModuleCodePointer(_module_of(location), "defs", None),
        container_image=image,
        entry_point=["dagster"],
        container_context=code_server_container_context(values, location),
    )
    remote_origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            GrpcServerCodeLocationOrigin(
                host=f"{RELEASE}-{location}", port=deployment["port"], location_name=location
            ),
            "__repository__",
        ),
        job_name,
    )
    # The job's own tags ride on every run (a `dagster-k8s/config` tag there would beat values.yaml).
    defs = {"tpu": tpu_defs, "jovian": jovian_defs}[location]
    partition = {"tpu": "0" * 40, "jovian": "r35"}[location]
    run = create_run_for_test(
        instance,
        job_name=job_name,
        job_code_origin=JobPythonOrigin(job_name, repository_origin),
        remote_job_origin=remote_origin,
        tags={**defs.resolve_job_def(job_name).tags, "dagster/partition": partition},
    )
    launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))

    assert len(batch.created) == 1
    namespace, job = batch.created[0]
    assert namespace == NAMESPACE
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    text = json.dumps(manifest)
    pod = manifest["spec"]["template"]
    container = pod["spec"]["containers"][0]

    # Nothing secret inline, anywhere: not in env, args (the instance ref), labels or annotations.
    leaked = [s[:8] for s in (*FAKE_SECRETS.values(), FAKE_SSH_KEY, FAKE_SSH_KEY.splitlines()[1]) if s in text]
    assert not leaked, f"secret values inline in the Job (starting {leaked})"
    assert manifest["spec"]["backoffLimit"] == 0  # only Dagster decides whether a run goes again

    assert container["image"] == image
    assert "command" not in container  # the image's own (empty) entrypoint runs the args
    assert container["args"][:3] == ["dagster", "api", "execute_run"]
    args = dg.deserialize_value(container["args"][3])
    assert args.job_origin.job_name == job_name
    assert args.job_origin.repository_origin.code_pointer.module == _module_of(location)
    storage_yaml = args.instance_ref.storage_data.config_yaml
    assert values["postgresql"]["postgresqlHost"] in storage_yaml and "DAGSTER_PG_PASSWORD" in storage_yaml

    env = {e["name"]: e for e in container["env"]}
    assert len(env) == len(container["env"]), "an env var set twice"
    inline = {name for name, e in env.items() if "value" in e}
    assert inline <= {"DAGSTER_RUN_JOB_NAME", "DAGSTER_HOME", "LOCKSTEP_SITE", "GIT_SSH_COMMAND"}, inline
    assert env["DAGSTER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": values["global"]["postgresqlSecretName"], "key": "postgresql-password",
    }
    assert not set(FAKE_SECRETS) & inline
    env_from = container["envFrom"]
    assert {"secretRef": {"name": "lockstep-secrets"}} in env_from
    assert env_from.count({"secretRef": {"name": "lockstep-secrets"}}) == 1
    assert any(ref.get("configMapRef", {}).get("name", "").endswith(f"-{location}-user-env") for ref in env_from)

    # The site file and the SSH key arrive as files, each volume once (launcher and location agree).
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert len(volumes) == len(pod["spec"]["volumes"])
    assert volumes["lockstep-site"]["configMap"]["name"] == "lockstep-site"
    assert volumes["lockstep-ssh"]["secret"]["secretName"] == "lockstep-ssh"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert len(mounts) == len(container["volumeMounts"])
    site = mounts["lockstep-site"]
    site_path = site["mountPath"] if site.get("subPath") == "site.toml" else f"{site['mountPath']}/site.toml"
    assert env["LOCKSTEP_SITE"]["value"] == site_path
    ssh_dir = mounts["lockstep-ssh"]["mountPath"]
    git_ssh = shlex.split(env["GIT_SSH_COMMAND"]["value"])
    assert git_ssh[git_ssh.index("-i") + 1].startswith(f"{ssh_dir}/")
    assert "BatchMode=yes" in git_ssh  # a prompt would hang a sensor tick
    # The code server (sensors) sees the same values through the location's env ConfigMap.
    for name in ("LOCKSTEP_SITE", "GIT_SSH_COMMAND"):
        assert env[name]["value"] == deployment["env"][name], name

    assert container["resources"] == deployment["resources"]
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
    tpu, jovian = _deployment(values, "tpu")["resources"], _deployment(values, "jovian")["resources"]
    for kind in ("requests", "limits"):
        assert gib(jovian[kind]["memory"]) > gib(tpu[kind]["memory"]), kind
        assert gib(jovian[kind]["memory"]) >= 2


# ---- 4. the Dockerfile --------------------------------------------------------------------------------


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
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile() -> None:
    steps = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    kinds = [kind for kind, _ in steps]
    froms = [args for kind, args in steps if kind == "FROM"]
    uv_version = re.search(r"^UV_VERSION=(\S+)$", (REPO / "dev").read_text(encoding="utf-8"), re.M)
    assert uv_version is not None
    assert froms[0].split()[0] == f"ghcr.io/astral-sh/uv:{uv_version.group(1)}"  # the uv ./dev installs
    assert froms[-1].split()[0] == "python:3.11-slim"

    runs = [args for kind, args in steps if kind == "RUN"]
    apt = next(r for r in runs if "apt-get install" in r)
    assert {"git", "openssh-client"} <= set(apt.split())
    syncs = [shlex.split(r) for r in runs if "uv sync" in r]
    assert syncs and all({"--frozen", "--no-dev"} <= set(s) for s in syncs)
    assert all(not re.search(r"--(all-groups|group|extra|all-extras)\b", " ".join(s)) for s in syncs)
    # No .dockerignore: copying the whole context would bake in .sandbox, .venv and .git.
    copies = [args.split() for kind, args in steps if kind == "COPY"]
    assert all(not {".", "./"} & set(c[:-1]) for c in copies if not c[0].startswith("--from"))

    user = [args for kind, args in steps if kind == "USER"]
    assert user and user[-1].split(":")[0] not in {"root", "0"}
    for deployment in load_values()["dagster-user-deployments"]["deployments"]:
        # Kubernetes runs the image as this uid and gives the secret files to this group.
        pod = deployment["podSecurityContext"]
        assert user[-1] == f"{pod['runAsUser']}:{pod['runAsGroup']}" and pod["fsGroup"] == pod["runAsGroup"]
    last_user = max(i for i, kind in enumerate(kinds) if kind == "USER")
    assert kinds.index("CMD") > last_user
    assert "RUN" not in kinds[last_user:]
    assert "ENTRYPOINT" not in kinds  # the chart and K8sRunLauncher give the whole command as args
    assert any("/.venv/bin" in args for kind, args in steps if kind == "ENV" and "PATH=" in args)

    secretish = re.compile(r"token|passw|passphrase|secret|credential|api_key|private_key", re.I)
    for kind, args in steps:
        if kind in {"ARG", "ENV"}:
            assert not secretish.search(args), f"{kind} {args}"

    ports = {int(p.split("/")[0]) for kind, args in steps if kind == "EXPOSE" for p in args.split()}
    assert {d["port"] for d in load_values()["dagster-user-deployments"]["deployments"]} <= ports
