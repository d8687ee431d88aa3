"""Building `:tpu-<gitsha>` as a kaniko job on iris
(runbook §1, §3, §6): pinned-first, state-polled.

Before anything is submitted, the build script is read (`build_script.check_build_script`): where it
pushes, whether it would trace the token, whether it guards GITSHA. After the job ends, its whole
log is read back from iris: the post-mortem of a
failure, and a scan for every secret lockstep passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.heartbeat import Heartbeat
from resources.iris.cli import IrisCli, JobLog, JobSpec, Submission
from resources.iris.output import IrisError, JobState, JobSummary
from resources.kaniko import KanikoSettings, kaniko_job
from resources.reader import read_bytes, read_text
from resources.registry import ImageRef, Registry
from resources.site.schema import SiteConfig
from resources.uv import UvLock
from tpu_assets.build_script import BuildScriptRefused, check_build_script
from tpu_assets.dockerfile import find_pin, pin_variable
from tpu_assets.models import BuiltImage, HarborPin

# Docker Hub personal access tokens start with this; ghcr wants a GitHub token (runbook §1).
DOCKER_HUB_PAT = r"^dckr_pat_"
MIN_SHORT = 7  # git's shortest abbreviation
# iris ends a job at its own --timeout and says so in its state; lockstep's wait gives up only when
# iris has not, this long after (a controller that lost the job's clock).
JOB_TIMEOUT_GRACE_S = 600


class BuildFailed(LockstepError):
    """A job did not end in `succeeded`, leaked a secret,
    or the registry lacks what it claims to have pushed.

    `facts` (state, error, the masked log tail...) become the failure's metadata in the UI.
    """

    def __init__(self, message: str, *, facts: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.facts = facts or {}


def gitsha_for(git: GitRemotes, site: SiteConfig, commit: str) -> str:
    """The runbook's GITSHA: ``git rev-parse --short`` of the commit, with git's own length rule."""
    return git.short_sha(url=site.tpu.consumer_repo, sha=commit, branch=site.tpu.consumer_branch)


def pins_at(checkout: Path, site: SiteConfig) -> tuple[HarborPin, str]:
    """The lock's harbor pin (runtime gate) and the
    Dockerfile's HARBOR_COMMIT (the bake) in a checkout."""
    tpu = site.tpu
    lock = UvLock.read(Path("uv.lock"), read_bytes(checkout / "uv.lock", "uv.lock"))
    pkg, src = lock.git_package(tpu.harbor_package)
    dockerfile = read_text(checkout / tpu.dockerfile, tpu.dockerfile)
    return HarborPin(commit=src.commit, version=pkg.version), find_pin(
        dockerfile, tpu.dockerfile, pin_variable(tpu.harbor_package)
    ).commit


def existing_pinned(
    registry: Registry, repository: str, commit: str, gitsha: str
) -> tuple[str, str] | None:
    """(tag, digest) of this commit's pinned tag if any exists: git's short length grows with the
    repository, so a build made when it was shorter is found too, and never rebuilt."""
    for length in range(len(gitsha), MIN_SHORT - 1, -1):
        tag = f"tpu-{commit[:length]}"
        if digest := registry.resolve(repository=repository, reference=tag):
            return tag, digest
    return None


def job_failure_facts(
    summary: JobSummary | None, log: JobLog | None, log_error: str = ""
) -> dict[str, str]:
    """What a person needs to see about a job that did
    not succeed: how it ended, and its log's tail."""
    facts: dict[str, str] = {}
    if summary is not None:
        facts["state"] = summary.state.value
        facts["exit_code"] = "-" if summary.exit_code is None else str(summary.exit_code)
        facts["error"] = summary.error or "(iris gave no error)"
        if diag := summary.diagnostics():
            facts["tasks"] = diag
    if log is not None:
        note = f" (the first {log.lines} lines only: iris cut the log)" if log.truncated else ""
        facts["log_tail"] = f"last {len(log.tail)} of {log.lines} lines{note}:\n" + "\n".join(
            log.tail
        )
    elif log_error:
        facts["log_tail"] = f"(the job's log could not be read: {log_error})"
    return facts


def read_log(iris: IrisCli, submission: Submission, spec: JobSpec) -> tuple[JobLog | None, str]:
    """The finished job's log, or why it could not be
    read (a post-mortem must not hide the failure)."""
    try:
        return iris.logs(job_id=submission.job_id, since_ms=submission.submitted_ms, spec=spec), ""
    except IrisError as exc:
        return None, str(exc)


def refuse_leak(
    log: JobLog | None, submission: Submission, spec: JobSpec, summary: JobSummary | None
) -> None:
    """A secret lockstep passed shows in the job's log: anyone who can read the job can read it."""
    if log is None or not log.leaked:
        return
    passed = ", ".join(f"-e {k} (from ${v})" for k, v in spec.secret_env.items() if v in log.leaked)
    raise BuildFailed(
        f"the iris job log of {submission.job_id} contains the value of ${', $'.join(log.leaked)}"
        f"{f' (passed as {passed})' if passed else ''}: anyone who can read the job's logs can "
        "read it. "
        "Revoke that token now, then fix the build script (`set +x` before the lines that expand "
        "it). "
        "The value itself is masked in everything lockstep recorded",
        facts=job_failure_facts(summary, log),
    )


def job_heartbeat(
    site: SiteConfig,
    submission: Submission,
    spec: JobSpec,
    *,
    what: str,
    log: Callable[[str], object],
) -> Heartbeat:
    """The heartbeat of a job's wait: every [timeouts]
    heartbeat_s, its time against iris's --timeout."""
    return Heartbeat.for_site(
        site, f"{what} job {submission.job_id}", budget_s=spec.timeout_s or None, log=log
    )


