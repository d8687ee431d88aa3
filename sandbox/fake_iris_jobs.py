"""The sandbox iris's jobs: their records on disk, and the worker that runs one
(sandbox/fake_iris.py is the CLI).

A job lives in ``home/jobs/<user>/<name>/``: ``state.json`` (env recorded by NAME only), ``app/``
(the bundle, as iris makes it: ``git ls-files --cached --others --exclude-standard`` of the submit
dir), ``log`` (what the job printed, as the real iris keeps it: NOT masked — the real cluster does
not know what a secret is, which is why lockstep scans finished logs), ``worker.log`` (what the fake
did), and ``root/`` (the task's own filesystem for the paths the kaniko script uses: /tmp, /kaniko),
``home/`` and ``rootfs/``. Those three are the task's container: removed as the job ends, finished,
failed or killed (`drop_task_roots`), so the push login kaniko read does not outlive the job.

A kaniko build job (the runbook's ``echo "$BUILD_B64" | base64 -d > /tmp/build.sh && exec bash
/tmp/build.sh``) really runs the decoded script with bash, ``set -x`` and ``${VAR:?}`` guards and
all, on this machine. What the task image (ubuntu:22.04) would provide is stood in for: ``apt-get``,
``curl``, ``install`` and ``crane`` are no-op shims, ``tar`` extracts nothing from a fake crane
export, and ``/kaniko/executor`` is sandbox/fake_kaniko.py. The one change made to the script is
that its literal ``/tmp`` and ``/kaniko`` paths point into the job's ``root/``: two builds at once
must not share them. Those paths are quoted for where they stand
(sandbox/shell_place.py): the sandbox directory's name is data.
"""

from __future__ import annotations

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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandbox.shell_place import ShellPlaceError, replace_paths

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TERMINAL = frozenset({"succeeded", "failed", "killed", "worker_failed", "unschedulable"})
FAULTS = (
    "ok",
    "fail",
    "hang",
    "vanish",
    "unschedulable",
    "oom",
    "pending",
    "leak",
    "replace",
    "push_fail",
)
JOB_ENV = "_FAKE_IRIS_JOB_ENV"  # how `job run` hands the -e values to its worker without a file
# and the cluster's registry login, for pulling the task image only
PULL_ENV = "_FAKE_IRIS_PULL_ENV"
# The only variables a job inherits from whoever submitted it; everything else comes from -e,
# as on a real cluster (and the submitter's own tokens stay out of the job).
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*\Z")  # \Z: `$` also matches before a final newline
_DECODE_AND_EXEC = re.compile(r'echo "\$BUILD_B64" \| base64 -d > (\S+) && exec bash \1')

# What the ubuntu:22.04 task image provides, as far as the kaniko script uses it.
_SHIMS = {
    "apt-get": '#!/bin/sh\necho "(sandbox task image) apt-get $*: nothing to install"\n',
    "curl": '#!/bin/sh\n# (sandbox) downloads nothing: writes an empty file where -o says\nout=""\n'
    'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n[ -n "$out" ] && : > '
    '"$out"\nexit 0\n',
    "install": '#!/bin/sh\necho "(sandbox task image) install $*: skipped"\n',
    "crane": "#!/bin/sh\n# (sandbox) `crane export IMAGE -` streams an empty tar: the executor "
    "is sandbox/fake_kaniko.py\n"
    'if [ "$1" = "export" ]; then echo "(sandbox) crane export $2" >&2; head -c 10240 /dev/zero; '
    "exit 0; fi\n"
    'echo "crane (sandbox): only export is simulated" >&2; exit 1\n',
    "tar": "#!/bin/sh\n# (sandbox) the crane download and the executor overlay are not real tar "
    "files\n"
    'case "$*" in *crane.tgz*) : > crane; chmod +x crane; exit 0;; *"-xf -"*) cat >/dev/null; '
    "exit 0;; esac\n"
    'exec /bin/tar "$@"\n',
}


class JobGone(Exception):
    """The job's directory went away (vanished, or replaced) while someone was looking."""


