"""The iris cluster CLI as it is in every 2026 version: submit, read the STATE, wait by polling it,
cancel, and read a finished job's log.

State is authoritative; logs are not: a clean kill or an OOM reap prints no last line, so `wait`
never watches log strings (runbook §6). Logs are read once a job has ended, for the post-mortem.

The CLI moved under the runbook (the Marin monorepo `marin-community/marin`,
`lib/iris/src/iris/cli/job.py`, history up to 2dfb07943 of 2026-08-22):
``job summary --json`` existed only 2026-04-09..07-03; ``job describe`` replaced ``job summary`` and
``job cancel`` replaced ``kill``/``stop`` on 2026-08-20; ``--no-sync`` arrived 2026-06-24. The
controller refuses clients more than 14 days older than itself, so no site keeps an old binary for
long, and none can be assumed either: the adapter reads the installed binary's own help once per
process (resources/iris/capabilities.py) and speaks what it finds. Parsers of what the CLI prints
live in resources/iris/output.py.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field, model_validator

from resources.errors import LockstepError
from resources.heartbeat import TAIL_LINES, Heartbeat
from resources.iris.capabilities import (
    ClientTooOld,
    IrisCapabilities,
    MissingCapability,
    check_run,
    learn,
)
from resources.iris.deploy import check_iris_setup
from resources.iris.output import (
    TERMINAL,
    IrisError,
    IrisUnreadable,
    JobState,
    JobSummary,
    ListedJob,
    log_text,
    parse_list_text,
    parse_state_output,
)
from resources.model import Model
from resources.names import IRIS_NAME
from resources.secrets import MASK, redact, redact_argv

if TYPE_CHECKING:
    from resources.site.schema import SiteConfig


class JobAlreadyRunning(IrisError):
    """A job of this name is still running on the cluster; lockstep submitted nothing."""


class JobReplaced(IrisError):
    """The job under lockstep's id is another submission
    of the same name, not the one lockstep made."""


_NOT_FOUND = re.compile(r"NOT_FOUND|not found|No job named", re.IGNORECASE)
_ALREADY = re.compile(r"ALREADY_EXISTS|already exists", re.IGNORECASE)
_TOO_OLD = re.compile(r"client is too old", re.IGNORECASE)
_USAGE = re.compile(r"No such (option|command)|Usage:", re.IGNORECASE)
LOG_TAIL_LINES = 200
LOG_MAX_LINES = 100_000


def _sleep(seconds: float) -> None:
    """time.sleep, kept behind a name so tests can watch the backoff without waiting it out."""
    time.sleep(seconds)


_CAPABILITIES: dict[tuple[str, ...], IrisCapabilities] = {}


class JobSpec(Model):
    """One `iris job run`, exactly the runbook's shape."""

    name: str
    task_image: str
    cpu: int = 16
    memory: str = "64GB"
    disk: str = "120GB"
    max_retries: int = 0
    timeout_s: int = 10800
    no_sync: bool = Field(
        default=True, description="--no-sync: run the command in the task image as it is."
    )
    preemptible: bool | None = Field(
        default=None,
        description="False: --no-preemptible (iris retries a preempted job up to 1000 times "
        "whatever "
        "--max-retries says, so a build must not be preemptible); None: iris's heuristic.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Plain -e K V pairs.")
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="-e K <value of env var V>: K -> NAME of the env var; values never logged.",
    )
    command: list[str] = Field(description="What follows `--`, e.g. ['bash', '-lc', '...'].")


class Submission(Model):
    """A submitted job: its id, when lockstep submitted it, and the submission iris recorded."""

    job_id: str
    submitted_ms: int = Field(
        description="This machine's clock just before `job run`: the log window starts here."
    )
    listed: ListedJob | None = Field(
        default=None, description="`job list` right after submit: this incarnation."
    )


class JobLog(Model):
    """A finished job's log read back from iris, masked; and which secrets it would have shown."""

    lines: int
    tail: list[str]
    leaked: list[str] = Field(
        default_factory=list, description="NAMES of the env vars whose values appeared."
    )
    truncated: bool = False


class _Answer(Model):
    exit_code: int
    output: str  # stdout + stderr, redacted
    stdout: str  # redacted
    raw_stdout: str = Field(default="", repr=False)  # only for the leak scan of logs; never stored


