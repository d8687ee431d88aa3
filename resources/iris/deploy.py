"""What a deployment must give the iris CLI before lockstep submits anything: the binary, and for a
cluster reached through Kubernetes, the kubeconfig. Checked before every submit (`IrisCli.submit`),
so a deployment that lacks either fails its first TPU build with ONE message that names every
missing piece and says how to add it on the deployment it runs in, and nothing reaches the cluster.

The deployment kind is `LOCKSTEP_DEPLOYMENT`: ``kubernetes`` (deploy/k8s/values.yaml sets it in code
servers and run pods), ``compose`` (deploy/docker), unset on a developer machine or the sandbox.

When a kubeconfig is needed: with ``[iris] cluster`` or ``config`` the CLI loads a cluster config
and, for the CoreWeave platform the cw-* clusters run on, talks to that cluster's Kubernetes API
through a kubeconfig (`CoreweavePlatformConfig.kubeconfig_path`, "in-cluster auth if empty": inside
our own pod that would be OUR cluster, not the iris one; marin-community/marin
`lib/iris/src/iris/cluster/config.py`, mirror Stars1233/marin at 2f501a9a). With ``controller_url``
it dials the controller directly and needs none. A deployment sets KUBECONFIG explicitly (there is
no ~/.kube in an image); a developer machine keeps its credentials where its iris already finds them
(KUBECONFIG or ~/.kube/config), and the sandbox's iris needs none, so there only a KUBECONFIG
naming a missing or unreadable file is refused.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from resources.iris.output import IrisError

DEPLOYMENT_ENV = "LOCKSTEP_DEPLOYMENT"
Deployment = Literal["compose", "kubernetes"]
DEPLOYMENTS: tuple[Deployment, ...] = ("compose", "kubernetes")
Target = Literal["cluster", "config", "controller_url"]

# Where the deployments put things (deploy/k8s/values.yaml;
# deploy/Dockerfile's iris build argument).
IMAGE_IRIS = "/opt/iris/bin/iris"
# deploy/Dockerfile: 1 (the default) installs marin-iris into /opt/iris
IRIS_BUILD_ARG = "WITH_IRIS"
KUBE_DIR = "/etc/lockstep/kube"
KUBECONFIG_PATH = f"{KUBE_DIR}/config"
K8S_NAMESPACE = "lockstep"
K8S_KUBE_SECRET = "lockstep-kube"


class IrisNotDeployed(IrisError):
    """The deployment lacks the iris CLI or its cluster credentials; nothing was submitted."""


def deployment_kind(env: Mapping[str, str]) -> Deployment | None:
    value = env.get(DEPLOYMENT_ENV, "").strip()
    if not value:
        return None
    if value not in DEPLOYMENTS:
        raise IrisNotDeployed(
            f"{DEPLOYMENT_ENV}={value!r} is not a deployment lockstep knows: set it to "
            f"{' or '.join(DEPLOYMENTS)}, or unset it on a developer machine; nothing was submitted"
        )
    return value  # type: ignore[return-value]


def needs_kubeconfig(target: Target) -> bool:
    """Whether the CLI reaches the cluster through Kubernetes credentials (see the module doc)."""
    return target != "controller_url"


def _binary_problem(binary: str, kind: Deployment | None) -> str | None:
    located = binary if "/" in binary else shutil.which(binary)
    if located and Path(located).is_file() and os.access(located, os.X_OK):
        return None
    what = (
        f"no executable iris CLI at {binary}"
        if "/" in binary
        else f"no iris CLI named {binary!r} on PATH"
    )
    if kind == "kubernetes":
        how = (
            "build the image with the iris CLI (deploy/Dockerfile's default `--build-arg "
            f"{IRIS_BUILD_ARG}=1` installs "
            f"marin-iris, pinned by deploy/iris-requirements.txt, into /opt/iris), set its tag in "
            f"deploy/k8s/values.yaml (x-lockstep-image) and "
            f'`helm upgrade`, and set [iris] binary = "{IMAGE_IRIS}" in the lockstep-site '
            "ConfigMap's site.toml"
        )
    elif kind == "compose":
        how = (
            "rebuild the image with the iris CLI (deploy/Dockerfile's default "
            f"{IRIS_BUILD_ARG}=1 installs marin-iris "
            "into /opt/iris: `docker compose -p lockstep -f deploy/docker/docker-compose.yml up "
            "-d --build`), and set [iris] binary = "
            f'"{IMAGE_IRIS}" in the site file'
        )
    else:
        how = (
            "install it (`uv pip install marin-iris` or `pip install marin-iris`) and set [iris] "
            "binary to its path "
            "(a relative path is relative to the site file)"
        )
    return f"{what}: {how}"


def _kubeconfig_problem(
    env: Mapping[str, str], kind: Deployment | None, target: Target
) -> str | None:
    path = env.get("KUBECONFIG", "")
    if not needs_kubeconfig(target) or (kind is None and not path):
        return None
    # KUBECONFIG may list several files (':'): each must be there, as kubectl reads them all.
    files = [p for p in path.split(os.pathsep) if p]
    bad = [p for p in files if not (Path(p).is_file() and os.access(p, os.R_OK))]
    if files and not bad:
        return None
    what = (
        (
            f"the cluster credentials: KUBECONFIG names {', '.join(bad)}, which is missing, "
            "not a file, or unreadable"
        )
        if bad
        else "the cluster credentials: KUBECONFIG is not set"
    )
    why = f"([iris] {target} reaches the iris cluster through its Kubernetes API)"
    if kind == "kubernetes":
        how = (
            f"create the Secret: `kubectl -n {K8S_NAMESPACE} create secret generic "
            f"{K8S_KUBE_SECRET} "
            "--from-file=config=<the iris cluster's kubeconfig>`; deploy/k8s/values.yaml mounts "
            f"it at {KUBE_DIR} "
            f"(volume {K8S_KUBE_SECRET}) and sets KUBECONFIG={KUBECONFIG_PATH} (x-lockstep-env "
            "and the "
            "runLauncher's envVars); the next run pod has it"
        )
    elif kind == "compose":
        how = (
            "put the iris cluster's kubeconfig as `config` in the host directory "
            "LOCKSTEP_KUBE_DIR names (default "
            f"{KUBE_DIR}; mounted read-only at {KUBE_DIR} into the code servers and run "
            "containers, readable by "
            f"uid 10001) and set KUBECONFIG={KUBECONFIG_PATH} in deploy/docker/.env, then "
            "`docker compose -p lockstep -f deploy/docker/docker-compose.yml up -d`"
        )
    else:
        how = (
            "export KUBECONFIG=<a readable kubeconfig of the iris cluster>, or unset it to use "
            "~/.kube/config"
        )
    return f"{what} {why}: {how}"


def check_iris_setup(*, binary: str, target: Target, env: Mapping[str, str] | None = None) -> None:
    """Raise IrisNotDeployed naming every missing piece
    at once; return quietly when all are there."""
    env = os.environ if env is None else env
    kind = deployment_kind(env)
    problems = [
        p for p in (_binary_problem(binary, kind), _kubeconfig_problem(env, kind, target)) if p
    ]
    if problems:
        where = f"this {kind} deployment" if kind else "this machine"
        raise IrisNotDeployed(
            f"iris cannot run on {where}; nothing was submitted. Missing: "
            + "; and ".join(problems)
        )