def write_json(path: Path, data: Any) -> None:
    """Atomically: a reader (or a kill mid-write) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def now_ms() -> int:
    return int(time.time() * 1000)


def job_dir(home: Path, job_id: str) -> Path:
    """Where job `job_id` (``/<user>/<name>``) lives under `home`; ValueError for anything else."""
    parts = job_id.strip("/").split("/")
    if not job_id.startswith("/") or len(parts) < 2 or not all(NAME.match(p) for p in parts):
        raise ValueError(f"{job_id!r} is not a job id (/<user>/<name>)")
    return Path(home) / "jobs" / Path(*parts)


def read_state(jd: Path) -> dict[str, Any] | None:
    try:
        return json.loads((jd / "state.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None


def transition(jd: Path, **changes: Any) -> bool:
    """Apply `changes` unless the job already ended (e.g. was cancelled meanwhile); False then."""
    if not jd.exists():
        return False
    with flock(jd / "lock"):
        state = read_state(jd)
        if state is None or state["state"] in TERMINAL:
            return False
        state.update(changes)
        write_json(jd / "state.json", state)
        return True


def worker_alive(pid: int) -> bool:
    """Is `pid` still our worker? Not if it is gone, a zombie, or (after a reboot) someone else."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and b"sandbox.fake_iris" in (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False


def observe(jd: Path) -> dict[str, Any] | None:
    """The job's state as the controller reports it: a worker that died mid-job is WORKER_FAILED."""
    state = read_state(jd)
    if (
        state
        and state["state"] not in TERMINAL
        and state["worker_pgid"]
        and not worker_alive(state["worker_pgid"])
    ):
        if transition(
            jd,
            state="worker_failed",
            finished_at_ms=now_ms(),
            error="the worker process died without reporting (see worker.log)",
        ):
            drop_task_roots(jd)
        state = read_state(jd)
    return state


def all_states(home: Path) -> list[dict[str, Any]]:
    return [
        s for path in sorted((home / "jobs").glob("**/state.json")) if (s := observe(path.parent))
    ]


def terminate(home: Path, job_id: str, *, how: str) -> bool | None:
    """End the job's process group and mark it killed:
    True; already finished: False; unknown: None."""
    jd = job_dir(home, job_id)
    if read_state(jd) is None:
        return None
    with flock(jd / "lock"):
        state = read_state(jd)
        if state is None:
            return None
        if state["state"] in TERMINAL:
            return False
        if state["worker_pgid"] and worker_alive(state["worker_pgid"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state["worker_pgid"], signal.SIGKILL)
        state.update(state="killed", error=f"terminated by user ({how})", finished_at_ms=now_ms())
        write_json(jd / "state.json", state)
        drop_task_roots(jd)
    return True


def archive_path(home: Path, jd: Path, submitted_at_ms: int) -> Path:
    """Where a replaced job's record is kept: beside the others, named by its submit time."""
    archive = home / "archive" / jd.relative_to(home / "jobs")
    archive = archive.with_name(f"{archive.name}.{submitted_at_ms}")
    archive.parent.mkdir(parents=True, exist_ok=True)
    return archive


def text_table(rows: list[list[str]], *, right_first: bool = False) -> list[str]:
    """tabulate's "plain" layout, as iris prints its
    tables (the first column right-aligned, if asked)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i == 0 and right_first else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]


def stop_all(home: Path) -> list[str]:
    """Kill every job that has not finished (for test and demo teardown); return their ids."""
    ids = [st["job_id"] for st in all_states(Path(home)) if st["state"] not in TERMINAL]
    for job_id in ids:
        terminate(Path(home), job_id, how="sandbox teardown")
    return ids


# ---- faults ----------------------------------------------------------------------------------


def queue_fault(home: Path, fault: str) -> None:
    """Make the next submitted job (after those already queued) misbehave: one of FAULTS."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: use one of {', '.join(FAULTS)}")
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with flock(home / "faults.lock"):
        path = home / "faults.json"
        queue = json.loads(path.read_text(encoding="utf-8") or "[]") if path.exists() else []
        write_json(path, [*queue, fault])


def pop_fault(home: Path) -> str | None:
    path = home / "faults.json"
    with flock(home / "faults.lock"):
        if not path.exists():
            return None
        queue = json.loads(path.read_text(encoding="utf-8") or "[]")
        if not queue:
            return None
        fault = queue.pop(0)
        write_json(path, queue)
    if fault not in FAULTS:
        raise ValueError(f"{path}: unknown fault {fault!r} (use one of {', '.join(FAULTS)})")
    return None if fault == "ok" else fault


# ---- the bundle ------------------------------------------------------------------------------