def finish_job(
    iris: IrisCli,
    submission: Submission,
    spec: JobSpec,
    *,
    what: str,
    consequence: str,
    heartbeat: Heartbeat | None = None,
) -> JobSummary:
    """Wait for the job's final STATE (`heartbeat` beating while it runs), then read its log back: a
    leaked secret or any end but `succeeded` is a BuildFailed carrying the state, the error and the
    masked log tail."""
    timeout_s = spec.timeout_s + JOB_TIMEOUT_GRACE_S if spec.timeout_s else 7 * 24 * 3600
    summary = iris.wait(
        job_id=submission.job_id,
        timeout_s=timeout_s,
        submission=submission,
        heartbeat=heartbeat,
        spec=spec,
    )
    job_log, log_error = read_log(iris, submission, spec)
    refuse_leak(job_log, submission, spec, summary)
    if summary.state != JobState.SUCCEEDED:
        raise BuildFailed(
            f"{what} job {submission.job_id} ended {summary.state.value} (exit "
            f"{summary.exit_code}, "
            f"{summary.error or 'no error given'}): {consequence}. The job's log tail is in this "
            "failure's metadata",
            facts=job_failure_facts(summary, job_log, log_error),
        )
    return summary


def build_image(
    *,
    commit: str,
    site: SiteConfig,
    git: GitRemotes,
    iris: IrisCli,
    registry: Registry,
    log: logging.Logger,
    on_submit: Callable[[Submission], None] | None = None,
) -> BuiltImage:
    """Build the consumer at `commit` into ``:tpu-<gitsha>`` unless that pinned tag already exists.

    `on_submit` is told the submission as soon as iris
    has the job (its id on the asset while it runs)."""
    tpu, iris_cfg = site.tpu, site.iris
    if iris_cfg is None:
        raise LockstepError(f"{site.path}: no [iris] table: lockstep needs it to build images")
    gitsha = gitsha_for(git, site, commit)
    ref = ImageRef.parse(tpu.image)
    started = time.monotonic()
    submission: Submission | None = None
    spec: JobSpec | None = None
    state, command, warnings = "reused", "", ""
    with git.checkout(url=tpu.consumer_repo, sha=commit) as wt:
        lock_pin, dockerfile_commit = pins_at(wt.path, site)
        if found := existing_pinned(registry, ref.repository, commit, gitsha):
            gitsha = found[0].removeprefix("tpu-")
            log.info(
                f"{tpu.image}:{found[0]} exists: pinned tags are immutable, so it is reused, "
                "never rebuilt"
            )
        else:
            script = (wt.path / tpu.build_script).read_bytes()
            report = check_build_script(
                script.decode("utf-8", errors="replace"),
                path=tpu.build_script,
                image=tpu.image,
                token_given=bool(iris_cfg.docker_token_env),
            )
            if report.errors:
                raise BuildScriptRefused(
                    f"{report.render(report.errors)}\n(the build script at consumer commit "
                    f"{commit[:8]}; nothing was submitted to iris)"
                )
            warnings = report.render(report.warnings)
            for warning in report.warnings:
                log.warning(f"{tpu.build_script}:{warning.line}: {warning.message}")
            token_env = iris_cfg.docker_token_env
            if (
                token_env
                and ref.registry == "ghcr.io"
                and iris.secret_matches(token_env, DOCKER_HUB_PAT)
            ):
                raise BuildFailed(
                    f"${token_env} holds a Docker Hub personal access token (dckr_pat_...), but "
                    "the push goes to "
                    "ghcr.io, which needs a GitHub token with write:packages (`gh auth token`); "
                    "nothing was submitted"
                )
            settings = KanikoSettings(
                gitsha=gitsha,
                image=tpu.image,
                docker_user=iris_cfg.docker_user,
                docker_token_env=token_env,
                cpu=iris_cfg.cpu,
                memory=iris_cfg.memory,
                disk=iris_cfg.disk,
                timeout_s=iris_cfg.build_timeout_s,
            )
            spec = kaniko_job(settings, script)
            command = iris.command_line(spec)
            log.info(f"submitting {command}")
            submission = iris.submit(spec=spec, cwd=wt.path)
            if on_submit is not None:
                on_submit(submission)
    destination = f"{tpu.image}:tpu-{gitsha}"
    job_id = submission.job_id if submission else None
    if submission is not None and spec is not None:
        summary = finish_job(
            iris,
            submission,
            spec,
            what="build",
            consequence=f"nothing was pushed to {destination}, and the floating "
            f":{tpu.floating_tag} is untouched",
            heartbeat=job_heartbeat(site, submission, spec, what="build", log=log.info),
        )
        state = summary.state.value
    tag = f"tpu-{gitsha}"
    digest = registry.resolve(repository=ref.repository, reference=tag)
    if digest is None:
        raise BuildFailed(
            f"job {job_id} says {state}, but the registry has no {destination} "
            f"({registry.absence(repository=ref.repository, reference=tag)}): a state is not an "
            "image"
        )
    manifest = registry.manifest(repository=ref.repository, reference=digest)
    sizes = [layer.size for layer in manifest.layers] if manifest else []
    return BuiltImage(
        consumer_commit=commit,
        gitsha=gitsha,
        ref=destination,
        digest=digest,
        lock_pin=lock_pin,
        dockerfile_commit=dockerfile_commit,
        job_id=job_id,
        job_state=state,
        job_command=command,
        duration_s=round(time.monotonic() - started, 1),
        layers=len(sizes),
        largest_layer_bytes=max(sizes, default=0),
        total_bytes=sum(sizes),
        script_warnings=warnings,
    )
