"""The iris cluster CLI: submit a job, read its state, wait by polling the STATE, kill it.

State is authoritative; logs are not: a clean kill or an OOM reap prints no last line, so `wait`
never watches log strings (runbook §6).

What lockstep assumes about the real CLI (`iris` from the `marin-iris` package; read from
marin-community/marin lib/iris/src/iris/cli/job.py, rpc/job.proto, rpc/proto_utils.py, and from the
runbook's verbatim launch command):

- ``iris --cluster=C job run ... --no-wait -- CMD`` prints the job id on stdout with ``click.echo``
  (e.g. ``/benjaminfeuer/tpu-kaniko-abd6dc86``: ``/<user>/<job name>``); its progress messages go
  to the logger (stderr). We take the last output line that is a job id ending in ``/<job name>``,
  else a ``Job submitted: <id>`` log line.
- ``iris job summary ID --json`` prints one object from ``build_job_summary``: ``job_id``, ``name``,
  ``state`` in the friendly spelling (``"running"``: ``JOB_STATE_`` stripped, lower-cased),
  ``exit_code`` (an int, 0 while the job runs), ``error`` ("" when none), ``tasks`` [...]. Older
  binaries have no ``summary`` command (or no ``--json``); some carry ``finished_at`` (the runbook
  says "state+error+exit+finished_at"), which we read when present.
- ``iris job list --json --prefix P`` prints a JSON list of ``JobStatus`` protos through
  ``MessageToDict(preserving_proto_field_name=True)``: ``state`` is the enum NAME
  (``"JOB_STATE_SUCCEEDED"``), fields at their default are OMITTED (``exit_code`` 0, ``error`` "",
  ``state`` UNSPECIFIED), timestamps are ``{"epoch_ms": "<int64 as string>"}``, and the prefix is a
  job-name prefix, so children and look-alikes come back too: we keep the exact ``job_id``.
- An unknown job makes ``summary`` exit non-zero; ``list`` then answers ``[]``: that is "not found".
- ``iris job kill ID`` terminates the job (and its children).

Keys are read in snake_case or camelCase (``MessageToDict`` without ``preserving_proto_field_name``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import BaseModel, Field, model_validator

from resources.errors import LockstepError
from resources.secrets import MASK, redact, redact_argv

if TYPE_CHECKING:
    from resources.site import SiteConfig


class IrisError(LockstepError):
    """The iris CLI failed or answered something lockstep cannot read; secrets are redacted."""


class JobState(StrEnum):
    PENDING = "pending"
    BUILDING = "building"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    WORKER_FAILED = "worker_failed"
    UNSCHEDULABLE = "unschedulable"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @classmethod
    def parse(cls, value: object) -> JobState:
        """Read a state however iris spells it: ``JOB_STATE_SUCCEEDED``, ``Succeeded``, ``worker-failed``.

        ``UNSPECIFIED`` (proto default 0, also what an omitted ``state`` key means) reads as PENDING:
        the controller has not said anything yet, which is not an end. Anything else is an IrisError,
        because guessing a state could turn a failure into a success.
        """
        text = re.sub(r"[\s-]+", "_", str(value).strip()).lower().removeprefix("job_state_")
        if text in ("", "unspecified"):
            return cls.PENDING
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise IrisError(
                f"iris reported job state {str(value)!r}, which lockstep does not know (known: {known})"
            ) from None


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.WORKER_FAILED, JobState.UNSCHEDULABLE})


class JobSpec(BaseModel):
    """One `iris job run`, exactly the runbook's shape."""

    name: str
    task_image: str
    cpu: int = 16
    memory: str = "64GB"
    disk: str = "120GB"
    max_retries: int = 0
    timeout_s: int = 10800
    env: dict[str, str] = Field(default_factory=dict, description="Plain -e K V pairs.")
    secret_env: dict[str, str] = Field(
        default_factory=dict, description="-e K <value of env var V>: K -> NAME of the env var; values never logged."
    )
    command: list[str] = Field(description="What follows `--`, e.g. ['bash', '-lc', '...'].")


