"""The sandbox's stand-in for the iris cluster CLI:
the real command lines, jobs run on this machine.

Only what cannot exist on one machine is simulated: a cluster that schedules jobs, and kaniko. It
speaks the CURRENT iris job CLI by default and, on request, the two older 2026 generations, each as
read from the real source (the Marin monorepo, ``marin-community/marin``,
``lib/iris/src/iris/cli/job.py`` and its history up to 2dfb07943 of 2026-08-22; a full mirror with
history is ``Stars1233/marin``):

- ``2026-08`` (HEAD 2dfb07943, after 43ea65e00 of 2026-08-20): ``job run | describe | wait | cancel
  [--prefix/--exact] | complete | list [--state --prefix --limit] | logs``; no ``--json`` anywhere
  (an unknown option is click's exit 2 "No such option"); ``job logs`` lines carry ``attempt=``.
- ``2026-07`` (0361dfb98 of 2026-07-03 .. 2026-07-21):
  ``job summary`` (text only), ``kill``/``stop``
  matching ids by PREFIX, ``list`` text, no ``wait``.
- ``2026-06`` (2026-06-24 cdcc96653 .. 2026-07-03; the
  marin-iris 0.2.20.dev202606180959 wheel has these
  shapes but predates ``--no-sync``): ``job summary
  [--json]``, ``list [--json]``, ``kill``/``stop`` by prefix.

Common to all: ``job run [options] -- CMD`` with ``--no-wait`` prints ``/<user>/<name>`` on stdout
("Job submitted: ..." on stderr); the user is ``--user``, else the OS user; a finished job of the
same name is REPLACED, a running one is refused ALREADY_EXISTS (exit 1); an unknown job is a
ConnectError NOT_FOUND ("Job /u/x not found", exit 1); OOM on the Kubernetes backend is ``failed``.

`install_fake_iris(root, contract=...)` writes ``root/bin/iris`` (works from any directory) and
``root/iris/config.json``. Jobs and the worker that runs them: sandbox/fake_iris_jobs.py. Faults
(`queue_fault`, consumed one per submitted job): ok, fail, hang, vanish, unschedulable, oom, pending
(stays pending with a reason), leak (the job prints its DOCKER_TOKEN into its log), replace (another
submission of the same name replaces the job right after it ends), push_fail (a kaniko job's script
runs and writes its login, then its executor fails the push). ``too_old`` in the config makes
the controller refuse the client, as a controller 14+ days newer would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox.fake_iris_jobs import (
    FAULTS,
    INHERITED,
    JOB_ENV,
    NAME,
    PULL_ENV,
    TERMINAL,
    all_states,
    archive_path,
    bundle,
    job_dir,
    now_ms,
    observe,
    pop_fault,
    queue_fault,
    run_worker,
    stop_all,
    terminate,
    text_table,
    transition,
    write_json,
)

__all__ = ["CONTRACTS", "FAULTS", "install_fake_iris", "job_dir", "queue_fault", "stop_all"]

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Contract:
    commands: tuple[str, ...]
    state_command: str  # describe | summary
    cancel_commands: tuple[str, ...]
    json: bool  # summary --json, list --json
    exact_cancel: bool  # cancel/kill match ids exactly (else by prefix)
    log_attempts: bool
    run_options: tuple[str, ...] = field(default=())


_RUN_COMMON = (
    "-e, --env-vars <TEXT TEXT>...",
    "--tpu TEXT",
    "--gpu TEXT",
    "--enable-extra-resources",
    "--cpu FLOAT",
    "--memory TEXT",
    "--disk TEXT",
    "--no-wait",
    "--job-name TEXT",
    "--user TEXT",
    "--replicas INTEGER",
    "--max-retries INTEGER",
    "--timeout INTEGER",
    "--region TEXT",
    "--zone TEXT",
    "--extra TEXT",
    "--no-sync",
    "--reserve TEXT",
    "--priority [production|interactive|batch]",
    "--preemptible / --no-preemptible",
    "--task-image TEXT",
)
CONTRACTS = {
    "2026-08": Contract(
        ("run", "describe", "wait", "cancel", "complete", "list", "logs"),
        "describe",
        ("cancel",),
        json=False,
        exact_cancel=True,
        log_attempts=True,
        run_options=(*_RUN_COMMON, "--container-profile TEXT", "--exclude TEXT"),
    ),
    "2026-07": Contract(
        ("run", "summary", "kill", "stop", "list", "logs"),
        "summary",
        ("kill", "stop"),
        json=False,
        exact_cancel=False,
        log_attempts=False,
        run_options=_RUN_COMMON,
    ),
    "2026-06": Contract(
        ("run", "summary", "kill", "stop", "list", "logs", "bug-report"),
        "summary",
        ("kill", "stop"),
        json=True,
        exact_cancel=False,
        log_attempts=False,
        run_options=_RUN_COMMON,
    ),
}


class UsageError(Exception):
    """A command line click would refuse (exit 2)."""

    def __init__(self, message: str, usage: str = "iris job [OPTIONS] COMMAND [ARGS]...") -> None:
        super().__init__(message)
        self.usage = usage


class RpcError(Exception):
    """What the controller refuses (exit 1, a ConnectError traceback on stderr)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- installing ------------------------------------------------------------------------------


