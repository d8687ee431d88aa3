"""A deployment without the iris CLI or its cluster credentials fails the first submit with one
message that names each missing piece and how to add it on that deployment, and runs nothing
(resources/iris/deploy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.iris.cli import IrisCli, JobSpec
from resources.iris.deploy import IrisNotDeployed, check_iris_setup
from resources.iris.output import IrisError


@pytest.fixture
def iris_bin(tmp_path: Path) -> Path:
    binary = tmp_path / "bin" / "iris"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return binary


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kube" / "config"
    path.parent.mkdir()
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    return path


def refusal(**kwargs: object) -> str:
    with pytest.raises(IrisNotDeployed) as caught:
        check_iris_setup(**kwargs)  # type: ignore[arg-type]
    return str(caught.value)


# What each deployment's message must tell a person to do, per missing piece.
HOW_BINARY = {
    "kubernetes": [
        "--build-arg WITH_IRIS=1",
        "x-lockstep-image",
        'binary = "/opt/iris/bin/iris"',
        "lockstep-site ConfigMap",
    ],
    "compose": [
        "WITH_IRIS=1",
        "deploy/docker/docker-compose.yml",
        "--build",
        'binary = "/opt/iris/bin/iris"',
    ],
    None: ["pip install marin-iris", "[iris] binary"],
}
HOW_KUBECONFIG = {
    "kubernetes": [
        "kubectl -n lockstep create secret generic lockstep-kube --from-file=config=",
        "/etc/lockstep/kube",
        "KUBECONFIG=/etc/lockstep/kube/config",
        "deploy/k8s/values.yaml",
    ],
    "compose": [
        "/etc/lockstep/kube/config",
        "KUBECONFIG=/etc/lockstep/kube/config in deploy/docker/.env",
    ],
    None: ["export KUBECONFIG="],
}


@pytest.mark.parametrize("kind", ["kubernetes", "compose", None])
def test_a_missing_binary_names_how_to_add_it_on_this_deployment(
    kind: str | None, tmp_path: Path, kubeconfig: Path
) -> None:
    env = {"KUBECONFIG": str(kubeconfig), **({"LOCKSTEP_DEPLOYMENT": kind} if kind else {})}
    message = refusal(binary=str(tmp_path / "nowhere" / "iris"), target="cluster", env=env)
    assert message.startswith(
        f"iris cannot run on {'this ' + kind + ' deployment' if kind else 'this machine'}"
    )
    assert f"no executable iris CLI at {tmp_path / 'nowhere' / 'iris'}" in message
    assert "nothing was submitted" in message
    assert all(part in message for part in HOW_BINARY[kind]), message
    assert "KUBECONFIG" not in message  # only what is missing


def test_a_bare_binary_name_is_looked_up_on_path(kubeconfig: Path) -> None:
    message = refusal(
        binary="iris-not-installed-here",
        target="cluster",
        env={"LOCKSTEP_DEPLOYMENT": "kubernetes", "KUBECONFIG": str(kubeconfig)},
    )
    assert "no iris CLI named 'iris-not-installed-here' on PATH" in message


@pytest.mark.parametrize("kind", ["kubernetes", "compose"])
@pytest.mark.parametrize("target", ["cluster", "config"])
@pytest.mark.parametrize("given", ["unset", "missing file", "a directory"])
def test_a_deployment_without_the_kubeconfig_names_the_secret_or_mount(
    kind: str, target: str, given: str, iris_bin: Path, tmp_path: Path
) -> None:
    env = {"LOCKSTEP_DEPLOYMENT": kind}
    if given == "missing file":
        env["KUBECONFIG"] = str(tmp_path / "kube" / "config")
    elif given == "a directory":
        env["KUBECONFIG"] = str(tmp_path)
    message = refusal(binary=str(iris_bin), target=target, env=env)
    assert "the cluster credentials" in message and f"[iris] {target}" in message
    assert (
        "KUBECONFIG is not set" if given == "unset" else f"KUBECONFIG names {env['KUBECONFIG']}"
    ) in message
    assert all(part in message for part in HOW_KUBECONFIG[kind]), message
    assert "iris CLI" not in message  # the binary is there


@pytest.mark.parametrize("kind", ["kubernetes", "compose", None])
def test_both_missing_is_one_message_naming_both(kind: str | None, tmp_path: Path) -> None:
    env = {
        "KUBECONFIG": str(tmp_path / "absent"),
        **({"LOCKSTEP_DEPLOYMENT": kind} if kind else {}),
    }
    message = refusal(binary=str(tmp_path / "absent-iris"), target="cluster", env=env)
    assert (
        "no executable iris CLI" in message and f"KUBECONFIG names {tmp_path / 'absent'}" in message
    )
    assert all(part in message for part in [*HOW_BINARY[kind], *HOW_KUBECONFIG[kind]]), message


def test_what_needs_no_kubeconfig(iris_bin: Path) -> None:
    # A controller URL is dialled directly, on any deployment.
    for kind in ("kubernetes", "compose"):
        check_iris_setup(
            binary=str(iris_bin), target="controller_url", env={"LOCKSTEP_DEPLOYMENT": kind}
        )
    # A developer machine or the sandbox (cluster =
    # "sandbox", its own iris): no KUBECONFIG is required.
    check_iris_setup(binary=str(iris_bin), target="cluster", env={})


def test_a_developer_machine_with_a_broken_kubeconfig_is_refused(
    iris_bin: Path, tmp_path: Path
) -> None:
    message = refusal(
        binary=str(iris_bin), target="cluster", env={"KUBECONFIG": f"{tmp_path}/gone"}
    )
    assert message.startswith("iris cannot run on this machine") and "export KUBECONFIG=" in message


def test_every_file_of_a_kubeconfig_list_must_be_there(
    iris_bin: Path, kubeconfig: Path, tmp_path: Path
) -> None:
    env = {"LOCKSTEP_DEPLOYMENT": "kubernetes", "KUBECONFIG": f"{kubeconfig}:{tmp_path}/gone"}
    assert f"KUBECONFIG names {tmp_path}/gone," in refusal(
        binary=str(iris_bin), target="cluster", env=env
    )
    check_iris_setup(
        binary=str(iris_bin),
        target="cluster",
        env={"LOCKSTEP_DEPLOYMENT": "kubernetes", "KUBECONFIG": str(kubeconfig)},
    )


def test_an_unknown_deployment_kind_is_refused(iris_bin: Path) -> None:
    message = refusal(binary=str(iris_bin), target="cluster", env={"LOCKSTEP_DEPLOYMENT": "k8s"})
    assert "LOCKSTEP_DEPLOYMENT='k8s'" in message and "compose or kubernetes" in message


def test_submit_runs_nothing_until_the_deployment_has_what_iris_needs(
    tmp_path: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "argv.log"
    spy = tmp_path / "spy-iris"
    spy.write_text(f'#!/bin/sh\necho "$@" >> "{record}"\nexit 0\n')
    spy.chmod(0o755)
    cli = IrisCli(binary=str(spy), cluster="cw-us-east-02a", user="lockstep", timeout_s=20)
    spec = JobSpec(
        name="tpu-kaniko-abc1234", task_image="ghcr.io/x/y:tpu-abc1234", command=["true"]
    )
    monkeypatch.setenv("LOCKSTEP_DEPLOYMENT", "kubernetes")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(IrisNotDeployed, match="create secret generic lockstep-kube"):
        cli.submit(spec=spec, cwd=tmp_path)
    assert not record.exists()  # not a `job run`, not even a `--help`
    # With the Secret mounted, the same submit reaches the binary (it then fails on the spy's empty
    # help): the check above is what stopped it, not the spy.
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(IrisError) as caught:
        cli.submit(spec=spec, cwd=tmp_path)
    assert not isinstance(caught.value, IrisNotDeployed)
    assert record.read_text().startswith("--cluster=cw-us-east-02a job")
