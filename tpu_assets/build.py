"""Building `:tpu-<gitsha>` as a kaniko job on iris (runbook §1, §3, §6): pinned-first, state-polled."""

from __future__ import annotations

import time
from pathlib import Path

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.iris import IrisCli, JobState
from resources.kaniko import KanikoSettings, build_destination, kaniko_job
from resources.registry import ImageRef, Registry
from resources.site import SiteConfig
from resources.uv import UvLock
from tpu_assets.dockerfile import find_pin, pin_variable
from tpu_assets.models import BuiltImage, HarborPin


class BuildFailed(LockstepError):
    """The build job did not end in `succeeded`, or the registry does not hold what it claims to have pushed."""


def gitsha_of(commit: str) -> str:
    """The runbook's `git rev-parse --short HEAD`, fixed at 8 hex so tags are predictable."""
    return commit[:8]


def pins_at(checkout: Path, site: SiteConfig) -> tuple[HarborPin, str]:
    """The lock's harbor pin (runtime gate) and the Dockerfile's HARBOR_COMMIT (the bake) in a checkout."""
    tpu = site.tpu
    lock = UvLock.read(Path("uv.lock"), (checkout / "uv.lock").read_text(encoding="utf-8"))
    pkg, src = lock.git_package(tpu.harbor_package)
    dockerfile = (checkout / tpu.dockerfile).read_text(encoding="utf-8")
    return HarborPin(commit=src.commit, version=pkg.version), find_pin(dockerfile, tpu.dockerfile, pin_variable(tpu.harbor_package)).commit


def build_image(*, commit: str, site: SiteConfig, git: GitRemotes, iris: IrisCli, registry: Registry, log) -> BuiltImage:  # type: ignore[no-untyped-def]
    """Build the consumer at `commit` into ``:tpu-<gitsha>`` unless that pinned tag already exists."""
    tpu, iris_cfg = site.tpu, site.iris
    assert iris_cfg is not None
    gitsha = gitsha_of(commit)
    ref = ImageRef.parse(tpu.image)
    settings = KanikoSettings(gitsha=gitsha, image=tpu.image, docker_user=iris_cfg.docker_user,
                              docker_token_env=iris_cfg.docker_token_env, cpu=iris_cfg.cpu,
                              memory=iris_cfg.memory, disk=iris_cfg.disk, timeout_s=iris_cfg.build_timeout_s)
    destination = build_destination(settings)
    tag = destination.rsplit(":", 1)[1]
    started = time.monotonic()
    job_id: str | None = None
    state, command = "reused", ""
    with git.checkout(url=tpu.consumer_repo, sha=commit) as wt:
        lock_pin, dockerfile_commit = pins_at(wt.path, site)
        if registry.resolve(repository=ref.repository, reference=tag) is not None:
            log.info(f"{destination} exists: pinned tags are immutable, so it is reused, never rebuilt")
        else:
            spec = kaniko_job(settings, (wt.path / tpu.build_script).read_bytes())
            command = " ".join(iris.redacted_argv(spec))
            log.info(f"submitting {command}")
            job_id = iris.submit(spec=spec, cwd=wt.path)
    if job_id is not None:
        summary = iris.wait(job_id=job_id, timeout_s=iris_cfg.build_timeout_s)
        state = summary.state.value
        if summary.state != JobState.SUCCEEDED:
            raise BuildFailed(
                f"build job {job_id} ended {state} (exit {summary.exit_code}, {summary.error or 'no error given'}): "
                f"nothing was pushed to {destination}, and the floating :{tpu.floating_tag} is untouched"
            )
    digest = registry.resolve(repository=ref.repository, reference=tag)
    if digest is None:
        raise BuildFailed(f"job {job_id} says {state}, but the registry has no {destination} "
                          f"({registry.absence(repository=ref.repository, reference=tag)}): a state is not an image")
    manifest = registry.manifest(repository=ref.repository, reference=digest)
    sizes = [layer.size for layer in manifest.layers] if manifest else []
    return BuiltImage(
        consumer_commit=commit, gitsha=gitsha, ref=destination, digest=digest, lock_pin=lock_pin,
        dockerfile_commit=dockerfile_commit, job_id=job_id, job_state=state, job_command=command,
        duration_s=round(time.monotonic() - started, 1), layers=len(sizes),
        largest_layer_bytes=max(sizes, default=0), total_bytes=sum(sizes),
    )