def install_fake_iris(
    root: Path,
    *,
    contract: str = "2026-08",
    kaniko: list[str] | None = None,
    task_image_hook: list[str] | None = None,
    env: dict[str, str] | None = None,
    pull_secret_env: list[str] | None = None,
    state_delay_s: float = 0.05,
    too_old: bool = False,
) -> Path:
    """Write ``root/bin/iris`` and ``root/iris/config.json``; return the wrapper's path.

    contract: which iris generation it speaks (CONTRACTS). kaniko: argv that stands in for
    /kaniko/executor in a build job (none: builds fail saying so). task_image_hook: argv run before
    any other job, with TASK_IMAGE and IMAGE_ROOT, to unpack the task image there. env: extra
    environment for every job (never a secret: it is stored in config.json). pull_secret_env: NAMES
    of the variables (of whoever runs `iris job run`) that the cluster pulls task images with, as a
    real cluster's imagePullSecret: given to task_image_hook only, never to the job. state_delay_s:
    how long each intermediate state lasts. Re-installing rewrites the config and keeps the jobs.
    """
    if contract not in CONTRACTS:
        raise ValueError(f"unknown iris contract {contract!r}: one of {', '.join(CONTRACTS)}")
    root = Path(root).resolve()
    home = root / "iris"
    (home / "jobs").mkdir(parents=True, exist_ok=True)
    write_json(
        home / "config.json",
        {
            "contract": contract,
            "kaniko": kaniko,
            "task_image_hook": task_image_hook,
            "env": env or {},
            "pull_secret_env": pull_secret_env or [],
            "state_delay_s": state_delay_s,
            "too_old": too_old,
        },
    )
    wrapper = root / "bin" / "iris"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    # The contract is in the wrapper's text, so a binary that speaks another one is another file.
    wrapper.write_text(
        "#!/bin/sh\n"
        f"# The sandbox's stand-in for the iris CLI (sandbox/fake_iris.py), contract {contract}.\n"
        f"PYTHONPATH={shlex.quote(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
        f"exec {shlex.quote(sys.executable)} -m sandbox.fake_iris --home {shlex.quote(str(home))} "
        f'--contract {contract} "$@"\n',
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    return wrapper


def _config(home: Path) -> dict[str, Any]:
    path = home / "config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {
        "contract": "2026-08",
        "kaniko": None,
        "task_image_hook": None,
        "env": {},
        "pull_secret_env": [],
        "state_delay_s": 0.05,
        "too_old": False,
        **config,
    }


# ---- help screens (click's layout: the adapter reads these to learn what the binary has) -----


