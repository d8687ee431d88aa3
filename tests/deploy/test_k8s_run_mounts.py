"""Issue 24 item 2: Kubernetes runs share what they must. The run pod's volumes and mounts come from
the Job a real K8sRunLauncher makes from deploy/k8s/values.yaml (tests/support/deploy/k8s_chart.py);
each volume becomes a host directory (a PVC: one directory per claim, shared by every pod; a
ConfigMap or Secret: a directory holding its keys; an emptyDir: a fresh directory per pod), and an
adoption and then a build run in two separate containers on a real
Docker engine, each with exactly its pod's mounts.

No image is built: the containers run the sandbox's python base (sandbox/base_image.py) with this
repo, its .venv and the interpreter that .venv was made from bind-mounted read-only at their own
paths, standing for the lockstep image. The sandbox root is mounted too, read-only but for its git
remotes (file:// URLs, which adoption pushes the build profile to): it stands for the outside world,
not for anything one run leaves for another. `--network host`, so the
containers reach the sandbox's services on 127.0.0.1. The second container does what `jovian/image`
does before the build node is involved (tests/support/deploy/k8s_pod_entry.py): load source_lock,
build_profile and dep_trees through the IO manager and stage the
build context with the dep trees from LOCKSTEP_CACHE.

With the values before the shared claim (fixtures/values_before_issue24.yaml) the second container
fails for want of the first's outputs: the test proves the claim is what makes the build work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from sandbox.engines import DOCKER, Engine, require_docker_io
from sandbox.jovian_world import new_lab_rev
from sandbox.world import Sandbox
from tests.support.deploy.k8s_chart import (
    REPO,
    deployment,
    launch_run_job,
    load_values,
    render_instance,
    run_for_location,
)

pytestmark = pytest.mark.heavy(60)

BEFORE = Path(__file__).parent / "fixtures" / "values_before_issue24.yaml"
BASE_IMAGE = "lockstep-sandbox/python:3.11"
REV = "r28"
RUN_TIMEOUT_S = 600
# The repo is importable as the image's installed
# packages are; it is read-only, so no .pyc is written.
PYTHON_ENV = {"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}


def run_pod(values: Mapping[str, Any], job_name: str) -> dict[str, Any]:
    """The pod spec of the Job the launcher creates for a `job_name` run of the jovian location."""
    with dg.instance_for_test() as instance:
        run = run_for_location(
            values, instance, location="jovian", job_name=job_name, tags={"dagster/partition": REV}
        )
        manifest = launch_run_job(
            run=run,
            instance=instance,
            instance_ref=instance.get_ref(),
            launcher_config=render_instance(values)["run_launcher"]["config"],
        )
    return manifest["spec"]["template"]["spec"]


def pod_env(values: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The container's plain environment: its inline
    values and the location's env ConfigMap (envFrom).
    Secret refs are left out: nothing these two steps run reads a secret."""
    env = {str(k): str(v) for k, v in (deployment(dict(values), "jovian").get("env") or {}).items()}
    env |= {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return env


class HostVolumes:
    """Each volume of a pod as a host directory; claims shared across pods, emptyDirs per pod."""

    def __init__(self, root: Path, files: Mapping[str, Mapping[str, bytes]]) -> None:
        self.root, self.files, self.pods = root, files, 0

    def mounts(self, pod: Mapping[str, Any]) -> list[str]:
        """`docker run -v` arguments for the pod's one container."""
        self.pods += 1
        volumes = {v["name"]: v for v in pod["volumes"]}
        args: list[str] = []
        for mount in pod["containers"][0]["volumeMounts"]:
            source = self._directory(volumes[mount["name"]])
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if "persistentVolumeClaim" in volumes[mount["name"]]:
                    source.mkdir(exist_ok=True)  # the kubelet makes a missing subPath directory
            args += ["-v", f"{source}:{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"]
        return args

    def _directory(self, volume: Mapping[str, Any]) -> Path:
        if claim := volume.get("persistentVolumeClaim"):
            path = self.root / "claims" / claim["claimName"]
        elif "emptyDir" in volume:
            path = self.root / "empty" / f"pod{self.pods}-{volume['name']}"
        elif ref := volume.get("configMap") or volume.get("secret"):
            name = ref.get("name") or ref["secretName"]
            path = self.root / "objects" / name
            if not path.exists() and not ref.get("optional"):
                assert name in self.files, (
                    f"the pod mounts {name}, which this test does not provide"
                )
            path.mkdir(parents=True, exist_ok=True)
            for key, data in self.files.get(name, {}).items():
                (path / key).write_bytes(data)
        else:
            raise AssertionError(f"a volume of a kind this test cannot map: {volume}")
        path.mkdir(parents=True, exist_ok=True)
        return path


def site_files(sb: Sandbox, *, keys_beside: bool) -> dict[str, bytes]:
    """The lockstep-site ConfigMap for the sandbox: its site.toml (paths it gives relative to itself
    made absolute, since the copy lives elsewhere) and its
    trusted key as a further key beside it; or, for
    values that mount site.toml alone (subPath), the
    key's PEM inline, so the site still loads there."""
    import tomllib

    import tomli_w

    site = tomllib.loads(sb.site_file.read_text(encoding="utf-8"))
    site["iris"]["binary"] = str(sb.root / site["iris"]["binary"])
    site["registry"]["layout_dir"] = str(sb.root / site["registry"]["layout_dir"])
    for node in site["spark"]["nodes"]:
        node["root"] = str(sb.root / node["root"])
    keys = {Path(k).name: (sb.root / k).read_bytes() for k in site["attest"]["trusted_keys"]}
    if not keys_beside:
        site["attest"]["trusted_keys"] = [pem.decode() for pem in keys.values()]
        return {"site.toml": tomli_w.dumps(site).encode()}
    site["attest"]["trusted_keys"] = sorted(keys)  # beside site.toml, as on Kubernetes
    return {"site.toml": tomli_w.dumps(site).encode(), **keys}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    require_docker_io()
    engine = Engine(tmp_path / "engine")
    try:
        engine.start()
        engine.ensure_bases(["python"])
        yield engine
    finally:
        engine.stop()  # its containers (all --rm) stop with it


def run_in_container(
    engine: Engine, name: str, mounts: list[str], env: Mapping[str, str], step: str
) -> subprocess.CompletedProcess[str]:
    interpreter = Path(sys.base_prefix).resolve()  # what .venv/bin/python links to
    argv = [
        str(DOCKER),
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "host",
        "-v",
        f"{REPO}:{REPO}:ro",
        "-v",
        f"{interpreter}:{interpreter}:ro",
        *mounts,
        *(a for k, v in sorted({**env, **PYTHON_ENV}.items()) for a in ("-e", f"{k}={v}")),
        # Like the image (WORKDIR /home/lockstep): no source tree in the working directory, where
        # git would find this checkout's .git instead of the repository it is asked about.
        "-w",
        "/tmp",
        BASE_IMAGE,
        str(REPO / ".venv" / "bin" / "python"),
        "-m",
        "tests.support.deploy.k8s_pod_entry",
        step,
        REV,
    ]
    return subprocess.run(
        argv, env=engine.env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


def outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


@pytest.mark.parametrize("which", ["now", "before"])
def test_a_build_run_pod_reads_what_an_adoption_run_pod_wrote(
    which: str, sb: Sandbox, engine: Engine, tmp_path: Path
) -> None:
    values = load_values() if which == "now" else load_values(BEFORE.read_text(encoding="utf-8"))
    new_lab_rev(sb.root, REV)
    files = {
        "lockstep-site": site_files(sb, keys_beside=which == "now"),
        "lockstep-ssh": {"id_ed25519": b"", "git_ed25519": b"", "known_hosts": b""},
        "lockstep-kube": {"config": b"apiVersion: v1\nkind: Config\n"},
    }
    host = HostVolumes(tmp_path / "volumes", files)
    # The world: read-only, but for its git remotes, which adoption pushes the build profile to.
    world = ["-v", f"{sb.root}:{sb.root}:ro", "-v", f"{sb.repos}:{sb.repos}"]

    adopt_pod, build_pod = run_pod(values, "adopt_lab_rev"), run_pod(values, "build_jovian_rev")
    adopt = run_in_container(
        engine,
        "lockstep-run-adopt",
        [*world, *host.mounts(adopt_pod)],
        pod_env(values, adopt_pod["containers"][0]),
        "adopt",
    )
    assert adopt.returncode == 0, adopt.stderr[-3000:]
    assert outcome(adopt)["done"] == [
        "jovian/build_profile",
        "jovian/dep_table",
        "jovian/dep_trees",
        "jovian/fork_cut",
        "jovian/source_lock",
    ]

    build = run_in_container(
        engine,
        "lockstep-run-build",
        [*world, *host.mounts(build_pod)],
        pod_env(values, build_pod["containers"][0]),
        "build",
    )
    if which == "now":
        assert build.returncode == 0, build.stderr[-3000:]
        result = outcome(build)
        assert result["lock_rev"] == REV
        # The dep trees came from the adoption's cache,
        # through the claim: staged, not silently skipped.
        assert result["deps_root"] == f"/var/cache/lockstep/trees/jovian/{REV}/deps"
        assert result["staged_deps"], result
        claim = tmp_path / "volumes" / "claims" / "lockstep-shared"
        assert (claim / "dagster-storage" / "jovian" / "source_lock" / REV).is_file()
    else:
        # The build pod's DAGSTER_HOME/storage is its own
        # empty disk: the first input it loads is missing.
        assert build.returncode != 0
        assert "FileNotFoundError" in build.stderr
        assert f"/opt/dagster/dagster_home/storage/jovian/source_lock/{REV}" in build.stderr, (
            build.stderr[-3000:]
        )
        assert not (tmp_path / "volumes" / "claims").exists()  # today's values name no claim at all
