"""The sandbox's stand-in for the iris cluster CLI: the same command lines, jobs run on this machine.

Only what cannot exist on one machine is simulated: a cluster that schedules jobs, and kaniko. It
speaks the contract `resources.iris.IrisCli` relies on (see that module for the real CLI's shapes):

    python -m sandbox.fake_iris --home DIR --cluster=C job run --task-image IMG ... -e K V ... --no-wait -- CMD...
    python -m sandbox.fake_iris --home DIR --cluster=C job summary ID --json
    python -m sandbox.fake_iris --home DIR --cluster=C job list --json --prefix P
    python -m sandbox.fake_iris --home DIR --cluster=C job kill ID

`install_fake_iris(root)` writes ``root/bin/iris`` (a wrapper that works from any directory) and
``root/iris/config.json``. Each job lives in ``home/jobs/<id>/``: ``state.json`` (never a secret
value: env is recorded by name only), ``app/`` (the bundle), ``log`` (the job's own output, secret
values masked) and ``worker.log`` (what the fake itself did). A detached worker per job walks
pending -> building -> running -> succeeded/failed with the real exit code.

A job whose env has BUILD_B64 is a kaniko build. Its script's ``: "${VAR:?}"`` guards are honoured
(GITSHA always), then, as kaniko cannot run here, the configured `builder` argv runs with GITSHA,
IMAGE, DOCKER_USER_ID, DOCKER_TOKEN and APP_DIR (the bundle). Any other job runs its command here.

Faults make iris misbehave on purpose: ``home/faults.json`` is a queue consumed one entry per
submitted job (`queue_fault`): "ok", "fail", "hang", "vanish", "unschedulable", "oom".
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from resources.secrets import redact

PROJECT_ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("ok", "fail", "hang", "vanish", "unschedulable", "oom")
TERMINAL = frozenset({"succeeded", "failed", "killed", "worker_failed", "unschedulable"})

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_JOB_ENV = "_FAKE_IRIS_JOB_ENV"  # how `job run` hands the -e values to its worker without a file
# The only variables a job inherits from whoever submitted it; everything else comes from -e,
# as on a real cluster (and the submitter's own tokens stay out of the job).
_INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_SECRETISH = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|AUTH", re.I)
# bash's `${VAR:?message}`: an unset or empty VAR ends the script with exit 1.
_REQUIRED = re.compile(r"\$\{(?P<var>[A-Za-z_][A-Za-z0-9_]*):\?(?P<msg>[^}]*)\}")
_SIZE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?I?B?)\s*$", re.I)


class UsageError(Exception):
    """A command line the real CLI would refuse too (exit 2)."""


# ---- installing ------------------------------------------------------------------------------


def install_fake_iris(
    root: Path,
    *,
    builder: list[str] | None = None,
    task_image_hook: list[str] | None = None,
    env: dict[str, str] | None = None,
    state_delay_s: float = 0.05,
    user: str = "sandbox",
) -> Path:
    """Write ``root/bin/iris`` and ``root/iris/config.json``; return the wrapper's path.

    builder: argv that stands in for kaniko in a build job (none: builds fail saying so).
    task_image_hook: argv run before any other job, with TASK_IMAGE and IMAGE_ROOT, to unpack the
    task image there. env: extra environment for every process the fake starts (never a secret:
    it is stored in config.json). state_delay_s: how long each intermediate state lasts.
    Re-installing rewrites the config and keeps the jobs.
    """
    root = Path(root).resolve()
    home = root / "iris"
    (home / "jobs").mkdir(parents=True, exist_ok=True)
    config = {
        "user": user,
        "builder": builder,
        "task_image_hook": task_image_hook,
        "env": env or {},
        "state_delay_s": state_delay_s,
    }
    _write_json(home / "config.json", config)
    wrapper = root / "bin" / "iris"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(
        "#!/bin/sh\n"
        "# The sandbox's stand-in for the iris CLI (sandbox/fake_iris.py), written by install_fake_iris.\n"
        f"PYTHONPATH={shlex.quote(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
        f'exec {shlex.quote(sys.executable)} -m sandbox.fake_iris --home {shlex.quote(str(home))} "$@"\n',
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    return wrapper


def queue_fault(home: Path, fault: str) -> None:
    """Make the next submitted job (after those already queued) misbehave: one of FAULTS."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: use one of {', '.join(FAULTS)}")
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with _flock(home / "faults.lock"):
        path = home / "faults.json"
        queue = json.loads(path.read_text(encoding="utf-8") or "[]") if path.exists() else []
        _write_json(path, [*queue, fault])