def _git_files(src: Path) -> list[str] | None:
    """What iris bundles from a git workspace (working-tree
    content, .gitignore respected); None if not git."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=120,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


def bundle(src: Path, dest: Path, home: Path) -> int:
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


# ---- the worker ------------------------------------------------------------------------------


def _execute(
    argv: list[str], *, cwd: Path, env: dict[str, str], log: Path, timeout_s: float | None
) -> int | None:
    """Run `argv` with its output appended to `log` as it comes; the exit code, None on timeout."""
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
                out.write(line)
                out.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout_s or None)
        except subprocess.TimeoutExpired:
            return None
        reader.join(timeout=5)
        return code


def _task_root(jd: Path, config: dict[str, Any]) -> Path:
    """The task's own /tmp, /kaniko and the shims of ubuntu:22.04 the kaniko script calls."""
    root = jd / "root"
    shims = root / "shims"
    for d in (root / "tmp", root / "kaniko", shims):
        d.mkdir(parents=True, exist_ok=True)
    for name, text in _SHIMS.items():
        (shims / name).write_text(text, encoding="utf-8")
        (shims / name).chmod(0o755)
    executor = root / "kaniko" / "executor"
    kaniko = config.get("kaniko")
    if kaniko:
        argv = " ".join(shlex.quote(a) for a in kaniko)
        executor.write_text(
            f"#!/bin/sh\n# the sandbox's kaniko executor (sandbox/fake_kaniko.py)\n"
            f'PYTHONPATH={shlex.quote(str(PROJECT_ROOT))} exec {argv} "$@"\n'
        )
    else:
        executor.write_text("#!/bin/sh\necho 'this sandbox iris has no kaniko stand-in "
                            "(install_fake_iris(root, kaniko=[...]))' >&2\nexit 1\n")  # fmt: skip
    executor.chmod(0o755)
    return root


_TASK_PATHS = re.compile(r"(?<![\w./-])/(kaniko|tmp)(?=[/\s\"']|$)", flags=re.MULTILINE)


def _in_task_root(script: str, root: Path) -> str:
    """The script with its literal /tmp and /kaniko paths moved into the job's own root (one pass).

    The root is under the sandbox directory, whose name may hold shell syntax: each path is quoted
    for where it stands (sandbox/shell_place.py), so the name stays data.
    """
    return replace_paths(script, _TASK_PATHS, lambda m: str(root / m.group(1)))


def drop_task_roots(jd: Path) -> None:
    """Remove what the task had on its own disk: /tmp and /kaniko (the push login in
    .docker/config.json), its HOME and the task image's unpacked root. A real job's container is
    gone when it ends, and its secrets with it; the job's record (state.json, log) stays."""
    for part in ("root", "home", "rootfs"):
        shutil.rmtree(jd / part, ignore_errors=True)


