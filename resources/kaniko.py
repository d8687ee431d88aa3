"""The iris job that runs a kaniko build of the :tpu
image (runbook §1, §3). Pure: settings in, JobSpec out.

The cluster denies CAP_SYS_ADMIN and runs gVisor, so buildkit cannot build there; kaniko can, but
its executor image has no bash, so the task image is plain ubuntu and the build script
(docker/build_tpu_kaniko.sh) travels base64'd in BUILD_B64 and overlays kaniko itself.

A build pushes ONLY the immutable ``<image>:tpu-<gitsha>``; the floating ``:tpu`` moves later, by
promotion after a live smoke. Nothing here can name another destination.
"""

from __future__ import annotations

import base64
import re

from pydantic import ConfigDict, Field

from resources.errors import LockstepError
from resources.iris.cli import JobSpec
from resources.model import Model

# What follows `--` in the runbook, verbatim: decode the script in the task, then become it.
BUILD_COMMAND = [
    "bash",
    "-lc",
    'echo "$BUILD_B64" | base64 -d > /tmp/build.sh && exec bash /tmp/build.sh',
]

_GITSHA = re.compile(r"^[0-9a-f]{7,40}\Z")
# As in resources/site/fields.py: upper-case names only.
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")


class KanikoError(LockstepError):
    """The kaniko build cannot be rendered as asked; raised before anything is submitted."""


class KanikoSettings(Model):
    """What one :tpu build needs. Secrets are never here: `docker_token_env` NAMES the variable."""

    model_config = ConfigDict(extra="forbid")

    gitsha: str | None = Field(
        default=None,
        description="Consumer commit (`git rev-parse --short HEAD`); names the :tpu-<gitsha> tag.",
    )
    image: str = Field(
        description="Image repository without a tag, e.g. ghcr.io/open-thoughts/openthoughts-agent."
    )
    docker_user: str = Field(
        description="Registry user for the push (DOCKER_USER_ID), e.g. penfever."
    )
    docker_token_env: str | None = Field(
        description="NAME of the env var holding the registry token (a GitHub PAT for ghcr.io, "
        "not Docker Hub's); "
        "None for a registry that takes anonymous pushes (the sandbox)."
    )
    cpu: int = Field(default=16, gt=0)
    memory: str = "64GB"
    disk: str = "120GB"
    timeout_s: int = Field(default=10800, gt=0)
    task_image: str = "docker.io/library/ubuntu:22.04"


def _checked(settings: KanikoSettings) -> tuple[str, str]:
    """The validated (gitsha, image repository), or a KanikoError saying what to fix."""
    gitsha = (settings.gitsha or "").strip()
    if not gitsha:
        raise KanikoError(
            "GITSHA is required: it names the immutable :tpu-<gitsha> tag, and "
            "build_tpu_kaniko.sh dies on "
            '`: "${GITSHA:?}"` without it (runbook §3). Set KanikoSettings.gitsha to the '
            "consumer commit "
            "being built (git rev-parse --short HEAD)."
        )
    if not _GITSHA.match(gitsha):
        raise KanikoError(
            f"GITSHA {gitsha!r} is not a lower-case hex commit sha (7 to 40 of 0-9a-f); it "
            "becomes the tag "
            "tpu-<gitsha>, so pass exactly what `git rev-parse --short HEAD` prints."
        )
    image = settings.image.strip()
    last = image.rsplit("/", 1)[-1]
    if not image or "@" in image or ":" in last:
        raise KanikoError(
            f"image {image!r} must be a repository without a tag or digest (e.g. "
            "ghcr.io/open-thoughts/openthoughts-agent): a build always pushes "
            "<image>:tpu-<gitsha>, "
            "and the floating :tpu only moves by promotion."
        )
    if not settings.docker_user.strip():
        raise KanikoError(
            "docker_user is empty: the registry user the push authenticates as (DOCKER_USER_ID)"
        )
    if settings.docker_token_env is not None and not _ENV_NAME.match(settings.docker_token_env):
        # Never echo it: if it is not a name, it may well be the token itself.
        raise KanikoError(
            "docker_token_env must be the NAME of an environment variable (upper case, e.g. "
            "GHCR_TOKEN), not a token; "
            f"got {len(settings.docker_token_env)} characters that are not a variable name"
        )
    return gitsha, image


def build_destination(settings: KanikoSettings) -> str:
    """``<image>:tpu-<gitsha>``: the only place a build
    may push (PINNED-first, runbook §3 and §8)."""
    gitsha, image = _checked(settings)
    return f"{image}:tpu-{gitsha}"


def kaniko_job(settings: KanikoSettings, build_script: bytes) -> JobSpec:
    """The iris job that runs `build_script` (docker/build_tpu_kaniko.sh) as a kaniko build.

    Env: BUILD_B64 (the script, base64 without newlines), GITSHA, DOCKER_USER_ID, IMAGE, and
    DOCKER_TOKEN only through `secret_env` (read from `docker_token_env` at submit time). Off
    preemptible workers: iris retries a preempted job up to 1000 times whatever --max-retries says,
    and a retried build could race a promotion. Raises KanikoError for a missing or malformed GITSHA
    and the other checks in `_checked`; what the script itself does is checked before the submit by
    `tpu_assets.build_script.check_build_script`.
    """
    gitsha, image = _checked(settings)
    if not build_script.strip():
        raise KanikoError("the build script is empty: pass the bytes of docker/build_tpu_kaniko.sh")
    return JobSpec(
        name=f"tpu-kaniko-{gitsha}",
        task_image=settings.task_image,
        cpu=settings.cpu,
        memory=settings.memory,
        disk=settings.disk,
        max_retries=0,  # a retried push could race a promotion; a person decides to rebuild
        timeout_s=settings.timeout_s,
        preemptible=False,
        env={
            "DOCKER_USER_ID": settings.docker_user,
            "BUILD_B64": base64.b64encode(build_script).decode("ascii"),
            "GITSHA": gitsha,
            "IMAGE": image,
        },
        secret_env={"DOCKER_TOKEN": settings.docker_token_env} if settings.docker_token_env else {},
        command=list(BUILD_COMMAND),
    )
