"""What the Dagster Helm chart (1.13.27) makes of deploy/k8s/values.yaml, reproduced offline: the
instance's dagster.yaml (templates/configmap-instance.yaml and templates/helpers/instance/*.tpl),
the container context the user-deployments subchart hands each code server, and the Kubernetes Job a
real K8sRunLauncher creates for a run. Shared by tests/deploy/test_k8s.py (which checks them) and
tests/deploy/test_k8s_run_mounts.py (which runs the Job's volumes on a real engine)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import dagster as dg
import kubernetes.client
import yaml
from dagster._config import process_config
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import create_run_for_test
from dagster_k8s import K8sRunLauncher

REPO = Path(__file__).resolve().parents[3]
VALUES = REPO / "deploy" / "k8s" / "values.yaml"
SCHEMA = REPO / "tests" / "deploy" / "helm_schema" / "values.schema.json"
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


def load_values(text: str | None = None) -> dict[str, Any]:
    """values.yaml, or the values in `text` (e.g. an older revision of it)."""
    return yaml.safe_load(VALUES.read_text(encoding="utf-8") if text is None else text)


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps deep-merged, everything else (lists too) replaced."""
    out = dict(copy.deepcopy(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def deployment(values: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in values["dagster-user-deployments"]["deployments"] if d["name"] == name)


def fullname(chart: str) -> str:
    """The charts' `dagster.fullname` helper, no overrides."""
    return RELEASE if chart in RELEASE else f"{RELEASE}-{chart}"


def strict(section: Mapping[str, Any] | None, known: set[str], where: str) -> Mapping[str, Any]:
    """The template reads only `known`: any other key is a typo the chart would silently ignore."""
    section = section or {}
    unknown = set(section) - known
    assert not unknown, f"{where}: {sorted(unknown)} is not read by the chart's templates"
    return section


def names(refs: list[Mapping[str, Any]] | None) -> list[str]:
    return [ref["name"] for ref in refs or [] if "name" in ref]


def render_run_launcher(v: Mapping[str, Any]) -> dict[str, Any]:
    """templates/helpers/instance/_run-launcher.tpl, "dagsterYaml.runLauncher.k8s"."""
    assert v["runLauncher"]["type"] == "K8sRunLauncher"
    k = strict(
        v["runLauncher"]["config"]["k8sRunLauncher"],
        {
            "image",
            "imagePullPolicy",
            "jobNamespace",
            "loadInclusterConfig",
            "kubeconfigFile",
            "envConfigMaps",
            "envSecrets",
            "envVars",
            "volumeMounts",
            "volumes",
            "labels",
            "failPodOnRunFailure",
            "resources",
            "schedulerName",
            "securityContext",
            "runK8sConfig",
        },
        "runLauncher.config.k8sRunLauncher",
    )
    config: dict[str, Any] = {
        "load_incluster_config": k["loadInclusterConfig"],
        "job_namespace": k.get("jobNamespace") or NAMESPACE,
        "image_pull_policy": k["imagePullPolicy"],
        "service_account_name": (
            v["global"]["serviceAccountName"] or v["serviceAccount"]["name"] or fullname("dagster")
        ),
        "dagster_home": v["global"]["dagsterHome"],
        "instance_config_map": f"{fullname('dagster')}-instance",
        "postgres_password_secret": v["global"]["postgresqlSecretName"],
    }
    if k.get("kubeconfigFile"):
        config["kubeconfig_file"] = k["kubeconfigFile"]
    if v.get("imagePullSecrets"):
        config["image_pull_secrets"] = v["imagePullSecrets"]
    if "image" in k:
        config["job_image"] = f"{k['image']['repository']}:{k['image']['tag']}"
    if k.get("envConfigMaps"):
        config["env_config_maps"] = names(k["envConfigMaps"])
    if k.get("envSecrets"):
        config["env_secrets"] = names(k["envSecrets"])
    for key, out in (
        ("envVars", "env_vars"),
        ("volumeMounts", "volume_mounts"),
        ("volumes", "volumes"),
        ("labels", "labels"),
        ("resources", "resources"),
        ("schedulerName", "scheduler_name"),
        ("securityContext", "security_context"),
    ):
        if k.get(key):
            config[out] = k[key]
    if k.get("failPodOnRunFailure"):
        config["fail_pod_on_run_failure"] = True
    if k.get("runK8sConfig"):
        run_k8s = strict(
            k["runK8sConfig"],
            {
                "containerConfig",
                "podSpecConfig",
                "podTemplateSpecMetadata",
                "jobSpecConfig",
                "jobMetadata",
            },
            "runK8sConfig",
        )
        config["run_k8s_config"] = {
            re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value
            for key, value in run_k8s.items()
            if value
        }
    return {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": config}


def render_run_coordinator(v: Mapping[str, Any]) -> dict[str, Any]:
    """templates/helpers/instance/_run-coordinator.tpl, "dagsterYaml.runCoordinator.queued" (the
    version that leaves max_concurrent_runs out when `concurrency`
    sets it). The chart still names the module
    `dagster.core...`; Dagster maps that to `dagster._core` when it loads the class."""
    rc = strict(
        v["dagsterDaemon"]["runCoordinator"], {"enabled", "type", "config"}, "runCoordinator"
    )
    assert rc["type"] == "QueuedRunCoordinator"
    q = strict(
        rc["config"]["queuedRunCoordinator"],
        {
            "maxConcurrentRuns",
            "tagConcurrencyLimits",
            "dequeueIntervalSeconds",
            "dequeueNumWorkers",
            "dequeueUseThreads",
            "blockOpConcurrencyLimitedRuns",
        },
        "queuedRunCoordinator",
    )
    rendered: dict[str, Any] = {
        "module": "dagster.core.run_coordinator",
        "class": "QueuedRunCoordinator",
    }
    if not any(value not in (None, False, 0, "", [], {}) for value in q.values()):
        return rendered
    config: dict[str, Any] = {}
    if not v["concurrency"]["enabled"] or q.get("maxConcurrentRuns") is not None:
        config["max_concurrent_runs"] = (
            -1 if q.get("maxConcurrentRuns") is None else q["maxConcurrentRuns"]
        )
    for key, out in (
        ("tagConcurrencyLimits", "tag_concurrency_limits"),
        ("dequeueIntervalSeconds", "dequeue_interval_seconds"),
        ("dequeueUseThreads", "dequeue_use_threads"),
        ("dequeueNumWorkers", "dequeue_num_workers"),
    ):
        if q.get(key):
            config[out] = q[key]
    if q.get("blockOpConcurrencyLimitedRuns"):
        block = q["blockOpConcurrencyLimitedRuns"]
        config["block_op_concurrency_limited_runs"] = {
            "enabled": block["enabled"],
            "op_concurrency_slot_buffer": block["opConcurrencySlotBuffer"],
        }
    return {**rendered, "config": config}


def render_concurrency(v: Mapping[str, Any]) -> dict[str, Any]:
    """templates/helpers/instance/_concurrency.tpl,
    with its refusal to set a limit in two places."""
    c = strict(v["concurrency"], {"enabled", "pools", "runs"}, "concurrency")
    pools = strict(
        c.get("pools"),
        {"defaultLimit", "granularity", "opGranularityRunBuffer"},
        "concurrency.pools",
    )
    runs = strict(c.get("runs"), {"maxConcurrentRuns", "tagConcurrencyLimits"}, "concurrency.runs")
    queued = v["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued.get("maxConcurrentRuns") is None or runs.get("maxConcurrentRuns") is None, (
        "chart: set it once"
    )
    assert not (queued.get("tagConcurrencyLimits") and runs.get("tagConcurrencyLimits")), (
        "chart: set it once"
    )
    out: dict[str, Any] = {}
    rendered_pools = {
        snake: pools[camel]
        for camel, snake in (
            ("defaultLimit", "default_limit"),
            ("granularity", "granularity"),
            ("opGranularityRunBuffer", "op_granularity_run_buffer"),
        )
        if pools.get(camel) is not None
    }
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
    v = merged(CHART_DEFAULTS, values)
    pg = strict(
        v["postgresql"],
        {
            "enabled",
            "image",
            "postgresqlHost",
            "postgresqlUsername",
            "postgresqlPassword",
            "postgresqlDatabase",
            "postgresqlParams",
            "postgresqlScheme",
            "service",
        },
        "postgresql",
    )
    # templates/helpers/instance/_postgresql.tpl: the password is only ever an env reference.
    postgres_db: dict[str, Any] = {
        "username": pg["postgresqlUsername"],
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": pg["postgresqlHost"]
        if not pg["enabled"]
        else f"{fullname('dagster')}-postgresql",
        "db_name": pg["postgresqlDatabase"],
        "port": pg["service"]["port"],
        "params": pg.get("postgresqlParams") or {},
    }
    if pg.get("postgresqlScheme"):
        postgres_db["scheme"] = pg["postgresqlScheme"]
    storage = {"postgres_db": postgres_db}
    instance: dict[str, Any] = {
        "schedule_storage": {
            "module": "dagster_postgres.schedule_storage",
            "class": "PostgresScheduleStorage",
            "config": storage,
        },
        "run_storage": {
            "module": "dagster_postgres.run_storage",
            "class": "PostgresRunStorage",
            "config": storage,
        },
        "event_log_storage": {
            "module": "dagster_postgres.event_log",
            "class": "PostgresEventLogStorage",
            "config": storage,
        },
        "run_launcher": render_run_launcher(v),
    }
    daemon = v["dagsterDaemon"]
    if daemon["enabled"] and daemon["runCoordinator"]["enabled"]:
        instance["run_coordinator"] = render_run_coordinator(v)
    monitoring = strict(
        daemon.get("runMonitoring"),
        {
            "enabled",
            "startTimeoutSeconds",
            "cancelTimeoutSeconds",
            "maxRuntimeSeconds",
            "maxResumeRunAttempts",
            "pollIntervalSeconds",
            "freeSlotsAfterRunEndSeconds",
        },
        "dagsterDaemon.runMonitoring",
    )
    if daemon["enabled"] and monitoring.get("enabled"):
        instance["run_monitoring"] = {
            "enabled": True,
            "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
            "free_slots_after_run_end_seconds": monitoring["freeSlotsAfterRunEndSeconds"],
            **{
                snake: monitoring[camel]
                for camel, snake in (
                    ("cancelTimeoutSeconds", "cancel_timeout_seconds"),
                    ("maxRuntimeSeconds", "max_runtime_seconds"),
                    ("maxResumeRunAttempts", "max_resume_run_attempts"),
                )
                if monitoring.get(camel) is not None
            },
        }
    retries = strict(
        daemon.get("runRetries"),
        {"enabled", "maxRetries", "retryOnAssetOrOpFailure"},
        "dagsterDaemon.runRetries",
    )
    if daemon["enabled"] and retries.get("enabled"):
        instance["run_retries"] = {"enabled": True}
        if retries.get("maxRetries"):
            instance["run_retries"]["max_retries"] = retries["maxRetries"]
        if "retryOnAssetOrOpFailure" in retries:
            instance["run_retries"]["retry_on_asset_or_op_failure"] = retries[
                "retryOnAssetOrOpFailure"
            ]
    retention = strict(
        v["retention"], {"enabled", "sensor", "schedule", "autoMaterialize"}, "retention"
    )
    if retention["enabled"]:
        instance["retention"] = {
            key: {"purge_after_days": retention[camel]["purgeAfterDays"]}
            for camel, key in (
                ("sensor", "sensor"),
                ("schedule", "schedule"),
                ("autoMaterialize", "auto_materialize"),
            )
            if retention.get(camel)
        }
    if v["concurrency"]["enabled"]:
        instance["concurrency"] = render_concurrency(v)
    return instance


def code_server_container_context(values: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What the user-deployments subchart hands the code server in
    DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT
    (charts/dagster-user-deployments/templates/helpers/_helpers.tpl,
    "k8sContainerContext"), which the
    server reports with every run it launches."""
    sub = values["dagster-user-deployments"]
    d = next(d for d in sub["deployments"] if d["name"] == name)
    known = set(
        json.loads(SCHEMA.read_text(encoding="utf-8"))["$defs"]["UserDeployment"]["properties"]
    )
    strict(d, known, f"deployment {name}")
    assert (d.get("includeConfigInLaunchedRuns") or {"enabled": True})["enabled"]
    subchart = fullname("dagster-user-deployments")
    k8s: dict[str, Any] = {
        "image_pull_policy": d["image"]["pullPolicy"],
        "env_config_maps": [f"{subchart}-{name}-user-env", *names(d.get("envConfigMaps"))],
        "namespace": NAMESPACE,
        "service_account_name": (
            values.get("global", {}).get("serviceAccountName") or f"{subchart}-user-deployments"
        ),
    }
    if sub.get("imagePullSecrets"):
        k8s["image_pull_secrets"] = sub["imagePullSecrets"]
    if d.get("envSecrets"):
        k8s["env_secrets"] = names(d["envSecrets"])
    for key, out in (
        ("volumeMounts", "volume_mounts"),
        ("volumes", "volumes"),
        ("labels", "labels"),
        ("resources", "resources"),
        ("schedulerName", "scheduler_name"),
    ):
        if d.get(key):
            k8s[out] = d[key]
    if isinstance(d.get("env"), list) and d["env"]:
        k8s["env"] = d["env"]
    if d.get("sidecarContainers") or d.get("initContainers"):
        k8s["run_k8s_config"] = {
            "pod_spec_config": {
                **({"containers": d["sidecarContainers"]} if d.get("sidecarContainers") else {}),
                **({"init_containers": d["initContainers"]} if d.get("initContainers") else {}),
            }
        }
    # The chart passes it through `fromYaml | toJson`: a JSON round trip.
    return json.loads(json.dumps({"k8s": k8s}))


class RecordingBatchApi:
    """Stands in for kubernetes.client.BatchV1Api: keeps the Job instead of sending it."""

    def __init__(self) -> None:
        self.created: list[tuple[str, kubernetes.client.V1Job]] = []

    def create_namespaced_job(
        self, body: kubernetes.client.V1Job, namespace: str, **_: Any
    ) -> None:
        self.created.append((namespace, body))


def module_of(location: str) -> str:
    """The module workspace.yaml (what `dagster dev` and the demo load) gives the location."""
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text(encoding="utf-8"))
    modules = {
        e["python_module"]["location_name"]: e["python_module"]["module_name"]
        for e in workspace["load_from"]
    }
    return modules[location]


def launch_run_job(
    *,
    run: dg.DagsterRun,
    instance: dg.DagsterInstance,
    instance_ref: InstanceRef,
    launcher_config: Mapping[str, Any],
) -> dict[str, Any]:
    """The Job manifest (a dict, as `kubectl get -o
    json` shows it) a real K8sRunLauncher, configured by
    `launcher_config` (render_run_launcher's config), creates for `run`; only the cluster is
    missing. Run workers get `instance_ref` (the production instance), not `instance`'s."""
    config = process_config(K8sRunLauncher.config_type(), dict(launcher_config))
    assert config.success, [e.message for e in config.errors]
    batch = RecordingBatchApi()
    with (
        mock.patch("dagster_k8s.launcher.load_kubernetes_config", lambda **_: None),
        mock.patch.object(instance, "get_ref", lambda: instance_ref),
    ):
        launcher = K8sRunLauncher(
            **config.value,
            k8s_client_batch_api=batch,
            k8s_client_core_api=object(),  # type: ignore[arg-type]
        )
        launcher.register_instance(instance)
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    assert len(batch.created) == 1
    namespace, job = batch.created[0]
    assert namespace == NAMESPACE
    return kubernetes.client.ApiClient().sanitize_for_serialization(job)


def run_for_location(
    values: Mapping[str, Any],
    instance: dg.DagsterInstance,
    *,
    location: str,
    job_name: str,
    tags: Mapping[str, str],
    executable_path: str = "/opt/lockstep/.venv/bin/python",
    asset_selection: frozenset[dg.AssetKey] | None = None,
) -> dg.DagsterRun:
    """A run of `job_name` as `location`'s code server
    creates it: the origin it reports carries the image
    (DAGSTER_CURRENT_IMAGE) and the chart's container context."""
    d = deployment(dict(values), location)
    repository_origin = RepositoryPythonOrigin(
        executable_path=executable_path,
        code_pointer=ModuleCodePointer(module_of(location), "defs", None),
        container_image=f"{d['image']['repository']}:{d['image']['tag']}",
        entry_point=["dagster"],
        container_context=code_server_container_context(values, location),
    )
    remote_origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            GrpcServerCodeLocationOrigin(
                host=f"{RELEASE}-{location}", port=d["port"], location_name=location
            ),
            "__repository__",
        ),
        job_name,
    )
    return create_run_for_test(
        instance,
        job_name=job_name,
        job_code_origin=JobPythonOrigin(job_name, repository_origin),
        remote_job_origin=remote_origin,
        tags=dict(tags),
        asset_selection=asset_selection,
    )