def _help(usage: str, summary: str, options: list[str], commands: list[str] | None = None) -> str:
    lines = [f"Usage: {usage}", "", f"  {summary}", "", "Options:"]
    for option in [*options, "--help"]:
        description = "Show this message and exit." if option == "--help" else "(see the iris docs)"
        lines.append(
            f"  {option:<32}  {description}"
            if len(option) <= 32
            else f"  {option}\n{'':36}{description}"
        )
    if commands:
        lines += ["", "Commands:", *(f"  {c:<12}  (iris job {c})" for c in commands)]
    return "\n".join(lines) + "\n"


def _command_help(contract: Contract, command: str) -> str:
    if command == "run":
        return _help(
            "iris job run [OPTIONS] CMD...",
            "Submit jobs to Iris clusters.",
            list(contract.run_options),
        )
    if command in ("describe", "summary"):
        return _help(
            f"iris job {command} [OPTIONS] JOB_ID",
            "Describe a job and its tasks.",
            ["--json"] if contract.json and command == "summary" else [],
        )
    if command in ("cancel", "kill", "stop"):
        opts = (
            ["--prefix / --exact", "--stdin", "--dry-run"]
            if contract.exact_cancel
            else ["--include-children / --no-include-children"]
        )
        return _help(f"iris job {command} [OPTIONS] JOB_ID...", "Terminate jobs.", opts)
    if command == "list":
        opts = ["--state TEXT", "--prefix TEXT"] + (
            ["--limit INTEGER RANGE"] if contract.exact_cancel else []
        )
        return _help(
            "iris job list [OPTIONS]", "List jobs.", opts + (["--json"] if contract.json else [])
        )
    if command == "logs":
        return _help(
            "iris job logs [OPTIONS] JOB_ID",
            "Read logs for a job.",
            [
                "--since-ms INTEGER",
                "--since-seconds INTEGER",
                "-f, --follow",
                "--max-lines INTEGER",
                "--tail / --no-tail",
                "--level [debug|info|warning|error|critical]",
            ],
        )
    return _help(f"iris job {command} [OPTIONS] JOB_ID", f"iris job {command}.", [])


# ---- argument parsing with click's exit codes ------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 too; say it the way click does
        if "unrecognized arguments" in message:
            message = "No such option: " + message.split(":", 1)[1].strip().split()[0]
        raise UsageError(message, usage=f"{self.prog} [OPTIONS]")


def _parser(prog: str) -> _Parser:
    return _Parser(prog=prog, add_help=False)


# ---- commands --------------------------------------------------------------------------------