class JobSummary(BaseModel):
    job_id: str
    state: JobState
    exit_code: int | None = None
    error: str | None = None
    finished_at: str | None = None
    name: str | None = Field(default=None, description="The job name iris reports, when it reports one.")


# A job id as iris prints it: `/<user>/<name>` (children add more `/<name>` parts).
_JOB_ID = re.compile(r"^/[A-Za-z0-9._@-]+(?:/[A-Za-z0-9._@-]+)*$")
_SUBMITTED = re.compile(r"Job submitted:\s*(?P<id>/\S+)")


def _sleep(seconds: float) -> None:
    """time.sleep, kept behind a name so tests can watch the backoff without waiting it out."""
    time.sleep(seconds)


def _field(data: dict[str, Any], snake: str) -> Any:
    """A key in snake_case or in MessageToDict's camelCase (``exit_code`` / ``exitCode``)."""
    if snake in data:
        return data[snake]
    head, *rest = snake.split("_")
    return data.get(head + "".join(p.title() for p in rest))


def _timestamp(value: Any) -> str | None:
    """An ISO-8601 UTC time from what iris prints: a string, epoch ms, or ``{"epoch_ms": "..."}``."""
    if isinstance(value, dict):
        value = _field(value, "epoch_ms")
    if value in (None, "", 0, "0"):
        return None
    if isinstance(value, str) and not value.isdigit():
        return value
    return datetime.fromtimestamp(int(value) / 1000, tz=timezone.utc).isoformat()


def parse_job_status(data: dict[str, Any], *, job_id: str, secrets: Iterable[str] = ()) -> JobSummary:
    """One job from `job summary --json` or one entry of `job list --json`, as a JobSummary.

    The exit code is only believed for a terminal job, and 0 only for SUCCEEDED: iris reports the
    proto default 0 for a running, killed or unschedulable job, which would read as a clean exit.
    A SUCCEEDED entry without one (omitted because it is 0) gets 0.
    """
    if not isinstance(data, dict):
        raise IrisError(f"iris answered {type(data).__name__} for job {job_id}, expected a JSON object")
    state = JobState.parse(_field(data, "state") or "")
    raw_exit = _field(data, "exit_code")
    exit_code: int | None = None
    if state is JobState.SUCCEEDED:
        exit_code = int(raw_exit or 0)
    elif state.terminal and raw_exit not in (None, "", 0, "0"):
        exit_code = int(raw_exit)
    error = _field(data, "error") or _field(data, "pending_reason") or None
    return JobSummary(
        job_id=str(_field(data, "job_id") or job_id),
        state=state,
        exit_code=exit_code,
        error=redact(str(error), secrets) if error else None,
        finished_at=_timestamp(_field(data, "finished_at")),
        name=_field(data, "name") or None,
    )