class IrisCli(dg.ConfigurableResource):
    """The iris CLI: `job run --no-wait`, state by `describe`/`summary`, `cancel`/`kill`, `logs`.

    Every call has a timeout; every command line, error and summary that leaves this class has the
    secret values (the push token, a spec's `secret_env`,
    the variables in `redact_env`) replaced by ***.
    """

    binary: str = Field(
        default="iris",
        description="The iris CLI (the cw-capable one from the `marin-iris` package).",
    )
    cluster: str | None = Field(default=None, description="--cluster=<name>, e.g. cw-us-east-02a.")
    config_file: str | None = Field(
        default=None, description="--config=<file> instead of a cluster name."
    )
    controller_url: str | None = Field(
        default=None, description="--controller-url=<url> (a local controller)."
    )
    user: str = Field(description="--user: the job id is /<user>/<name>, known before the submit.")
    timeout_s: float = Field(
        default=180.0,
        gt=0,
        description="Timeout of one CLI call (opening the cluster tunnel is slow).",
    )
    poll_min_s: float = Field(default=5.0, gt=0, description="First wait between two state polls.")
    poll_max_s: float = Field(
        default=60.0, gt=0, description="Longest wait between two state polls (the backoff cap)."
    )
    vanish_after: int = Field(
        default=3,
        ge=1,
        description="Consecutive 'not found' (or failed) polls after which the wait gives up.",
    )
    # default=[] (pydantic copies it per instance): default_factory=list would have pydantic call
    # inspect.signature(list), which compiles tokenize's
    # regexes at import (~3 ms per location load).
    redact_env: list[str] = Field(
        default=[],
        description=(
            "Names of more environment variables whose values are masked in everything this "
            "resource says."
        ),
    )
    docker_token_env: str | None = Field(
        default=None,
        description="NAME of the env var with the kaniko push token (ghcr: a GitHub PAT).",
    )
    docker_token: str | None = Field(
        default=None,
        description="The push token, as a dg.EnvVar of docker_token_env when wired in "
        "Definitions; unset: "
        "read $docker_token_env at submit time.",
    )

    @model_validator(mode="after")
    def _checked(self) -> IrisCli:
        if self.poll_min_s > self.poll_max_s:
            raise ValueError(
                f"poll_min_s ({self.poll_min_s:g}) must not exceed poll_max_s ({self.poll_max_s:g})"
            )
        if sum(x is not None for x in (self.cluster, self.config_file, self.controller_url)) != 1:
            raise ValueError("set exactly one of cluster, config_file, controller_url")
        if not IRIS_NAME.match(self.user):
            raise ValueError(
                f"user {self.user!r} is not an iris user name (letters, digits, . _ @ -)"
            )
        return self

    # ---- secrets -------------------------------------------------------------------------------

    def _secret(self, var: str) -> str:
        """The value of the secret named `var`: the resource's
        own token for its variable, else the env."""
        if var == self.docker_token_env and self.docker_token:
            return self.docker_token
        return os.environ.get(var, "")

    def secret_matches(self, var: str, pattern: str) -> bool:
        """Whether the secret in `var` matches `pattern`
        (e.g. a Docker Hub token's prefix); never shows it."""
        return re.search(pattern, self._secret(var)) is not None

    def _named_secrets(self, spec: JobSpec | None = None) -> dict[str, str]:
        names = [*self.redact_env, *(spec.secret_env.values() if spec else ()),
                 *((self.docker_token_env,) if self.docker_token_env else ())]  # fmt: skip
        return {name: value for name in dict.fromkeys(names) if (value := self._secret(name))}

    def _secrets(self, spec: JobSpec | None = None) -> list[str]:
        return list(self._named_secrets(spec).values())

    # ---- command lines -------------------------------------------------------------------------

    def _target(self) -> list[str]:
        if self.cluster is not None:
            return [f"--cluster={self.cluster}"]
        if self.config_file is not None:
            return [f"--config={self.config_file}"]
        return [f"--controller-url={self.controller_url}"]

    def job_id(self, name: str) -> str:
        """The id iris gives job `name` submitted with --user: ``/<user>/<name>``."""
        return f"/{self.user}/{name}"

    def _render(self, spec: JobSpec, secret: Callable[[str, str], str]) -> list[str]:
        """The argv, `secret(key, var)` giving what stands for each secret value."""
        clash = sorted(set(spec.env) & set(spec.secret_env))
        if clash:
            raise IrisError(
                f"job {spec.name}: {', '.join(clash)} is both a plain and a secret -e variable; "
                "keep one"
            )
        env_args: list[str] = []
        for key, value in spec.env.items():
            env_args += ["-e", key, value]
        # A secret's value goes on argv (readable in /proc/<pid>/cmdline while `job run` runs)
        # because iris offers nothing else: `-e/--env-vars` is click `type=(str, str)`, KEY and
        # VALUE both required, since 5e7df0bfb (2026-01-31, iris_run.py;
        # lib/iris/src/iris/cli/job.py from 19a8117b9) to HEAD 2dfb07943 and in the marin-iris
        # 0.2.20 wheel. Its other channels are worse or closed: `load_env_vars` reads an `env:`
        # block from `.marin.yaml` in the submit directory, which the bundle ships to /app (and
        # kaniko's `COPY . /app` into the image), and forwards only
        # HF_TOKEN and WANDB_API_KEY from the caller's environment.
        for key, var in spec.secret_env.items():
            env_args += ["-e", key, secret(key, var)]
        preempt = (
            []
            if spec.preemptible is None
            else ["--preemptible" if spec.preemptible else "--no-preemptible"]
        )
        return [
            self.binary,
            *self._target(),
            "job",
            "run",
            "--task-image",
            spec.task_image,
            *(["--no-sync"] if spec.no_sync else []),
            "--enable-extra-resources",
            "--cpu",
            str(spec.cpu),
            "--memory",
            spec.memory,
            "--disk",
            spec.disk,
            "--job-name",
            spec.name,
            "--user",
            self.user,
            "--max-retries",
            str(spec.max_retries),
            "--timeout",
            str(spec.timeout_s),
            *preempt,
            *env_args,
            "--no-wait",
            "--",
            *spec.command,
        ]

    def argv(self, spec: JobSpec) -> list[str]:
        """The `iris job run` command line for `spec`, secret values filled in now.

        Shape (runbook §3, plus --user and --no-preemptible): ``iris --cluster=C job run
        --task-image IMG --no-sync --enable-extra-resources --cpu N --memory M --disk D --job-name
        NAME --user U --max-retries 0 --timeout 10800 [--no-preemptible] -e K V ... --no-wait --
        CMD...``. Never log this list: log `redacted_argv` / `command_line`.
        """

        def read(key: str, var: str) -> str:
            value = self._secret(var)
            if not value:
                raise IrisError(
                    f"job {spec.name}: -e {key} comes from environment variable {var}, which is "
                    "not set or empty; "
                    f"export {var} in the environment lockstep runs in (the site file only ever "
                    "names it)"
                )
            return value

        return self._render(spec, read)

    def redacted_argv(self, spec: JobSpec) -> list[str]:
        """`argv(spec)` with every secret value replaced by ***: what is logged and recorded."""
        return redact_argv(self._render(spec, lambda key, var: MASK), self._secrets(spec))

    def command_line(self, spec: JobSpec) -> str:
        """`redacted_argv(spec)` as one shell-quoted
        string, for logs and asset metadata; long values
        (the base64'd build script) are shown by size."""
        return shlex.join(
            a if len(a) <= 240 else f"<{len(a)} chars>" for a in self.redacted_argv(spec)
        )

    # ---- running the CLI -----------------------------------------------------------------------

    def _run(
        self, argv: list[str], *, shown: list[str], secrets: list[str], cwd: Path | None = None
    ) -> _Answer:
        """One CLI call with the timeout, in its own
        process group so a timeout kills all it started."""
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as exc:
            raise IrisError(
                f"cannot run the iris CLI {self.binary!r}: {exc.strerror or exc}; "
                "set [iris] binary to the cw-capable iris (pip package marin-iris)"
            ) from None
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group may be gone already
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise IrisError(
                f"{shlex.join(shown)} did not answer in {self.timeout_s:g}s (IrisCli.timeout_s); "
                "is the cluster reachable (KUBECONFIG, network, the tunnel)?"
            ) from None
        answer = _Answer(exit_code=proc.returncode, output=redact((out + err).strip(), secrets),
                         stdout=redact(out, secrets), raw_stdout=out)  # fmt: skip
        if answer.exit_code != 0 and _TOO_OLD.search(answer.output):
            said = next(
                (line for line in answer.output.splitlines() if _TOO_OLD.search(line)),
                answer.output,
            )
            raise ClientTooOld(
                f"the cluster's controller refuses the iris CLI at {self.binary}: "
                f"{said.strip()[:500]} — it "
                "accepts clients at most 14 days older than itself: upgrade marin-iris in that "
                "environment "
                "(`uv pip install -U marin-iris`), or point [iris] binary at a current one"
            )
        return answer

    def _call(
        self, args: list[str], *, secrets: list[str] | None = None
    ) -> tuple[list[str], _Answer]:
        argv = [self.binary, *self._target(), *args]
        secrets = self._secrets() if secrets is None else secrets
        shown = redact_argv(argv, secrets)
        return shown, self._run(argv, shown=shown, secrets=secrets)

    def _help(self, *args: str) -> str:
        _, answer = self._call([*args, "--help"])
        if answer.exit_code != 0:
            raise IrisError(
                f"`{self.binary} {' '.join(args)} --help` failed (exit {answer.exit_code}):\n"
                f"{answer.output[:2000] or '(no output)'}"
            )
        return answer.stdout

    def capabilities(self) -> IrisCapabilities:
        """What the installed binary offers, learned once per process from its help screens."""
        # Keyed by the binary's bytes: an upgraded iris in the same place is learned again.
        located = self.binary if "/" in self.binary else shutil.which(self.binary)
        try:
            with open(located or "", "rb") as fh:
                stamp = hashlib.sha256(fh.read(1 << 20)).hexdigest()
        except OSError:
            stamp = "?"
        key = (self.binary, stamp)
        if key not in _CAPABILITIES:
            _CAPABILITIES[key] = learn(self._help)
        return _CAPABILITIES[key]

    def require(self, *, spec: JobSpec) -> IrisCapabilities:
        """The binary's capabilities, or MissingCapability
        naming what `spec` needs that it lacks (nothing run)."""
        caps = self.capabilities()
        used = [
            a for a in self._render(spec, lambda key, var: MASK) if a.startswith("--") and a != "--"
        ]
        check_run(caps, binary=self.binary, used=used)
        return caps

    # ---- jobs ----------------------------------------------------------------------------------

    def submit(self, *, spec: JobSpec, cwd: Path) -> Submission:
        """Submit `spec` with `--no-wait --user`; return
        the job id (known before the submit) and when.

        `cwd` is the workspace iris bundles to /app (its ``git ls-files --cached --others
        --exclude-standard``: the working tree, uncommitted edits included). A job of the same name
        that is still running makes iris refuse
        (ALREADY_EXISTS): JobAlreadyRunning, nothing submitted.
        """
        # The deployment has the binary and the cluster
        # credentials, or one message says how to add them.
        target = (
            "cluster"
            if self.cluster is not None
            else "config"
            if self.config_file is not None
            else "controller_url"
        )
        check_iris_setup(binary=self.binary, target=target)
        argv = self.argv(spec)  # raises, naming the variable, before anything runs
        secrets = self._secrets(spec)
        shown = self.redacted_argv(spec)
        if not Path(cwd).is_dir():
            raise IrisError(f"job {spec.name}: the workspace to bundle, {cwd}, is not a directory")
        self.require(spec=spec)
        job_id = self.job_id(spec.name)
        dg.get_dagster_logger().info(f"iris submit (cwd {cwd}): {self.command_line(spec)}")
        submitted_ms = int(time.time() * 1000)
        answer = self._run(argv, shown=shown, secrets=secrets, cwd=Path(cwd))
        if answer.exit_code != 0:
            if _ALREADY.search(answer.output):
                row = self.listed(job_id=job_id)
                seen = f" (it is {row.state}, submitted {row.submitted})" if row else ""
                raise JobAlreadyRunning(
                    f"a job named {job_id} is already running on the cluster{seen}; lockstep "
                    "submitted nothing. "
                    f"Wait for it, or cancel it: {self.binary} {' '.join(self._target())} job "
                    f"{self.capabilities().cancel_command or 'cancel'} {job_id}"
                )
            raise IrisError(
                f"iris job run for {spec.name} failed (exit {answer.exit_code}); nothing is "
                "running under that name "
                "unless iris says so below.\ncommand: "
                f"{shlex.join(shown)}\n{answer.output[-3000:] or '(no output)'}"
            )
        printed = [
            line.strip() for line in answer.stdout.splitlines() if line.strip().startswith("/")
        ]
        if printed and printed[-1] != job_id:
            raise IrisError(
                f"iris job run printed the job id {printed[-1]}, not {job_id}: the cluster "
                "ignored --user "
                f"{self.user}; check [iris] user and who the cluster thinks you are"
            )
        return Submission(job_id=job_id, submitted_ms=submitted_ms, listed=self._try_listed(job_id))

    def describe(self, *, job_id: str) -> JobSummary | None:
        """The job's state now (`job describe`, or `job
        summary` [--json] on older iris); None: unknown."""
        caps = self.capabilities()
        command = caps.state_command
        if command is None:
            raise MissingCapability(f"`{self.binary} job` has neither describe nor summary")
        json_output = command == "summary" and caps.summary_json
        secrets = self._secrets()
        shown, answer = self._call(
            ["job", command, job_id, *(["--json"] if json_output else [])], secrets=secrets
        )
        if answer.exit_code != 0:
            if _NOT_FOUND.search(answer.output):
                return None
            raise IrisError(
                f"{shlex.join(shown)} failed (exit "
                f"{answer.exit_code}):\n{answer.output[-2000:] or '(no output)'}"
            )
        return parse_state_output(
            answer.stdout, job_id=job_id, json_output=json_output, secrets=secrets
        )

    def _list(self, prefix: str) -> list[ListedJob]:
        """The rows of `job list --prefix P` (children and
        look-alikes included: the prefix is a prefix)."""
        shown, answer = self._call(["job", "list", "--prefix", prefix])
        if answer.exit_code != 0:
            raise IrisError(
                f"{shlex.join(shown)} failed (exit "
                f"{answer.exit_code}):\n{answer.output[-2000:] or '(no output)'}"
            )
        return parse_list_text(answer.stdout)

    def listed(self, *, job_id: str) -> ListedJob | None:
        """This job's row of `job list --prefix ID` (its
        submit time and pending reason), or None."""
        return next((row for row in self._list(job_id) if row.job_id == job_id), None)

    def _try_listed(self, job_id: str) -> ListedJob | None:
        try:
            return self.listed(job_id=job_id)
        except IrisError as exc:
            dg.get_dagster_logger().warning(
                f"iris: could not list {job_id} ({exc}); replacement checks skipped"
            )
            return None

    def cancel(self, *, job_id: str) -> None:
        """Cancel (or, on older iris, kill) exactly this job. Job-scoped, never the cluster."""
        caps = self.capabilities()
        command = caps.cancel_command
        if command is None:
            raise MissingCapability(f"`{self.binary} job` has no cancel, kill or stop")
        if command != "cancel" and not caps.kill_exact:
            # Before 2026-07-21 kill/stop matched ids by
            # PREFIX: it would end any sibling named like us.
            siblings = [
                r.job_id
                for r in self._list(job_id)
                if r.job_id != job_id
                and not r.job_id.startswith(job_id + "/")
                and r.state not in {s.value for s in TERMINAL}
            ]
            if siblings:
                raise IrisError(
                    f"`job {command}` on this iris matches ids by prefix and would also end "
                    f"{', '.join(siblings)}; "
                    f"lockstep did not run it: end {job_id} by hand"
                )
        shown, answer = self._call(["job", command, job_id])
        if answer.exit_code != 0 and not _NOT_FOUND.search(answer.output):
            raise IrisError(
                f"{shlex.join(shown)} failed (exit "
                f"{answer.exit_code}):\n{answer.output or '(no output)'}"
            )
        dg.get_dagster_logger().info(f"iris: {command} {job_id}: {answer.output}")

    def logs(self, *, job_id: str, since_ms: int, spec: JobSpec | None = None) -> JobLog:
        """The job's whole log from `since_ms` (``--since-ms S --no-tail``: a time window, never
        ``--tail``, which under-samples; runbook §6), masked, its last LOG_TAIL_LINES lines kept.

        Scans it for the value of every secret this resource knows (the push token, `spec`'s
        secret_env, redact_env), raw and as the base64 a docker auth line would show, and reports
        which NAMES appeared; the values themselves are never stored or returned.
        """
        named = self._named_secrets(spec)
        secrets = list(named.values())
        shown, answer = self._call(
            [
                "job",
                "logs",
                job_id,
                "--since-ms",
                str(since_ms),
                "--no-tail",
                "--max-lines",
                str(LOG_MAX_LINES),
            ],
            secrets=secrets,
        )
        if answer.exit_code != 0:
            raise IrisError(
                f"{shlex.join(shown)} failed (exit "
                f"{answer.exit_code}):\n{answer.output[-2000:] or '(no output)'}"
            )
        raw = answer.raw_stdout
        leaked = sorted(
            name for name, value in named.items() if any(form in raw for form in _forms(value))
        )
        forms = [form for value in secrets for form in _forms(value)]
        lines = redact(raw, forms).splitlines()
        return JobLog(lines=len(lines), tail=lines[-LOG_TAIL_LINES:], leaked=leaked,
                      truncated=len(lines) >= LOG_MAX_LINES)  # fmt: skip

    def recent_lines(
        self, *, job_id: str, since_ms: int, lines: int = TAIL_LINES, spec: JobSpec | None = None
    ) -> list[str]:
        """The job's last `lines` log lines so far (``--since-ms S --tail --max-lines N``), masked
        as `logs` masks, without iris's prefix: a running job's tail for its heartbeat. `--tail` may
        under-sample (runbook §6), which a glance at a
        running job can afford and a post-mortem cannot."""
        secrets = [form for value in self._secrets(spec) for form in _forms(value)]
        shown, answer = self._call(
            [
                "job",
                "logs",
                job_id,
                "--since-ms",
                str(since_ms),
                "--tail",
                "--max-lines",
                str(int(lines)),
            ],
            secrets=secrets,
        )
        if answer.exit_code != 0:
            raise IrisError(
                f"{shlex.join(shown)} failed (exit {answer.exit_code}): "
                f"{answer.output[-500:] or '(no output)'}"
            )
        return [log_text(line) for line in answer.stdout.splitlines()][-lines:]

    def wait(
        self,
        *,
        job_id: str,
        timeout_s: float,
        submission: Submission | None = None,
        heartbeat: Heartbeat | None = None,
        spec: JobSpec | None = None,
    ) -> JobSummary:
        """Poll the job's STATE until it is terminal and return that summary, whatever the state.

        Polls back off exponentially from poll_min_s to poll_max_s; pending diagnostics are logged
        as they change. Raises IrisError when `timeout_s` passes (naming the last state and why it
        is pending; the job is left running), when the job is unknown or iris fails for
        `vanish_after` polls in a row, and JobReplaced
        when the job under this id is not `submission`'s.

        `heartbeat` beats on every poll (its tail: the job's last log lines, `spec`'s secrets masked
        too), and no sleep outlasts its next line.
        """
        deadline = time.monotonic() + timeout_s
        delay = self.poll_min_s
        last: JobSummary | None = None
        missing = failures = 0
        said = ""
        log = dg.get_dagster_logger()
        while True:
            try:
                now = self.describe(job_id=job_id)
                failures = 0
            except (ClientTooOld, MissingCapability, IrisUnreadable):
                raise  # an unknown state or a garbled field reads the same on every poll
            except IrisError as exc:
                if _USAGE.search(str(exc)):
                    raise  # a usage error is never transient
                # one failed poll is not a verdict on a 3-hour build; a run of them is
                failures += 1
                if failures >= self.vanish_after:
                    raise IrisError(
                        f"iris failed to answer for job {job_id} {failures} times in a row: {exc}"
                    ) from None
                now = None
            else:
                if now is None:
                    missing += 1
                    if missing >= self.vanish_after:
                        seen = f"last seen {last.state.value}" if last else "never seen"
                        raise IrisError(
                            f"job {job_id} vanished: iris did not know it in {missing} "
                            f"consecutive polls ({seen}); "
                            f"check `{self.binary} {' '.join(self._target())} job list --prefix "
                            f"{job_id}`"
                        )
            if now is not None:
                missing = 0
                if last is not None and _went_back(last.state, now.state):
                    raise JobReplaced(
                        f"job {job_id} went from {last.state.value} back to {now.state.value}: "
                        "someone submitted another job of the same name; its state is not ours"
                    )
                if last is None:
                    self._same_incarnation(job_id, submission)
                if last is None or now.state != last.state:
                    log.info(f"iris job {job_id}: {now.state.value}")
                last = now
                why = self._pending_reason(now) if now.state is JobState.PENDING else ""
                if why and why != said:
                    log.info(f"iris job {job_id} is pending: {why}")
                    said = why
                if now.state.terminal:
                    self._same_incarnation(job_id, submission)
                    return now
            if heartbeat is not None:
                shown_state = (
                    f"{last.state.value}{f' ({said})' if said else ''}" if last else "not yet seen"
                ) + ("" if now is not None else " (this poll got no answer)")
                since_ms = submission.submitted_ms if submission else 0
                heartbeat.beat(
                    state=shown_state,
                    tail_lines=lambda since_ms=since_ms: self.recent_lines(
                        job_id=job_id, since_ms=since_ms, spec=spec
                    ),
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                state = last.state.value if last else "not yet seen"
                reason = f" ({said})" if said else ""
                raise IrisError(
                    f"job {job_id} is still {state}{reason} after {timeout_s:g}s of waiting; it "
                    "was NOT cancelled. "
                    f"Wait longer, or end it: {self.binary} {' '.join(self._target())} job "
                    f"{self.capabilities().cancel_command or 'cancel'} {job_id}"
                )
            _sleep(min(delay, remaining, heartbeat.due_in() if heartbeat else delay))
            delay = min(delay * 2, self.poll_max_s)

    def _pending_reason(self, summary: JobSummary) -> str:
        """Why a job is pending: the tasks' diagnostics,
        else the pending_reason `job list` shows."""
        if diag := summary.diagnostics():
            return diag
        row = self._try_listed(summary.job_id)
        return row.reason if row else ""

    def _same_incarnation(self, job_id: str, submission: Submission | None) -> None:
        """The finished job is the one lockstep submitted:
        same submit time as right after the submit."""
        if submission is None or submission.listed is None:
            return
        now = self._try_listed(job_id)
        if now is not None and now.submitted != submission.listed.submitted:
            raise JobReplaced(
                f"job {job_id} was submitted at {submission.listed.submitted}, but iris now "
                "reports a job of that "
                f"name submitted at {now.submitted}: another submission replaced it, and the "
                "state read is not "
                "lockstep's job's"
            )
        first = submission.listed.submitted_at()
        if first is not None and first.tzinfo is not None:
            ours = datetime.fromtimestamp(submission.submitted_ms / 1000, tz=UTC)
            # clocks differ a little; an older job differs a lot
            if first < ours - timedelta(minutes=10):
                raise JobReplaced(
                    f"the job iris reports under {job_id} was submitted at "
                    f"{submission.listed.submitted}, well before "
                    f"lockstep's submit at {ours.isoformat()}: it is an older job of the same name"
                )


def _went_back(before: JobState, now: JobState) -> bool:
    """A running job never becomes pending or building
    again: only a new submission of its name does."""
    return before is JobState.RUNNING and now in (JobState.PENDING, JobState.BUILDING)


def _forms(value: str) -> list[str]:
    """How a secret shows in a traced shell script: as
    itself, and inside base64 (docker's `user:token`).

    In base64 of ``prefix + token`` the token's characters depend on its offset modulo 3; encoding
    the token behind 0, 1 or 2 filler bytes gives each alignment, and all but the first and last
    4-character groups of each are the token's own.
    """
    forms = [value]
    for pad in range(3):
        encoded = base64.b64encode(b"x" * pad + value.encode()).decode()
        core = encoded[4 if pad else 0 : -4]
        if len(core) >= 8:
            forms.append(core)
    return forms


def iris_for(site: SiteConfig, *, env_vars: bool = False) -> IrisCli:
    """The iris CLI the site names (a path with a '/' is relative to the site file).

    `env_vars`: the push token as ``dg.EnvVar`` (for Definitions); otherwise read at submit time.
    """
    if site.iris is None:
        raise LockstepError(
            f"{site.path}: no [iris] table: lockstep needs it to build and smoke images"
        )
    section = site.iris
    binary = str(site.resolve_path(section.binary)) if "/" in section.binary else section.binary
    token_env = section.docker_token_env
    return IrisCli(
        binary=binary,
        cluster=section.cluster,
        config_file=str(site.resolve_path(section.config)) if section.config else None,
        controller_url=section.controller_url,
        user=section.user,
        timeout_s=section.call_timeout_s,
        poll_min_s=section.poll_min_s,
        poll_max_s=section.poll_max_s,
        redact_env=site.secret_env_names(),
        docker_token_env=token_env,
        docker_token=dg.EnvVar(token_env) if env_vars and token_env else None,
    )