def cmd_run(home: Path, config: dict[str, Any], contract: Contract, args: list[str]) -> int:
    if "--" not in args:
        raise UsageError("No command provided after --", usage="iris job run [OPTIONS] CMD...")
    split = args.index("--")
    p = _parser("iris job run")
    p.add_argument("-e", "--env-vars", dest="env", nargs=2, action="append", default=[])
    for flag in (
        "--task-image",
        "--job-name",
        "--user",
        "--memory",
        "--disk",
        "--priority",
        "--tpu",
        "--gpu",
    ):
        p.add_argument(flag)
    p.add_argument("--cpu", type=float, default=0.1)
    p.add_argument("--max-retries", type=int, default=0)
    p.add_argument("--timeout", type=int, default=0)
    for flag in ("--no-sync", "--enable-extra-resources", "--no-wait"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--preemptible", dest="preemptible", action="store_true", default=None)
    p.add_argument("--no-preemptible", dest="preemptible", action="store_false")
    opts = p.parse_args(args[:split])
    command = args[split + 1 :]
    if not command:
        raise UsageError("No command provided after --", usage="iris job run [OPTIONS] CMD...")
    if command[0].startswith("-"):
        raise UsageError(f"Unknown option {command[0]!r}. Iris options must come before '--'.")
    memory, disk = opts.memory or "1GB", opts.disk or "5GB"
    if not opts.enable_extra_resources and (_gb(memory) >= 4 or _gb(disk) >= 10):
        raise UsageError(
            "large resource requests (>= 4 GB RAM or >= 10 GB disk) need --enable-extra-resources"
        )
    env: dict[str, str] = {}
    for key, value in opts.env:
        if "=" in key:
            raise UsageError(f"Key cannot contain '=': {key}")
        env[key] = value
    name = opts.job_name or f"job-{now_ms()}"
    user = opts.user or "root"  # the OS user under Dagster: the runbook's trap that --user avoids
    if not NAME.match(name) or not NAME.match(user):
        raise UsageError(f"invalid job name or user: {name!r} {user!r}")
    job_id = f"/{user}/{name}"
    jd = job_dir(home, job_id)
    old = observe(jd)
    if old is not None:
        if old["state"] not in TERMINAL:
            raise RpcError("ALREADY_EXISTS", f"Job {job_id} already exists and is still running")
        jd.rename(archive_path(home, jd, old["submitted_at_ms"]))
    fault = pop_fault(home)
    jd.mkdir(parents=True)
    print(f"Submitting job: {name}", file=sys.stderr)
    files = bundle(Path.cwd(), jd / "app", home)
    (jd / "log").touch()
    write_json(
        jd / "state.json",
        {
            "job_id": job_id,
            "name": name,
            "state": "pending",
            "exit_code": None,
            "error": None,
            "pending_reason": None,
            "task_diagnostic": None,
            "submitted_at_ms": now_ms(),
            "started_at_ms": None,
            "finished_at_ms": None,
            "task_image": opts.task_image,
            "no_sync": opts.no_sync,
            "preemptible": opts.preemptible,
            "resources": {"cpu": opts.cpu, "memory": memory, "disk": disk},
            "max_retries": opts.max_retries,
            "timeout_s": opts.timeout,
            "env_keys": list(env),  # names only: values may be secrets
            "command": command,
            "kind": "kaniko" if "BUILD_B64" in env else "command",
            "fault": fault,
            "bundle_files": files,
            "worker_pgid": None,
        },
    )
    with open(jd / "worker.log", "ab") as worker_log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "sandbox.fake_iris", "--home", str(home), "_worker", job_id],
            cwd=jd, env={**_inherited(), "PYTHONPATH": str(PROJECT_ROOT), JOB_ENV: json.dumps(env),
                         PULL_ENV: json.dumps(_pull_secrets(config))},
            stdin=subprocess.DEVNULL, stdout=worker_log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: cancel ends it and all it started
        )  # fmt: skip
    transition(jd, worker_pgid=worker.pid)
    print(f"Job submitted: {job_id}", file=sys.stderr)
    print(job_id, flush=True)
    if opts.no_wait:
        return 0
    while (now := observe(jd)) is not None and now["state"] not in TERMINAL:
        time.sleep(0.2)
    return 0 if now and now["state"] == "succeeded" else 1


def _inherited() -> dict[str, str]:
    return {k: os.environ[k] for k in INHERITED if k in os.environ}


def _pull_secrets(config: dict[str, Any]) -> dict[str, str]:
    """The cluster's own registry login (config
    `pull_secret_env`), read here and handed on in memory."""
    return {k: os.environ[k] for k in config["pull_secret_env"] if os.environ.get(k)}


def _gb(text: str) -> float:
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)I?B?\s*$", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"{text!r} is not a size (e.g. 64GB, 512MB)")
    return float(m[1]) * 1000 ** " KMGT".index(m[2].upper() or " ") / 1e9


def _state(home: Path, job_id: str) -> dict[str, Any]:
    try:
        state = observe(job_dir(home, job_id))
    except ValueError:
        state = None
    if state is None:
        raise RpcError("NOT_FOUND", f"Job {job_id} not found")
    return state


