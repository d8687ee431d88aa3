"""The kaniko job renderer: pure, settings in, JobSpec out (runbook §1, §3)."""

from __future__ import annotations

import base64
import subprocess

import pytest
from pydantic import ValidationError

from resources.errors import LockstepError
from resources.iris.cli import IrisCli
from resources.kaniko import (
    BUILD_COMMAND,
    KanikoError,
    KanikoSettings,
    build_destination,
    kaniko_job,
)
from sandbox.consumer_source import build_script

IMAGE = "ghcr.io/open-thoughts/openthoughts-agent"
SECRET = "ghp_kanikoTestTokenValue0123456789"
BUILD_SCRIPT = build_script(IMAGE)


def settings(**overrides: object) -> KanikoSettings:
    values: dict[str, object] = {
        "gitsha": "abd6dc86",
        "image": IMAGE,
        "docker_user": "penfever",
        "docker_token_env": "GHCR_TOKEN",
    }
    return KanikoSettings(**{**values, **overrides})


def test_spec_is_the_runbook_kaniko_job() -> None:
    spec = kaniko_job(settings(), BUILD_SCRIPT.encode())
    assert spec.name == "tpu-kaniko-abd6dc86"
    assert spec.task_image == "docker.io/library/ubuntu:22.04"  # kaniko's executor has no bash
    assert (spec.cpu, spec.memory, spec.disk, spec.max_retries, spec.timeout_s) == (
        16,
        "64GB",
        "120GB",
        0,
        10800,
    )
    # Off preemptible workers: iris retries a preempted
    # job up to 1000 times whatever --max-retries says.
    assert spec.preemptible is False and spec.no_sync is True
    assert list(spec.env) == ["DOCKER_USER_ID", "BUILD_B64", "GITSHA", "IMAGE"]
    assert (spec.env["DOCKER_USER_ID"], spec.env["GITSHA"], spec.env["IMAGE"]) == (
        "penfever",
        "abd6dc86",
        IMAGE,
    )
    assert spec.secret_env == {"DOCKER_TOKEN": "GHCR_TOKEN"}
    assert spec.command == [
        "bash",
        "-lc",
        'echo "$BUILD_B64" | base64 -d > /tmp/build.sh && exec bash /tmp/build.sh',
    ]


def test_full_iris_command_line_for_a_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    spec = kaniko_job(settings(cpu=32, memory="256GB", disk="300GB"), BUILD_SCRIPT.encode())
    argv = IrisCli(binary="iris", cluster="cw-us-east-02a", user="benjaminfeuer").argv(spec)
    assert argv == [
        "iris",
        "--cluster=cw-us-east-02a",
        "job",
        "run",
        "--task-image",
        "docker.io/library/ubuntu:22.04",
        "--no-sync",
        "--enable-extra-resources",
        "--cpu",
        "32",
        "--memory",
        "256GB",
        "--disk",
        "300GB",
        "--job-name",
        "tpu-kaniko-abd6dc86",
        "--user",
        "benjaminfeuer",
        "--max-retries",
        "0",
        "--timeout",
        "10800",
        "--no-preemptible",
        "-e",
        "DOCKER_USER_ID",
        "penfever",
        "-e",
        "BUILD_B64",
        spec.env["BUILD_B64"],
        "-e",
        "GITSHA",
        "abd6dc86",
        "-e",
        "IMAGE",
        IMAGE,
        "-e",
        "DOCKER_TOKEN",
        SECRET,
        "--no-wait",
        "--",
        *BUILD_COMMAND,
    ]


def test_build_b64_round_trips_the_script_through_the_job_command() -> None:
    script = (
        b"#!/usr/bin/env bash\nset -euo pipefail\n: \"${GITSHA:?}\"\necho 'caf\xc3\xa9 \\ $x'\n"
        * 40
    )
    b64 = kaniko_job(settings(), script).env["BUILD_B64"]
    assert "\n" not in b64 and base64.b64decode(b64, validate=True) == script
    # The decode half of the job's own command gives back the exact bytes.
    decode = BUILD_COMMAND[2].split(" > ")[0]
    out = subprocess.run(["bash", "-c", decode], env={"BUILD_B64": b64, "PATH": "/usr/bin:/bin"},
                         capture_output=True, timeout=10, check=True)  # fmt: skip
    assert out.stdout == script


@pytest.mark.parametrize(
    "gitsha", [None, "", "   ", "HEAD", "abc12", "ABD6DC86", "abd6dc86; rm -rf /", "g" * 8]
)
def test_gitsha_is_mandatory_before_anything_is_submitted(gitsha: str | None) -> None:
    with pytest.raises(LockstepError, match="GITSHA"):
        kaniko_job(settings(gitsha=gitsha), BUILD_SCRIPT.encode())
    with pytest.raises(KanikoError, match="GITSHA"):
        build_destination(settings(gitsha=gitsha))


def test_full_length_sha_is_accepted() -> None:
    sha = "2dde0bbf11d48a4e44df6ad0a56cee31e7ab609e"
    assert kaniko_job(settings(gitsha=sha), BUILD_SCRIPT.encode()).name == f"tpu-kaniko-{sha}"


def test_destination_is_only_the_pinned_tag() -> None:
    assert build_destination(settings()) == f"{IMAGE}:tpu-abd6dc86"
    assert build_destination(settings(image="127.0.0.1:5000/open-thoughts/agent")) == (
        "127.0.0.1:5000/open-thoughts/agent:tpu-abd6dc86"
    )
    for image in (f"{IMAGE}:tpu", f"{IMAGE}:tpu-abd6dc86", f"{IMAGE}@sha256:{'0' * 64}", ""):
        with pytest.raises(KanikoError, match="without a tag"):
            kaniko_job(settings(image=image), BUILD_SCRIPT.encode())
    # There is no field through which a caller could ask for the floating :tpu.
    with pytest.raises(ValidationError):
        settings(tag="tpu")
    with pytest.raises(ValidationError):
        settings(destination=f"{IMAGE}:tpu")


def test_token_travels_only_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHCR_TOKEN", SECRET)
    spec = kaniko_job(settings(), BUILD_SCRIPT.encode())
    assert "DOCKER_TOKEN" not in spec.env
    assert SECRET not in spec.model_dump_json() and SECRET not in settings().model_dump_json()
    with pytest.raises(KanikoError, match="NAME of an environment variable") as err:
        kaniko_job(settings(docker_token_env=SECRET), BUILD_SCRIPT.encode())
    assert SECRET not in str(err.value)


def test_an_empty_script_is_refused() -> None:
    # What the script does (GITSHA guard, destination, xtrace) is the pre-flight's:
    # tests/tpu/test_build_script.py.
    with pytest.raises(KanikoError, match="empty"):
        kaniko_job(settings(), b"\n")
