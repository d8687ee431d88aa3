"""What a person must do, on the deployment lockstep runs
in, for the code servers to load an edited site file.

The "site changed" error is read by whoever edited the file, in the UI of one deployment. A generic
"reload the code location" is wrong on two of the three: the Kubernetes chart starts code servers
with `dagster api grpc`, which cannot reload, and the compose deployment's code servers are
long-lived containers that the deployment restarts, not the UI. The deployments say which they are
in `LOCKSTEP_DEPLOYMENT` (deploy/docker/.env, deploy/k8s/values.yaml); unset is `lockstep demo` or
`dagster dev`, where a reload is right.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEPLOYMENT_ENV = "LOCKSTEP_DEPLOYMENT"
# The compose project's fixed name: deploy/docker runs as project `lockstep`, and compose finds its
# containers by project, so the command works from the repo root whatever the checkout is called.
COMPOSE_RESTART = (
    "docker compose -p lockstep -f deploy/docker/docker-compose.yml restart tpu jovian"
)
# The Dagster chart (1.13, charts/dagster-user-deployments/templates/deployment-user.yaml) labels
# each user deployment `component: user-deployments` and `deployment: <name>`; ours are named tpu
# and jovian. A selector, not the Deployment names, which carry the Helm release's name
# (dagster-dagster-user-deployments-tpu for release `dagster`).
K8S_USER_DEPLOYMENTS = "component=user-deployments,deployment in (tpu,jovian)"
# What the chart sets in every code server pod (its
# user-deployments shared env), then the pod's own.
K8S_NAMESPACE_ENV = "DAGSTER_K8S_PIPELINE_RUN_NAMESPACE"
K8S_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def k8s_namespace(env: Mapping[str, str], namespace_file: Path = K8S_NAMESPACE_FILE) -> str:
    """The namespace the code servers run in, or a placeholder a person fills in."""
    if name := env.get(K8S_NAMESPACE_ENV, "").strip():
        return name
    try:
        return namespace_file.read_text(encoding="utf-8").strip() or "<namespace>"
    except OSError:
        return "<namespace>"


def reload_advice(
    env: Mapping[str, str] | None = None, namespace_file: Path = K8S_NAMESPACE_FILE
) -> str:
    """The sentence that tells a person how to get the
    code servers onto the site file as it is now."""
    env = os.environ if env is None else env
    deployment = env.get(DEPLOYMENT_ENV, "").strip()
    if deployment == "compose":
        return (
            f"Restart the code server containers: `{COMPOSE_RESTART}` "
            "(sensors tick in the code servers, which keep the file they loaded until then), "
            "then run again"
        )
    if deployment == "kubernetes":
        namespace = k8s_namespace(env, namespace_file)
        return (
            "Restart both code servers (the chart's `dagster api grpc` cannot reload): "
            f"`kubectl -n {namespace} rollout restart deployment -l '{K8S_USER_DEPLOYMENTS}'` "
            "(sensors tick in the code servers, which keep the file they loaded until then), "
            "then run again"
        )
    unknown = (
        f" ({DEPLOYMENT_ENV}={deployment!r} is neither compose nor kubernetes)"
        if deployment
        else ""
    )
    return (
        "Reload the code location (UI: Deployment -> Reload, or restart `lockstep demo`), "
        f"then run again{unknown}"
    )