def _tasks(state: dict[str, Any]) -> list[dict[str, Any]]:
    started, finished = state["started_at_ms"], state["finished_at_ms"]
    return [
        {
            "task_id": f"{state['job_id']}/0",
            "index": "0",
            "state": state["state"],
            "exit_code": state["exit_code"] if state["state"] in TERMINAL else None,
            "duration_ms": ((finished or now_ms()) - started) if started else None,
            "memory_mb": 0,
            "memory_peak_mb": 0,
            "cpu_millicores": 0,
            "disk_mb": 0,
            "worker_id": "sandbox-worker-0",
            "error": state["error"] or state.get("task_diagnostic") or "",
        }
    ]


def _summary(state: dict[str, Any], contract: Contract) -> dict[str, Any]:
    """`build_job_summary` (2026-04..08): exit_code an
    int, 0 until there is one; the 2026-06 controller
    (marin-iris 0.2.20, run here) leaves the job's exit_code at 0 and puts the code on the task."""
    terminal = state["state"] in TERMINAL
    job_exit = 0 if contract.json else int(state["exit_code"] or 0)
    return {
        "job_id": state["job_id"],
        "name": state["job_id"],
        "state": state["state"],
        "exit_code": job_exit,
        "error": state["error"] or "",
        "failure_count": int(state["state"] in ("failed", "worker_failed")),
        "preemption_count": 0,
        "task_count": 1,
        "completed_count": int(terminal),
        "task_state_counts": {state["state"]: 1},
        "tasks": _tasks(state),
    }


def _text(summary: dict[str, Any], diagnostic_header: str) -> str:
    """`render_job_description_text` / `_render_job_summary_text`: the head, then a plain table."""
    lines = [
        f"Job: {summary['job_id']} ({summary['name']})",
        (
            f"State: {summary['state']}  exit={summary['exit_code']}  "
            f"failures={summary['failure_count']}  "
            f"preemptions={summary['preemption_count']}"
        ),
        f"Tasks: {summary['completed_count']}/{summary['task_count']} completed  "
        + "  ".join(f"{k}={v}" for k, v in sorted(summary["task_state_counts"].items()) if v),
    ]
    if summary["error"]:
        lines.append(f"Error: {summary['error']}")
    lines.append("")
    rows = [["TASK", "STATE", "EXIT", "DURATION", "PEAK MEM", "CUR MEM", diagnostic_header]]
    for t in summary["tasks"]:
        rows.append(
            [
                t["index"],
                t["state"],
                "-" if t["exit_code"] is None else str(t["exit_code"]),
                "-" if t["duration_ms"] is None else f"{t['duration_ms'] / 1000:.1f} seconds",
                "-",
                "-",
                t["error"][:120],
            ]
        )
    return "\n".join([*lines, *text_table(rows, right_first=True)])


def cmd_state(home: Path, contract: Contract, command: str, args: list[str]) -> int:
    p = _parser(f"iris job {command}")
    p.add_argument("job_id")
    if contract.json and command == "summary":
        p.add_argument("--json", action="store_true")
    opts = p.parse_args(args)
    summary = _summary(_state(home, opts.job_id), contract)
    if getattr(opts, "json", False):
        print(json.dumps(summary, indent=2))
    else:
        print(_text(summary, "DIAGNOSTIC" if command == "describe" else "ERROR"))
    return 0