def parse_job_id(output: str, *, name: str) -> str | None:
    """The job id `iris job run` printed for job `name`, or None when there is none in `output`."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if _JOB_ID.match(line) and line.rsplit("/", 1)[-1] == name:
            return line
    for line in reversed(lines):
        if m := _SUBMITTED.search(line):
            return m.group("id")
    return None


class _Answer(BaseModel):
    exit_code: int
    output: str  # stdout + stderr, redacted
    stdout: str  # redacted


class IrisCli(dg.ConfigurableResource):
    """The iris CLI: `job run --no-wait`, `job summary`/`job list` for state, `job kill`.

    Every call has a timeout; every command line, error and summary that leaves this class has the
    secret values (a spec's `secret_env` and the variables named in `redact_env`) replaced by ***.
    """

    binary: str = Field(default="iris", description="The iris CLI (the cw-capable one from the `marin-iris` package).")
    cluster: str = Field(description="Passed as --cluster=<cluster>, e.g. cw-us-east-02a.")
    timeout_s: float = Field(default=120.0, gt=0, description="Timeout of one CLI call, in seconds.")
    poll_min_s: float = Field(default=5.0, gt=0, description="First wait between two state polls.")
    poll_max_s: float = Field(default=60.0, gt=0, description="Longest wait between two state polls (the backoff cap).")
    vanish_after: int = Field(
        default=3, ge=1, description="Consecutive 'not found' polls after which a job counts as vanished."
    )
    redact_env: list[str] = Field(
        default_factory=list,
        description="Names of more environment variables whose values are masked in everything this resource says.",
    )
    docker_token_env: str | None = Field(
        default=None, description="NAME of the env var with the kaniko push token (ghcr: a GitHub PAT)."
    )
    docker_token: str | None = Field(
        default=None,
        description="The push token, as a dg.EnvVar of docker_token_env when wired in Definitions; unset: "
        "read $docker_token_env at submit time.",
    )

    @model_validator(mode="after")
    def _poll_bounds_ordered(self) -> IrisCli:
        if self.poll_min_s > self.poll_max_s:
            raise ValueError(f"poll_min_s ({self.poll_min_s:g}) must not exceed poll_max_s ({self.poll_max_s:g})")
        return self

    # ---- command lines -------------------------------------------------------------------------

    def _secret(self, var: str) -> str:
        """The value of the secret named `var`: the resource's own token for its variable, else the env."""
        if var == self.docker_token_env and self.docker_token:
            return self.docker_token
        return os.environ.get(var, "")

    def _secrets(self, spec: JobSpec | None = None) -> list[str]:
        names = [*self.redact_env, *(spec.secret_env.values() if spec else ())]
        own = [self.docker_token] if self.docker_token else []
        return [*own, *(v for name in names if (v := self._secret(name)))]

    def _render(self, spec: JobSpec, secret: Callable[[str, str], str]) -> list[str]:
        """The argv, `secret(key, var)` giving what stands for each secret value."""
        clash = sorted(set(spec.env) & set(spec.secret_env))
        if clash:
            raise IrisError(f"job {spec.name}: {', '.join(clash)} is both a plain and a secret -e variable; keep one")
        env_args: list[str] = []
        for key, value in spec.env.items():
            env_args += ["-e", key, value]
        for key, var in spec.secret_env.items():
            env_args += ["-e", key, secret(key, var)]
        return [
            self.binary, f"--cluster={self.cluster}", "job", "run",
            "--task-image", spec.task_image, "--no-sync", "--enable-extra-resources",
            "--cpu", str(spec.cpu), "--memory", spec.memory, "--disk", spec.disk,
            "--job-name", spec.name, "--max-retries", str(spec.max_retries), "--timeout", str(spec.timeout_s),
            *env_args, "--no-wait", "--", *spec.command,
        ]  # fmt: skip

    def argv(self, spec: JobSpec) -> list[str]:
        """The `iris job run` command line for `spec`, secret values read from the environment now.

        Shape (runbook §3): ``iris --cluster=C job run --task-image IMG --no-sync
        --enable-extra-resources --cpu N --memory M --disk D --job-name NAME --max-retries 0
        --timeout 10800 -e K V ... --no-wait -- CMD...``; plain `env` first, then `secret_env`.
        Never log this list: log `redacted_argv` / `command_line`.
        """

        def read(key: str, var: str) -> str:
            value = self._secret(var)
            if not value:
                raise IrisError(
                    f"job {spec.name}: -e {key} comes from environment variable {var}, which is not set or empty; "
                    f"export {var} in the environment lockstep runs in (the site file only ever names it)"
                )
            return value

        return self._render(spec, read)

    def redacted_argv(self, spec: JobSpec) -> list[str]:
        """`argv(spec)` with every secret value replaced by ***: what is logged and recorded.

        Needs no secret to be set, so a failed submit can still say what it tried to run.
        """
        return redact_argv(self._render(spec, lambda key, var: MASK), self._secrets(spec))

    def command_line(self, spec: JobSpec) -> str:
        """`redacted_argv(spec)` as one shell-quoted string, for logs and asset metadata."""
        return shlex.join(self.redacted_argv(spec))

    # ---- running the CLI -----------------------------------------------------------------------

    def _run(self, argv: list[str], *, shown: list[str], secrets: list[str], cwd: Path | None = None) -> _Answer:
        """Run one CLI call with the timeout; `shown` is the redacted argv used in messages.

        The CLI gets its own process group so a timeout kills it and anything it started: otherwise
        a child holding the pipes open would keep us waiting past the timeout.
        """
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise IrisError(
                f"cannot run the iris CLI {self.binary!r}: {exc.strerror or exc}; "
                "set IrisCli.binary to the cw-capable iris (pip package marin-iris)"
            ) from None
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group may be gone already
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise IrisError(
                f"{shlex.join(shown)} did not answer in {self.timeout_s:g}s (IrisCli.timeout_s); "
                "is the cluster reachable (KUBECONFIG, network)?"
            ) from None
        return _Answer(
            exit_code=proc.returncode,
            output=redact((out + err).strip(), secrets),
            stdout=redact(out, secrets),
        )

    def _call(self, args: list[str], *, secrets: list[str]) -> tuple[list[str], _Answer]:
        argv = [self.binary, f"--cluster={self.cluster}", *args]
        shown = redact_argv(argv, secrets)
        return shown, self._run(argv, shown=shown, secrets=secrets)

    def submit(self, *, spec: JobSpec, cwd: Path) -> str:
        """Submit `spec` with `--no-wait` and return the job id iris printed.

        `cwd` is the workspace iris bundles to /app (its ``git ls-files --cached --others
        --exclude-standard``: the working tree, uncommitted edits included). The redacted command
        line is logged; the secret values only ever travel in the argv of the CLI process.
        """
        argv = self.argv(spec)  # raises, naming the variable, before anything runs
        secrets = self._secrets(spec)
        shown = self.redacted_argv(spec)
        if not Path(cwd).is_dir():
            raise IrisError(f"job {spec.name}: the workspace to bundle, {cwd}, is not a directory")
        dg.get_dagster_logger().info(f"iris submit (cwd {cwd}): {shlex.join(shown)}")
        answer = self._run(argv, shown=shown, secrets=secrets, cwd=Path(cwd))
        if answer.exit_code != 0:
            raise IrisError(
                f"iris job run for {spec.name} failed (exit {answer.exit_code}); nothing is running under that name "
                f"unless iris says so below.\ncommand: {shlex.join(shown)}\n{answer.output or '(no output)'}"
            )
        job_id = parse_job_id(answer.stdout, name=spec.name) or parse_job_id(answer.output, name=spec.name)
        if job_id is None:
            raise IrisError(
                f"iris job run for {spec.name} exited 0 but printed no job id ending in /{spec.name}; "
                f"find it with `{self.binary} --cluster={self.cluster} job list --prefix ...` before resubmitting.\n"
                f"{answer.output or '(no output)'}"
            )
        return job_id

    def summary(self, *, job_id: str) -> JobSummary | None:
        """The job's state now, or None when iris does not know the job.

        Asks `job summary ID --json`; when that fails (an older iris without it, or an unknown
        job) falls back to `job list --json --prefix ID` and keeps the exact id. Raises IrisError
        only when neither answers.
        """
        secrets = self._secrets()
        _, first = self._call(["job", "summary", job_id, "--json"], secrets=secrets)
        if first.exit_code == 0:
            try:
                return parse_job_status(json.loads(first.stdout), job_id=job_id, secrets=secrets)
            except (ValueError, IrisError):
                pass  # not the JSON we know: the list answer below is the same fact in another shape
        shown, listed = self._call(["job", "list", "--json", "--prefix", job_id], secrets=secrets)
        if listed.exit_code != 0:
            raise IrisError(
                f"iris could not tell the state of job {job_id}: `job summary` said "
                f"(exit {first.exit_code}) {first.output or '(nothing)'}\n"
                f"and {shlex.join(shown)} said (exit {listed.exit_code}) {listed.output or '(nothing)'}"
            )
        try:
            entries = json.loads(listed.stdout or "[]")
        except ValueError:
            raise IrisError(
                f"{shlex.join(shown)} printed something that is not JSON:\n{listed.output[:2000]}"
            ) from None
        if isinstance(entries, dict):
            entries = entries.get("jobs", [entries])
        for entry in entries:
            if isinstance(entry, dict) and (_field(entry, "job_id") == job_id or _field(entry, "name") == job_id):
                return parse_job_status(entry, job_id=job_id, secrets=secrets)
        return None

    def kill(self, *, job_id: str) -> None:
        """`iris job kill ID`: terminate the job (and its children). Job-scoped, never the cluster."""
        shown, answer = self._call(["job", "kill", job_id], secrets=self._secrets())
        if answer.exit_code != 0:
            raise IrisError(f"{shlex.join(shown)} failed (exit {answer.exit_code}):\n{answer.output or '(no output)'}")
        dg.get_dagster_logger().info(f"iris: killed {job_id}: {answer.output}")

    def wait(self, *, job_id: str, timeout_s: float) -> JobSummary:
        """Poll the job's STATE until it is terminal and return that summary, whatever the state.

        Polls back off exponentially from poll_min_s to poll_max_s. Never reads logs: a clean kill
        or an OOM reap prints no last line (runbook §6). Raises IrisError when `timeout_s` passes
        (naming the last state; the job is left running), when the job is unknown for
        `vanish_after` polls in a row, or when iris fails to answer that many times in a row.
        """
        deadline = time.monotonic() + timeout_s
        delay = self.poll_min_s
        last: JobSummary | None = None
        missing = failures = 0
        log = dg.get_dagster_logger()
        while True:
            try:
                now = self.summary(job_id=job_id)
                failures = 0
            except IrisError as exc:
                # One failed poll is not a verdict on a 3-hour build; a run of them is.
                failures += 1
                if failures >= self.vanish_after:
                    raise IrisError(
                        f"iris failed to answer for job {job_id} {failures} times in a row: {exc}"
                    ) from None
                now = last
            else:
                if now is None:
                    missing += 1
                    if missing >= self.vanish_after:
                        seen = f"last seen {last.state.value}" if last else "never seen"
                        raise IrisError(
                            f"job {job_id} vanished: iris did not know it in {missing} consecutive polls ({seen}); "
                            f"check `{self.binary} --cluster={self.cluster} job list --prefix {job_id}` — "
                            "it may have been deleted, or submitted to another cluster"
                        )
                else:
                    missing = 0
                    if last is None or now.state != last.state:
                        log.info(f"iris job {job_id}: {now.state.value}")
                    last = now
                    if now.state.terminal:
                        return now
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                state = last.state.value if last else "not yet seen"
                raise IrisError(
                    f"job {job_id} is still {state} after {timeout_s:g}s of waiting; it was NOT killed. "
                    f"Wait longer, or kill it: {self.binary} --cluster={self.cluster} job kill {job_id}"
                )
            _sleep(min(delay, remaining))
            delay = min(delay * 2, self.poll_max_s)



def iris_for(site: SiteConfig, *, env_vars: bool = False) -> IrisCli:
    """The iris CLI the site names (a path with a '/' is relative to the site file).

    `env_vars`: the push token as ``dg.EnvVar`` (for Definitions); otherwise read at submit time.
    """
    if site.iris is None:
        raise LockstepError(f"{site.path}: no [iris] table: lockstep needs it to build and smoke images")
    section = site.iris
    binary = str(site.resolve_path(section.binary)) if "/" in section.binary else section.binary
    token_env = section.docker_token_env
    return IrisCli(
        binary=binary, cluster=section.cluster, poll_min_s=section.poll_min_s, poll_max_s=section.poll_max_s,
        redact_env=site.secret_env_names(), docker_token_env=token_env,
        docker_token=dg.EnvVar(token_env) if env_vars and token_env else None,
    )