def job_dir(home: Path, job_id: str) -> Path:
    """Where job `job_id` (``/<user>/<name>``) lives under `home`."""
    parts = job_id.strip("/").split("/")
    if not parts or not all(_NAME.match(p) for p in parts):
        raise UsageError(f"{job_id!r} is not a job id (/<user>/<name>)")
    return Path(home) / "jobs" / Path(*parts)


def stop_all(home: Path) -> list[str]:
    """Kill every job that has not finished (for test and demo teardown); return their ids."""
    ids = [st["job_id"] for st in _all_states(Path(home)) if st["state"] not in TERMINAL]
    for job_id in ids:
        _kill(Path(home), job_id)
    return ids


# ---- files -----------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    """Atomically: a reader (or a kill mid-write) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_state(jd: Path) -> dict[str, Any] | None:
    try:
        return json.loads((jd / "state.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _transition(jd: Path, **changes: Any) -> bool:
    """Apply `changes` unless the job already ended (e.g. was killed meanwhile); False then."""
    if not jd.exists():
        return False
    with _flock(jd / "lock"):
        state = _read_state(jd)
        if state is None or state["state"] in TERMINAL:
            return False
        state.update(changes)
        _write_json(jd / "state.json", state)
        return True


def _worker_alive(pid: int) -> bool:
    """Is `pid` still our worker? Not if it is gone, a zombie, or (after a reboot) someone else."""
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").exists():  # no procfs: all we can ask is whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and b"sandbox.fake_iris" in (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False


def _observe(jd: Path) -> dict[str, Any] | None:
    """The job's state as the controller would report it: a worker that died mid-job is WORKER_FAILED."""
    state = _read_state(jd)
    if state and state["state"] not in TERMINAL and state["worker_pgid"] and not _worker_alive(state["worker_pgid"]):
        _transition(jd, state="worker_failed", finished_at_ms=_now_ms(),
                    error="the worker process died without reporting (see worker.log)")  # fmt: skip
        state = _read_state(jd)
    return state


def _all_states(home: Path) -> list[dict[str, Any]]:
    return [s for path in sorted((home / "jobs").glob("**/state.json")) if (s := _observe(path.parent))]


def _config(home: Path) -> dict[str, Any]:
    path = home / "config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {"user": "sandbox", "builder": None, "task_image_hook": None, "env": {}, "state_delay_s": 0.05, **config}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso(ms: int | None) -> str | None:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat() if ms else None


# ---- job run ---------------------------------------------------------------------------------


def _size_bytes(text: str, flag: str) -> float:
    m = _SIZE.match(text)
    if not m:
        raise UsageError(f"{flag} {text!r} is not a size (e.g. 64GB, 512MB)")
    unit = m["unit"].upper().replace("I", "").rstrip("B")  # "GB", "GiB", "G" -> "G"; "B", "" -> ""
    return float(m["n"]) * 1000 ** " KMGT".index(unit or " ")


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="iris job run", add_help=False)
    p.add_argument("-e", "--env-vars", dest="env", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"))
    p.add_argument("--task-image", required=True)
    p.add_argument("--no-sync", action="store_true")
    p.add_argument("--enable-extra-resources", action="store_true")
    p.add_argument("--cpu", type=float, default=0.5)
    p.add_argument("--memory", default="1GB")
    p.add_argument("--disk", default="5GB")
    p.add_argument("--job-name", required=True)
    p.add_argument("--max-retries", type=int, default=0)
    p.add_argument("--timeout", type=int, default=0)
    p.add_argument("--no-wait", action="store_true")
    return p


def _git_files(src: Path) -> list[str] | None:
    """What iris bundles from a git workspace (working-tree content, .gitignore respected); None if not git."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--is-inside-work-tree"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


def _bundle(src: Path, dest: Path, home: Path) -> int:
    """Copy the workspace to `dest` the way iris bundles it to /app; return the file count."""
    files = _git_files(src)
    if files is None:
        def skip_home(directory: str, names: list[str]) -> list[str]:
            return [n for n in names if (Path(directory) / n).resolve() == home.resolve()]

        shutil.copytree(src, dest, symlinks=True, ignore=skip_home)
        return sum(1 for p in dest.rglob("*") if not p.is_dir())
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for rel in files:
        source, target = src / rel, dest / rel
        if not source.exists() and not source.is_symlink():
            continue  # tracked but deleted in the working tree: iris reads the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_dir():  # a submodule's gitlink
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target)
        count += 1
    return count


def _pop_fault(home: Path) -> str | None:
    path = home / "faults.json"
    with _flock(home / "faults.lock"):
        if not path.exists():
            return None
        queue = json.loads(path.read_text(encoding="utf-8") or "[]")
        if not queue:
            return None
        fault = queue.pop(0)
        _write_json(path, queue)
    if fault not in FAULTS:
        raise UsageError(f"{path}: unknown fault {fault!r} (use one of {', '.join(FAULTS)})")
    return None if fault == "ok" else fault


def _base_env(config: dict[str, Any]) -> dict[str, str]:
    return {**{k: os.environ[k] for k in _INHERITED if k in os.environ}, **config["env"]}


def cmd_run(home: Path, cluster: str | None, args: list[str]) -> int:
    if "--" not in args:
        raise UsageError("No command provided after --")
    split = args.index("--")
    opts, command = _run_parser().parse_args(args[:split]), args[split + 1 :]
    if not command:
        raise UsageError("No command provided after --")
    if command[0].startswith("-"):
        raise UsageError(f"Unknown option {command[0]!r}. Iris options must come before '--'.")
    if not cluster:
        raise UsageError("no cluster: pass --cluster=<name>")
    if not _NAME.match(opts.job_name):
        raise UsageError(f"--job-name {opts.job_name!r}: use letters, digits, '.', '_' and '-'")
    if not opts.enable_extra_resources:
        if _size_bytes(opts.memory, "--memory") >= 4e9:
            raise UsageError(f"--memory {opts.memory} (>= 4 GB) requires --enable-extra-resources.")
        if _size_bytes(opts.disk, "--disk") >= 10e9:
            raise UsageError(f"--disk {opts.disk} (>= 10 GB) requires --enable-extra-resources.")
    env: dict[str, str] = {}
    for key, value in opts.env:
        if "=" in key:
            hint = " ".join(key.split("=", 1))
            raise UsageError(f"Key cannot contain '=': {key}\nYou probably meant to do '-e {hint}'")
        env[key] = value

    config = _config(home)
    job_id = f"/{config['user']}/{opts.job_name}"
    jd = job_dir(home, job_id)
    old = _observe(jd)
    if old is not None:
        if old["state"] not in TERMINAL:
            print(f"Error: job {job_id} already exists and is {old['state']}; kill it or pick another --job-name",
                  file=sys.stderr)  # fmt: skip
            return 1
        # A finished job of the same name is replaced; its record is kept next to the others.
        archive = home / "archive" / jd.relative_to(home / "jobs")
        archive = archive.with_name(f"{archive.name}.{old['submitted_at_ms']}")
        archive.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(jd, archive)
    fault = _pop_fault(home)
    jd.mkdir(parents=True)
    print(f"Submitting job: {opts.job_name}", file=sys.stderr)
    files = _bundle(Path.cwd(), jd / "app", home)
    (jd / "log").touch()
    state = {
        "job_id": job_id,
        "name": opts.job_name,
        "cluster": cluster,
        "state": "pending",
        "exit_code": None,
        "error": None,
        "pending_reason": None,
        "submitted_at_ms": _now_ms(),
        "started_at_ms": None,
        "finished_at_ms": None,
        "task_image": opts.task_image,
        "resources": {"cpu": opts.cpu, "memory": opts.memory, "disk": opts.disk},
        "max_retries": opts.max_retries,
        "timeout_s": opts.timeout,
        "no_sync": opts.no_sync,
        "env_keys": list(env),  # names only: values may be secrets
        "command": command,
        "kind": "kaniko" if "BUILD_B64" in env else "command",
        "fault": fault,
        "bundle_files": files,
        "bundle_from": str(Path.cwd()),
        "worker_pgid": None,
    }
    _write_json(jd / "state.json", state)
    with open(jd / "worker.log", "ab") as worker_log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "sandbox.fake_iris", "--home", str(home), "_worker", job_id],
            cwd=jd,
            env={**_base_env(config), "PYTHONPATH": str(PROJECT_ROOT), _JOB_ENV: json.dumps(env)},
            stdin=subprocess.DEVNULL, stdout=worker_log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: `job kill` ends it and all it started
        )  # fmt: skip
    _transition(jd, worker_pgid=worker.pid)
    print(f"Job submitted: {job_id}", file=sys.stderr)
    print(job_id, flush=True)
    if opts.no_wait:
        return 0
    while (now := _observe(jd)) is not None and now["state"] not in TERMINAL:
        time.sleep(0.2)
    final = now["state"] if now else "vanished"
    print(f"Job completed with state: {final}", file=sys.stderr)
    return 0 if final == "succeeded" else 1


# ---- the worker ------------------------------------------------------------------------------


def _secrets_of(env: dict[str, str]) -> list[str]:
    return [v for k, v in env.items() if _SECRETISH.search(k) and v]


def _execute(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path, secrets: list[str],
             timeout_s: float | None) -> int | None:  # fmt: skip
    """Run `argv`, its output appended to `log` with secret values masked; the exit code, None on timeout."""
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        except OSError as exc:
            out.write(f"cannot run {shlex.join(argv)}: {exc}\n".encode())
            return 127

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(redact(line.decode("utf-8", "replace"), secrets).encode())
                out.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout_s or None)
        except subprocess.TimeoutExpired:
            return None
        reader.join(timeout=5)
        return code


def _worker(home: Path, job_id: str) -> int:
    jd = job_dir(home, job_id)
    env: dict[str, str] = json.loads(os.environ.pop(_JOB_ENV, "{}"))
    config = _config(home)
    delay = float(config["state_delay_s"])
    state = _read_state(jd)
    if state is None:
        return 1
    fault = state["fault"]
    print(f"worker {os.getpid()} for {job_id} ({state['kind']}, fault={fault})", flush=True)

    def step(name: str, **more: Any) -> bool:
        time.sleep(delay)
        return _transition(jd, state=name, **more)

    def finish(name: str, exit_code: int | None = None, error: str | None = None, **more: Any) -> int:
        _transition(jd, state=name, exit_code=exit_code, error=error, finished_at_ms=_now_ms(), **more)
        print(f"{job_id}: {name} (exit {exit_code}) {error or ''}", flush=True)
        return 0

    def timed_out() -> int:
        finish("failed", error=f"job exceeded its timeout of {state['timeout_s']}s (--timeout)")
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the job's processes with it; the state is written
        return 1

    res = state["resources"]
    if fault == "unschedulable":
        time.sleep(delay)
        reason = f"no worker can fit cpu={res['cpu']:g} memory={res['memory']} disk={res['disk']} (fault injected)"
        return finish("unschedulable", error=reason, pending_reason=reason)
    if not step("building", started_at_ms=_now_ms()):
        return 0
    if fault in ("oom", "fail", "vanish", "hang"):
        if not step("running"):
            return 0
        if fault == "oom":  # reaped: no last line, the log stays empty
            time.sleep(delay)
            return finish("killed", 137, "OOMKilled: the task exceeded its memory limit (fault injected)")
        if fault == "fail":
            return finish("failed", 1, "exit code 1 (fault injected)")
        if fault == "vanish":  # the controller forgets the job: summary and list no longer know it
            time.sleep(delay)
            gone = home / "vanished" / f"{jd.name}.{_now_ms()}"
            gone.parent.mkdir(parents=True, exist_ok=True)
            with _flock(jd / "lock"):
                shutil.move(jd, gone)
            return 0
        time.sleep(state["timeout_s"] or 7 * 24 * 3600)  # hang: until killed or the job's timeout
        return timed_out()

    secrets = _secrets_of(env)
    base = _base_env(config)
    log = jd / "log"
    if state["kind"] == "kaniko":
        if not step("running"):
            return 0
        try:
            script = base64.b64decode(env["BUILD_B64"], validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            with open(log, "a") as out:
                out.write("base64: invalid input\n")
            return finish("failed", 1, "exit code 1")
        (jd / "build.sh").write_text(script, encoding="utf-8")
        required = [(m["var"], m["msg"], script.count("\n", 0, m.start()) + 1) for m in _REQUIRED.finditer(script)]
        if not any(var == "GITSHA" for var, _, _ in required):
            required.insert(0, ("GITSHA", "", 1))  # the tag is named after it: mandatory whatever the script says
        for var, msg, line in required:
            if not env.get(var):
                with open(log, "a") as out:
                    out.write(f"/tmp/build.sh: line {line}: {var}: {msg or 'parameter null or not set'}\n")
                return finish("failed", 1, "exit code 1")
        builder = config["builder"]
        if not builder:
            message = ("this fake iris has no builder: kaniko cannot run on one machine; "
                       "install_fake_iris(root, builder=[...]) sets the command that stands in for it")  # fmt: skip
            with open(log, "a") as out:
                out.write(message + "\n")
            return finish("failed", 1, message)
        print(f"builder: {shlex.join(builder)}", flush=True)
        build_env = {**base, "PYTHONPATH": str(PROJECT_ROOT), **env, "APP_DIR": str(jd / "app")}
        code = _execute(builder, cwd=jd, env=build_env, log=log, secrets=secrets, timeout_s=state["timeout_s"])
    else:
        extra = {"TASK_IMAGE": state["task_image"], "APP_DIR": str(jd / "app")}
        hook = config["task_image_hook"]
        if hook:
            rootfs = jd / "rootfs"
            rootfs.mkdir(exist_ok=True)
            print(f"task image hook: {shlex.join(hook)}", flush=True)
            hook_env = {**base, "PYTHONPATH": str(PROJECT_ROOT),
                        "TASK_IMAGE": state["task_image"], "IMAGE_ROOT": str(rootfs)}  # fmt: skip
            hook_code = _execute(hook, cwd=jd, env=hook_env, log=jd / "worker.log", secrets=secrets, timeout_s=600)
            if hook_code != 0:
                return finish("failed", None, f"could not prepare task image {state['task_image']}: "
                                              f"task_image_hook exited {hook_code} (see worker.log)")  # fmt: skip
            extra["IMAGE_ROOT"] = str(rootfs)
        if not step("running"):
            return 0
        code = _execute(state["command"], cwd=jd, env={**base, **env, **extra}, log=log, secrets=secrets,
                        timeout_s=state["timeout_s"])  # fmt: skip
    if code is None:
        return timed_out()
    return finish("succeeded", 0) if code == 0 else finish("failed", code, f"exit code {code}")


# ---- summary, list, kill ---------------------------------------------------------------------


def _task(state: dict[str, Any]) -> dict[str, Any]:
    started, finished = state["started_at_ms"], state["finished_at_ms"]
    return {
        "task_id": f"{state['job_id']}/0",
        "index": "0",
        "state": state["state"],
        "exit_code": state["exit_code"] if state["state"] in TERMINAL else None,
        "duration_ms": ((finished or _now_ms()) - started) if started else None,
        "memory_mb": 0,
        "memory_peak_mb": 0,
        "cpu_millicores": 0,
        "disk_mb": 0,
        "worker_id": "fake-worker-0",
        "error": state["error"] or "",
    }


def _summary_json(state: dict[str, Any]) -> dict[str, Any]:
    """The shape of the real `job summary --json` (build_job_summary), plus finished_at (runbook §6)."""
    terminal = state["state"] in TERMINAL
    return {
        "job_id": state["job_id"],
        "name": state["job_id"],
        "state": state["state"],
        "exit_code": int(state["exit_code"] or 0),  # like the real one: an int, 0 until there is one
        "error": state["error"] or "",
        "failure_count": int(state["state"] in ("failed", "worker_failed")),
        "preemption_count": 0,
        "task_count": 1,
        "completed_count": int(terminal),
        "task_state_counts": {state["state"]: 1},
        "tasks": [_task(state)],
        "finished_at": _iso(state["finished_at_ms"]),
    }


def _list_json(state: dict[str, Any]) -> dict[str, Any]:
    """The shape of one real `job list --json` entry: MessageToDict of a JobStatus (defaults omitted)."""
    entry: dict[str, Any] = {
        "job_id": state["job_id"],
        "state": f"JOB_STATE_{state['state'].upper()}",
        "name": state["job_id"],
        "submitted_at": {"epoch_ms": str(state["submitted_at_ms"])},
        "task_count": 1,
    }
    if state["exit_code"]:
        entry["exit_code"] = state["exit_code"]
    if state["error"]:
        entry["error"] = state["error"]
    if state["pending_reason"]:
        entry["pending_reason"] = state["pending_reason"]
    for key in ("started_at", "finished_at"):
        if state[f"{key}_ms"]:
            entry[key] = {"epoch_ms": str(state[f"{key}_ms"])}
    if state["state"] in TERMINAL:
        entry["completed_count"] = 1
    return entry


def cmd_summary(home: Path, args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="iris job summary", add_help=False)
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true")
    opts = p.parse_args(args)
    state = _observe(job_dir(home, opts.job_id))
    if state is None:
        print(f"Error: job {opts.job_id} not found", file=sys.stderr)
        return 1
    summary = _summary_json(state)
    if opts.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"Job: {summary['job_id']}\nState: {summary['state']}  exit={summary['exit_code']}")
        if summary["error"]:
            print(f"Error: {summary['error']}")
    return 0


def cmd_list(home: Path, args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="iris job list", add_help=False)
    p.add_argument("--json", action="store_true")
    p.add_argument("--prefix")
    p.add_argument("--state")
    opts = p.parse_args(args)
    states = [s for s in _all_states(home) if not opts.prefix or s["job_id"].startswith(opts.prefix)]
    if opts.state:
        states = [s for s in states if s["state"] == opts.state.lower()]
    states.sort(key=lambda s: s["submitted_at_ms"], reverse=True)
    if opts.json:
        print(json.dumps([_list_json(s) for s in states], indent=2))
    elif not states:
        print("No jobs found.")
    else:
        for s in states:
            print(f"{s['job_id']}  {s['state']}  {_iso(s['submitted_at_ms'])}  {s['error'] or ''}".rstrip())
    return 0


def _kill(home: Path, job_id: str) -> bool | None:
    """Kill the job's process group and mark it killed: True; already finished: False; unknown: None."""
    jd = job_dir(home, job_id)
    if _read_state(jd) is None:
        return None
    with _flock(jd / "lock"):
        state = _read_state(jd)
        if state is None:
            return None
        if state["state"] in TERMINAL:
            return False
        if state["worker_pgid"] and _worker_alive(state["worker_pgid"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state["worker_pgid"], signal.SIGKILL)
        state.update(state="killed", error="terminated by user (iris job kill)", finished_at_ms=_now_ms())
        _write_json(jd / "state.json", state)
    return True


def cmd_kill(home: Path, args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="iris job kill", add_help=False)
    p.add_argument("job_id", nargs="+")
    p.add_argument("--include-children", action="store_true")
    p.add_argument("--no-include-children", action="store_true")
    opts = p.parse_args(args)
    terminated, code = [], 0
    for job_id in opts.job_id:
        outcome = _kill(home, job_id)
        if outcome is None:
            print(f"Error: job {job_id} not found", file=sys.stderr)
            code = 1
        elif outcome:
            terminated.append(job_id)
    if terminated:
        print("Terminated jobs:\n" + "\n".join(f"  {j}" for j in terminated))
    else:
        print("No running jobs matched.")
    return code


# ---- entry point -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    home: Path | None = None
    cluster: str | None = None
    try:
        while args and args[0].startswith("--"):
            flag = args.pop(0)
            name, eq, value = flag.partition("=")
            if name not in ("--home", "--cluster"):
                raise UsageError(f"No such option: {name}")
            if not eq:
                if not args:
                    raise UsageError(f"Option {name} requires an argument")
                value = args.pop(0)
            if name == "--home":
                home = Path(value).resolve()
            else:
                cluster = value
        if home is None:
            raise UsageError("--home DIR is required (the fake cluster's state directory)")
        if args[:1] == ["_worker"]:
            return _worker(home, args[1])
        if len(args) < 2 or args[0] != "job":
            raise UsageError("usage: iris [--cluster=C] job {run,summary,list,kill,stop} ...")
        (home / "jobs").mkdir(parents=True, exist_ok=True)
        command, rest = args[1], args[2:]
        if command == "run":
            return cmd_run(home, cluster, rest)
        if command == "summary":
            return cmd_summary(home, rest)
        if command == "list":
            return cmd_list(home, rest)
        if command in ("kill", "stop"):
            return cmd_kill(home, rest)
        raise UsageError(f"No such command {command!r}.")
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