def _iso(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat() if ms else "-"


def cmd_list(home: Path, contract: Contract, args: list[str]) -> int:
    p = _parser("iris job list")
    p.add_argument("--prefix")
    p.add_argument("--state")
    if contract.exact_cancel:
        p.add_argument("--limit", type=int, default=50)
    if contract.json:
        p.add_argument("--json", action="store_true")
    opts = p.parse_args(args)
    states = [s for s in all_states(home) if not opts.prefix or s["job_id"].startswith(opts.prefix)]
    if opts.state:
        states = [s for s in states if s["state"] == opts.state.lower()]
    states.sort(key=lambda s: s["submitted_at_ms"], reverse=True)
    states = states[: getattr(opts, "limit", None) or None]
    if getattr(opts, "json", False):
        print(
            json.dumps(
                [
                    {
                        "job_id": s["job_id"],
                        "state": f"JOB_STATE_{s['state'].upper()}",
                        "submitted_at": {"epoch_ms": str(s["submitted_at_ms"])},
                        **({"error": s["error"]} if s["error"] else {}),
                        **({"pending_reason": s["pending_reason"]} if s["pending_reason"] else {}),
                    }
                    for s in states
                ],
                indent=2,
            )
        )
        return 0
    if not states:
        print("No jobs found.")
        return 0
    rows = []
    for s in states:
        reason = s["error"] or s["pending_reason"] or ""
        rows.append(
            [
                s["job_id"],
                s["state"],
                _iso(s["submitted_at_ms"]),
                reason[:60] + ("..." if len(reason) > 63 else ""),
            ]
        )
    headers = ["JOB ID", "STATE", "SUBMITTED", "REASON"]
    if not any(r[3] for r in rows):
        headers, rows = headers[:3], [r[:3] for r in rows]
    print("\n".join(text_table([headers, *rows])))
    return 0


def cmd_logs(home: Path, contract: Contract, args: list[str]) -> int:
    p = _parser("iris job logs")
    p.add_argument("job_id")
    p.add_argument("--since-ms", type=int)
    p.add_argument("--since-seconds", type=int)
    p.add_argument("--max-lines", type=int, default=0)
    p.add_argument("--tail", dest="tail", action="store_true", default=True)
    p.add_argument("--no-tail", dest="tail", action="store_false")
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--level")
    opts = p.parse_args(args)
    state = _state(home, opts.job_id)
    written = state["started_at_ms"] or state["submitted_at_ms"]
    if opts.since_ms is not None and opts.since_ms > (state["finished_at_ms"] or now_ms()):
        return 0
    lines = (
        (job_dir(home, opts.job_id) / "log")
        .read_text(encoding="utf-8", errors="replace")
        .splitlines()
    )
    limit = opts.max_lines or 1000  # the server's default
    lines = lines[-limit:] if opts.tail else lines[:limit]
    stamp = datetime.fromtimestamp(written / 1000, tz=UTC).strftime("%H:%M:%S")
    attempt = " attempt=0" if contract.log_attempts else ""
    for line in lines:
        print(f"[{stamp}] task={opts.job_id}/0{attempt} | {line}")
    return 0


def cmd_cancel(home: Path, contract: Contract, command: str, args: list[str]) -> int:
    p = _parser(f"iris job {command}")
    p.add_argument("job_ids", nargs="+")
    if contract.exact_cancel:
        p.add_argument("--prefix", dest="prefix", action="store_true", default=False)
        p.add_argument("--exact", dest="prefix", action="store_false")
    else:
        p.add_argument("--include-children", action="store_true")
        p.add_argument("--no-include-children", action="store_true")
    opts = p.parse_args(args)
    by_prefix = getattr(opts, "prefix", True)  # before 2026-07-21, kill and stop matched by prefix
    ended = []
    for wanted in opts.job_ids:
        targets = (
            [s["job_id"] for s in all_states(home) if s["job_id"].startswith(wanted)]
            if by_prefix
            else [wanted]
        )
        if not by_prefix:
            _state(home, wanted)  # NOT_FOUND for an unknown exact id
        for job_id in targets:
            if terminate(home, job_id, how=f"iris job {command}"):
                ended.append(job_id)
    print(
        ("Cancelled jobs:" if command == "cancel" else "Terminated jobs:")
        + "".join(f"\n  {j}" for j in ended)
        if ended
        else "No running jobs matched."
    )
    return 0


def cmd_wait(home: Path, args: list[str]) -> int:
    p = _parser("iris job wait")
    p.add_argument("job_id")
    opts = p.parse_args(args)
    while (state := _state(home, opts.job_id))["state"] not in TERMINAL:
        time.sleep(0.1)
    print(state["state"])
    return 0 if state["state"] == "succeeded" else 1


def cmd_complete(home: Path, args: list[str]) -> int:
    p = _parser("iris job complete")
    p.add_argument("job_id")
    opts = p.parse_args(args)
    _state(home, opts.job_id)
    transition(job_dir(home, opts.job_id), state="succeeded", exit_code=0, finished_at_ms=now_ms())
    print(f"Completed job: {opts.job_id}")
    return 0


# ---- entry point -----------------------------------------------------------------------------


def _dispatch(home: Path, contract_name: str, target: str | None, args: list[str]) -> int:
    config = _config(home)
    contract = CONTRACTS[contract_name]
    if not args or args[0] != "job":
        if args[:1] in (["--help"], []):
            print(
                _help(
                    "iris [OPTIONS] COMMAND [ARGS]...",
                    "Iris cluster management.",
                    ["--cluster TEXT", "--config PATH", "--controller-url TEXT"],
                    ["job"],
                )
            )
            return 0
        raise UsageError(f"No such command {args[0]!r}.", usage="iris [OPTIONS] COMMAND [ARGS]...")
    rest = args[1:]
    if not rest or rest[0] == "--help":
        print(
            _help(
                "iris job [OPTIONS] COMMAND [ARGS]...",
                "Manage Iris jobs.",
                [],
                sorted(contract.commands),
            )
        )
        return 0
    command, rest = rest[0], rest[1:]
    if command not in contract.commands:
        raise UsageError(f"No such command {command!r}.")
    if "--help" in rest[: rest.index("--") if "--" in rest else len(rest)]:
        print(_command_help(contract, command))
        return 0
    if target is None:
        raise UsageError(
            "No controller specified. Pass --cluster=<name>, --controller-url, or --config."
        )
    if config["too_old"]:
        raise RpcError(
            "FAILED_PRECONDITION",
            "marin-iris client is too old: your build is 2026-06-18, this controller "
            "runs 2026-11-30, and the oldest client accepted is 2026-11-16 (14 days).",
        )
    (home / "jobs").mkdir(parents=True, exist_ok=True)
    if command == "run":
        return cmd_run(home, config, contract, rest)
    if command in ("describe", "summary"):
        return cmd_state(home, contract, command, rest)
    if command == "list":
        return cmd_list(home, contract, rest)
    if command == "logs":
        return cmd_logs(home, contract, rest)
    if command in ("cancel", "kill", "stop"):
        return cmd_cancel(home, contract, command, rest)
    if command == "wait":
        return cmd_wait(home, rest)
    if command == "complete":
        return cmd_complete(home, rest)
    raise UsageError(f"No such command {command!r}.")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    home: Path | None = None
    contract = "2026-08"
    target: str | None = None
    try:
        while args and args[0].startswith("--") and args[0] != "--help":
            flag = args.pop(0)
            name, eq, value = flag.partition("=")
            if name not in ("--home", "--contract", "--cluster", "--config", "--controller-url"):
                raise UsageError(
                    f"No such option: {name}", usage="iris [OPTIONS] COMMAND [ARGS]..."
                )
            if not eq:
                if not args:
                    raise UsageError(f"Option '{name}' requires an argument.")
                value = args.pop(0)
            if name == "--home":
                home = Path(value).resolve()
            elif name == "--contract":
                contract = value
            else:
                target = value
        if home is None:
            raise UsageError("--home DIR is required (the fake cluster's state directory)")
        if args[:1] == ["_worker"]:
            return run_worker(home, args[1], _config(home))
        return _dispatch(home, contract, target, args)
    except UsageError as exc:
        print(
            (
                f"Usage: {exc.usage}\nTry '{exc.usage.split(' [')[0]} --help' for "
                f"help.\n\nError: {exc}"
            ),
            file=sys.stderr,
        )
        return 2
    except RpcError as exc:
        print(
            'Traceback (most recent call last):\n  File "iris/cli/main.py", in main\n'
            f"connectrpc.errors.ConnectError: {exc}\n(code: {exc.code})",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
