"""What the TPU assets record, as pydantic models (pickled by the IO manager, shown as metadata)."""

from __future__ import annotations

from pydantic import Field

from resources.model import Model


class Finding(Model):
    """The outcome of one verification, ready to become an asset check result."""

    passed: bool
    description: str
    facts: dict[str, str] = Field(default_factory=dict)


class HarborPin(Model):
    commit: str
    version: str | None


class HarborLock(Model):
    """The consumer repo's lock state after a re-lock (or the state found, when already current)."""

    consumer_repo: str
    consumer_branch: str
    consumer_base: str
    consumer_commit: str
    pushed: bool
    harbor_repo: str
    harbor_branch: str
    harbor_tip: str
    before: HarborPin
    after: HarborPin
    dockerfile: str
    dockerfile_line: int
    lock_diff: str = ""

    @property
    def commit_moved(self) -> bool:
        return self.before.commit != self.after.commit


class BuiltImage(Model):
    """`tpu/image`: the pushed, immutable ``:tpu-<gitsha>`` and how it came to be."""

    consumer_commit: str
    gitsha: str
    ref: str  # image:tpu-<gitsha>
    digest: str
    lock_pin: HarborPin  # what uv.lock pins at this consumer commit (the runtime gate)
    dockerfile_commit: str  # what HARBOR_COMMIT asks the image to bake
    job_id: str | None  # None: the pinned tag already existed and was reused, never rebuilt
    job_state: str
    job_command: str = ""  # redacted
    duration_s: float = 0.0
    layers: int = 0
    largest_layer_bytes: int = 0
    total_bytes: int = 0
    script_warnings: str = ""  # the build script's pre-flight warnings, file:line each

    @property
    def pinned_ref(self) -> str:
        """The image by digest: what smoke and promotion use, so a moved tag cannot switch it."""
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


class SmokeResult(Model):
    """`tpu/smoke`: a live job on the pinned image, judged by its final state."""

    task_image: str
    job_id: str
    state: str
    exit_code: int | None = None
    duration_s: float = 0.0


class VerifiedImage(Model):
    """`tpu/verified_image`: a build that passed every
    check and the smoke (the 'last good' record)."""

    build: str
    digest: str
    ref: str
    harbor_commit: str
    harbor_version: str
    consumer_commit: str
    findings: dict[str, Finding]
    smoke_job: str