def run_worker(home: Path, job_id: str, config: dict[str, Any]) -> int:
    jd = job_dir(home, job_id)
    env: dict[str, str] = json.loads(os.environ.pop(JOB_ENV, "{}"))
    pull: dict[str, str] = json.loads(os.environ.pop(PULL_ENV, "{}"))
    delay = float(config["state_delay_s"])
    state = read_state(jd)
    if state is None:
        return 1
    fault = state["fault"]
    print(f"worker {os.getpid()} for {job_id} ({state['kind']}, fault={fault})", flush=True)

    def step(name: str, **more: Any) -> bool:
        time.sleep(delay)
        return transition(jd, state=name, **more)

    def finish(
        name: str, exit_code: int | None = None, error: str | None = None, **more: Any
    ) -> int:
        transition(
            jd, state=name, exit_code=exit_code, error=error, finished_at_ms=now_ms(), **more
        )
        drop_task_roots(jd)
        print(f"{job_id}: {name} (exit {exit_code}) {error or ''}", flush=True)
        if fault == "replace":  # someone submits a job of the same name soon after this one ends
            time.sleep(max(delay, 0.5))
            _replace(home, jd)
        return 0

    def timed_out() -> int:
        finish("failed", 1, f"job exceeded its timeout of {state['timeout_s']}s (--timeout)")
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the job's processes with it; the state is written
        return 1

    res = state["resources"]
    if fault in ("unschedulable", "pending"):
        reason = (
            f"no worker can fit cpu={res['cpu']:g} memory={res['memory']} disk={res['disk']} "
            "(fault injected)"
        )
        transition(jd, pending_reason=reason, task_diagnostic=f"Pending: {reason}")
        if fault == "pending":
            time.sleep(state["timeout_s"] or 7 * 24 * 3600)
            return timed_out()
        time.sleep(delay)
        return finish("unschedulable", None, reason)
    if not step("building", started_at_ms=now_ms()):
        return 0
    if fault in ("oom", "fail", "vanish", "hang"):
        if not step("running"):
            return 0
        # reaped: no last line; on the Kubernetes backend an OOM is an application failure
        if fault == "oom":
            time.sleep(delay)
            return finish(
                "failed", 137, "OOMKilled: the container exceeded its memory limit (fault injected)"
            )
        if fault == "fail":
            return finish("failed", 1, "Exit code 1 (fault injected)")
        if fault == "vanish":  # the controller forgets the job: describe and list no longer know it
            time.sleep(delay)
            gone = home / "vanished" / f"{jd.name}.{now_ms()}"
            gone.parent.mkdir(parents=True, exist_ok=True)
            with flock(jd / "lock"):
                shutil.move(jd, gone)
            return 0
        # hang: until cancelled or the job's timeout
        time.sleep(state["timeout_s"] or 7 * 24 * 3600)
        return timed_out()

    base = {**{k: os.environ[k] for k in INHERITED if k in os.environ}, **config["env"]}
    # The task's HOME is its own, as in a container: not the submitter's (whose login files may
    # run anything, e.g. a `pyenv rehash` that waits a minute on another shell's lock).
    (jd / "home").mkdir(exist_ok=True)
    base["HOME"] = str(jd / "home")
    log = jd / "log"
    command = list(state["command"])
    extra = {"TASK_IMAGE": state["task_image"] or "", "APP_DIR": str(jd / "app")}
    if fault == "leak":  # a script that traces its token: the value lands in the job log
        with open(log, "a") as out:
            out.writelines(f"+ : {value}\n" for key, value in env.items() if "TOKEN" in key)
    decoded = (
        len(command) == 3
        and command[:2] == ["bash", "-lc"]
        and _DECODE_AND_EXEC.fullmatch(command[2])
    )
    if decoded and "BUILD_B64" in env:
        root = _task_root(jd, config)
        if fault == "push_fail":  # the script runs, writes its login, and kaniko's push is refused
            (root / "kaniko" / "executor").write_text(
                "#!/bin/sh\necho 'error pushing image: UNAUTHORIZED (fault injected)' >&2\nexit 1\n"
            )
        try:
            script = base64.b64decode(env["BUILD_B64"], validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            with open(log, "a") as out:
                out.write("base64: invalid input\n")
            return finish("failed", 1, "Exit code 1")
        try:
            if ":" in str(root):  # PATH cannot name a directory whose path holds its separator
                raise ShellPlaceError(f"{root} holds ':', so its shims cannot be put on PATH")
            placed = _in_task_root(script, root)
        except ShellPlaceError as exc:
            with open(log, "a") as out:
                out.write(f"sandbox iris: cannot run the script in this job's root: {exc}\n")
            return finish("failed", 1, f"sandbox iris: {exc}")
        (root / "tmp" / "build.sh").write_text(placed, encoding="utf-8")
        extra["PATH"] = f"{root / 'shims'}:{base.get('PATH', os.defpath)}"
        command = ["bash", str(root / "tmp" / "build.sh")]
        cwd = jd / "app"
    else:
        hook = config["task_image_hook"]
        if hook:
            rootfs = jd / "rootfs"
            rootfs.mkdir(exist_ok=True)
            print(f"task image hook: {shlex.join(hook)}", flush=True)
            hook_env = {
                **base,
                **pull,
                "PYTHONPATH": str(PROJECT_ROOT),
                "TASK_IMAGE": state["task_image"] or "",
                "IMAGE_ROOT": str(rootfs),
            }
            hook_code = _execute(hook, cwd=jd, env=hook_env, log=jd / "worker.log", timeout_s=600)
            if hook_code != 0:
                return finish(
                    "failed",
                    None,
                    f"could not prepare task image {state['task_image']}: "
                    f"task_image_hook exited {hook_code} (see worker.log)",
                )
            extra["IMAGE_ROOT"] = str(rootfs)
        cwd = jd
    if not step("running"):
        return 0
    code = _execute(
        command, cwd=cwd, env={**base, **env, **extra}, log=log, timeout_s=state["timeout_s"]
    )
    if code is None:
        return timed_out()
    return finish("succeeded", 0) if code == 0 else finish("failed", code, f"Exit code {code}")


def _replace(home: Path, jd: Path) -> None:
    """Another submission of the same name: the finished
    job's record is archived, a new one starts."""
    with flock(jd / "lock"):
        old = read_state(jd)
        if old is None:
            return
        shutil.copytree(jd, archive_path(home, jd, old["submitted_at_ms"]), dirs_exist_ok=True)
        write_json(jd / "state.json", {**old, "state": "running", "exit_code": None, "error": None,
                                       "submitted_at_ms": now_ms() + 1000, "finished_at_ms": None,
                                       "fault": None, "worker_pgid": None})  # fmt: skip
