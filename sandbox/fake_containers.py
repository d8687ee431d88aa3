"""The sandbox docker's containers: `docker run -d` and what follows a detached container, on one node.

The docker CLI subset lockstep uses to boot a rev on the lane (contract: the docker CLI reference,
docker 28 — `docker run`, `ps`, `logs`, `inspect`, `stop`, `rm`; messages and exit codes as the CLI
prints them):

    docker run -d [--name N] [--rm] [-p H:C] [--network host] [-v SRC:DST[:ro]] [--gpus all] [-e K=V]
               [--label K=V] [--ipc host] IMAGE ARGV...            -> the container ID; 125 on a name conflict
    docker ps [-a] [-q] [--filter name=N] [--format TEMPLATE]
    docker logs [--tail N] [-t|--timestamps] NAME                 (stdout lines to stdout, stderr to stderr)
    docker inspect NAME | docker container inspect [--format T] NAME   (.State.Status/.ExitCode, .Image, .Config.Image, .Name)
    docker stop [-t S] NAME... | docker rm [-f] NAME...

A container is ``<state>/containers/<id>/``: ``config.json`` (what `run` was asked), ``state.json``
(written atomically by whoever changes it) and ``log.jsonl`` (docker's json-file log driver: one
``{"log", "stream", "time"}`` object per line). It is a real detached process: `run -d` starts a
supervisor in its own session (the sandbox's containerd-shim) that runs the container's command,
records its output line by line and its exit code (128+N for a signal, as docker reports it).

What a container runs: ``python``/``python3`` ARGS on the image's installed packages (as `docker run`
does today), and the served model for ``vllm serve MODEL ...``: the simulated model server
(`sandbox/model_server.py`) on the image's rootfs, bound to 127.0.0.1 at ``--port`` (or the ``-p``
host port mapped to it). ``vllm serve ... --headless`` is a multi-node worker: it binds nothing and
waits for SIGTERM. Only the GPU is simulated: its JIT kernels are the bind mounts (``-v``). When every
mount source already holds files the start is warm (short delays), otherwise cold (longer, scaled
down from the runbook's ~9 and ~45 minutes), and a server that reached startup fills its mounts.
The node's ``home/.sandbox-serve.json`` (`set_serve_knobs`) changes the delays or makes the engine
crash (``fault = "exit"``) or never get ready (``fault = "hang"``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

# In the node's home: {"fault": "exit"|"hang", "image": ID, "cold_s": [kv, startup], "warm_s": [kv, startup]}.
SERVE_KNOBS = ".sandbox-serve.json"
COLD_S = (1.5, 0.5)  # seconds to the KV-cache line, then to application startup: ~45 min scaled down
WARM_S = (0.2, 0.1)  # ~9 min scaled down
STOP_TIMEOUT_S = 10  # `docker stop`'s default grace period
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")  # docker's container name rule
_NEVER = "0001-01-01T00:00:00Z"


class ContainerError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _err(message: str, code: int = 1) -> NoReturn:
    raise ContainerError(message, code)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ").replace("Z", "000Z")


def _parse_time(text: str) -> float:
    return datetime.strptime(text[:26] + "Z", "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


# ---- the containers of one node ----------------------------------------------------------------


class Containers:
    """``<state>/containers/``: find by name or ID prefix, read and change one container's state."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.root = state / "containers"
        self.root.mkdir(parents=True, exist_ok=True)

    def ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "config.json").is_file())

    def config(self, cid: str) -> dict[str, Any]:
        return json.loads((self.root / cid / "config.json").read_text(encoding="utf-8"))

    def status(self, cid: str) -> dict[str, Any]:
        state = json.loads((self.root / cid / "state.json").read_text(encoding="utf-8"))
        if state["Status"] == "running" and not _alive(state.get("ShimPid", 0)):
            # Its shim is gone without recording an exit (killed with the node): docker shows it exited.
            state.update(Status="exited", Running=False, Pid=0, ExitCode=137, FinishedAt=_now())
        return state

    def set_status(self, cid: str, **changes: Any) -> None:
        path = self.root / cid / "state.json"
        state = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        state.update(changes)
        _write_json(path, state)

    def find(self, ref: str) -> str | None:
        """A container ID for a name (with or without its leading /), a full ID or a unique ID prefix."""
        name = ref.removeprefix("/")
        ids = self.ids()
        for cid in ids:
            if self.config(cid)["Name"] == f"/{name}":
                return cid
        hits = [cid for cid in ids if re.fullmatch(r"[0-9a-f]{1,64}", ref) and cid.startswith(ref)]
        return hits[0] if len(hits) == 1 else None

    def log_path(self, cid: str) -> Path:
        return self.root / cid / "log.jsonl"


# ---- run -d ------------------------------------------------------------------------------------

_VALUED = {"--name", "-p", "--publish", "--network", "--net", "-v", "--volume", "--gpus", "-e", "--env", "--label",
           "-l", "--ipc", "--shm-size", "--ulimit", "--restart", "-w", "--workdir", "--platform", "--runtime"}
_BARE = {"-d", "--detach", "--rm", "-i", "-t", "-it", "-ti", "--init", "--privileged", "-dit"}


def parse_run(argv: list[str]) -> tuple[dict[str, Any], str, list[str]]:
    """`docker run`'s options up to IMAGE; returns (options, image reference, the container's argv)."""
    opts: dict[str, Any] = {"name": None, "rm": False, "ports": [], "network": "bridge", "binds": [], "env": {},
                            "labels": {}, "detach": False, "gpus": None}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag, eq, inline = argv[i].partition("=")
        if flag in _BARE and not eq:
            opts["detach"] |= flag in ("-d", "--detach", "-dit")
            opts["rm"] |= flag == "--rm"
            i += 1
            continue
        if flag not in _VALUED:
            _err(f"docker: unknown flag: {flag}\n\nRun 'docker run --help' for more information", 125)
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            _err(f"docker: flag needs an argument: {flag}\n\nRun 'docker run --help' for more information", 125)
        if flag == "--name":
            if not _NAME.match(value):
                _err(f'docker: Error response from daemon: Invalid container name ({value}), only '
                     '[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed.', 125)
            opts["name"] = value
        elif flag in ("-p", "--publish"):
            m = re.fullmatch(r"(?:[\d.]+:)?(\d+):(\d+)(?:/tcp)?", value)
            if not m:
                _err(f'docker: invalid containerPort: {value}', 125)
            opts["ports"].append((int(m.group(1)), int(m.group(2))))
        elif flag in ("--network", "--net"):
            opts["network"] = value
        elif flag in ("-v", "--volume"):
            src, _, rest = value.partition(":")
            dst = rest.split(":")[0]
            if not src.startswith("/") or not dst.startswith("/"):
                _err(f'docker: Error response from daemon: create {src}: "{src}" includes invalid characters for a '
                     'local volume name, only "[a-zA-Z0-9][a-zA-Z0-9_.-]" are allowed. If you intended to pass a host '
                     'directory, use absolute path.', 125)
            opts["binds"].append(value)
        elif flag in ("-e", "--env"):
            key, has, val = value.partition("=")
            if has:
                opts["env"][key] = val
            elif key in os.environ:
                opts["env"][key] = os.environ[key]
        elif flag in ("--label", "-l"):
            key, _, val = value.partition("=")
            opts["labels"][key] = val
        elif flag == "--gpus":
            opts["gpus"] = value
    if i >= len(argv):
        _err('docker: "docker run" requires at least 1 argument.\nSee \'docker run --help\'.', 125)
    return opts, argv[i], argv[i + 1:]


def _program(command: list[str]) -> str:
    return Path(command[0]).name if command else ""


def _runnable(command: list[str]) -> bool:
    exe = _program(command)
    return bool(re.fullmatch(r"python(3(\.\d+)?)?", exe)) or (exe == "vllm" and command[1:2] == ["serve"])


def run_detached(store: Any, argv: list[str], *, resolve_image: Any, site_packages: str) -> int:
    """`docker run -d`: create the container, start its shim, print its ID once it runs."""
    opts, ref, command = parse_run(argv)
    image_id = resolve_image(ref)
    config_doc = store.config(image_id)
    image_config = config_doc.get("config", {})
    if not command:
        command = list(image_config.get("Cmd") or [])
    containers = Containers(store.root)
    cid = secrets.token_hex(32)
    name = opts["name"] or f"sandbox_{cid[:8]}"
    with store.locked():
        taken = containers.find(name)
        if taken is not None:
            _err(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use by '
                 f'container "{taken}". You have to remove (or rename) that container to be able to reuse that '
                 "name.\n\nRun 'docker run --help' for more information", 125)
        cdir = containers.root / cid
        cdir.mkdir()
        labels = {**(image_config.get("Labels") or {}), **opts["labels"]}
        mounts = []
        for bind in opts["binds"]:
            src, dst, *mode = bind.split(":")
            Path(src).mkdir(parents=True, exist_ok=True)  # docker creates a missing bind source
            mounts.append({"Type": "bind", "Source": src, "Destination": dst, "Mode": mode[0] if mode else "",
                           "RW": "ro" not in mode, "Propagation": "rprivate"})
        _write_json(cdir / "config.json", {
            "Id": cid, "Name": f"/{name}", "Created": _now(), "Image": image_id, "Path": command[0] if command else "",
            "Args": command[1:], "AutoRemove": opts["rm"],
            "Config": {"Hostname": cid[:12], "Image": ref, "Cmd": command, "Labels": labels,
                       "Env": [*image_config.get("Env", []), *(f"{k}={v}" for k, v in opts["env"].items())]},
            "HostConfig": {"NetworkMode": opts["network"], "Binds": opts["binds"], "AutoRemove": opts["rm"],
                           "PortBindings": {f"{c}/tcp": [{"HostIp": "", "HostPort": str(h)}] for h, c in opts["ports"]},
                           "DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}] if opts["gpus"] else None},
            "Mounts": mounts, "Rootfs": str(store.rootfs(image_id)), "SitePackages": str(store.rootfs(image_id) / site_packages),
        })
        containers.set_status(cid, Status="created", Running=False, Paused=False, Restarting=False, OOMKilled=False,
                              Dead=False, Pid=0, ShimPid=0, ExitCode=0, Error="", StartedAt=_NEVER, FinishedAt=_NEVER)
    if not _runnable(command):
        shown = command[0] if command else ""
        message = (f'failed to create task for container: failed to create shim task: OCI runtime create failed: '
                   f'runc create failed: unable to start container process: exec: "{shown}": executable file not '
                   "found in $PATH: unknown")
        containers.set_status(cid, ExitCode=127, Error=message)
        _err(f"docker: Error response from daemon: {message}.", 127)
    home = store.root.parent / "home"
    shim = subprocess.Popen(
        [sys.executable, "-m", "sandbox.fake_containers", "--shim", str(store.root), cid, str(home)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and containers.status(cid)["Status"] == "created" and shim.poll() is None:
        time.sleep(0.02)
    if containers.status(cid)["Status"] == "created":
        _err("docker: Error response from daemon: the container's shim did not start", 125)
    print(cid)
    return 0


# ---- the shim: one container's process, its log and its exit code ------------------------------


def set_serve_knobs(node: Path, *, fault: str | None = None, image: str | None = None,
                    cold_s: tuple[float, float] | None = None, warm_s: tuple[float, float] | None = None) -> Path:
    """Make the node's served model crash at start (`fault="exit"`), never get ready (`"hang"`) — only
    for image ID `image` when given — or take other delays. All None: back to normal."""
    knobs = {k: v for k, v in (("fault", fault), ("image", image), ("cold_s", cold_s), ("warm_s", warm_s))
             if v is not None}
    return write_knobs(node / "home" / SERVE_KNOBS, knobs)


def write_knobs(path: Path, knobs: dict[str, Any]) -> Path:
    """A sandbox node's knobs file: written when any knob is set, removed when none is (back to normal)."""
    if knobs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(knobs) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return path


def _option(argv: list[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _warm(mounts: list[dict[str, Any]]) -> bool:
    return bool(mounts) and all(any(Path(m["Source"]).iterdir()) for m in mounts if Path(m["Source"]).is_dir())


_CRASH = (
    "import sys, time\n"
    "print('INFO [api_server.py] vLLM API server version ' + sys.argv[1], flush=True)\n"
    "time.sleep(0.2)\n"
    "print('ERROR [core.py] EngineCore failed to start.', flush=True)\n"
    "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 119.70 GiB of which 1.12 GiB is free.', file=sys.stderr, flush=True)\n"
    "sys.exit(1)\n"
)
_JIT_DONE = ("Application startup complete", "JIT kernels ready")  # after these lines a start fills its caches
_WORKER = (
    "import signal, sys, threading\n"
    "stop = threading.Event()\n"
    "signal.signal(signal.SIGTERM, lambda *a: stop.set())\n"
    "print(f'INFO [multiproc_executor.py] headless worker, node rank {sys.argv[1]}: waiting for the head', flush=True)\n"
    "if not stop.wait(float(sys.argv[2])):\n"
    "    print('INFO [gpu_worker.py] JIT kernels ready', flush=True)\n"
    "stop.wait()\n"
)


def container_argv(config: dict[str, Any], knobs: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """What the shim runs for a container's command, and the extra environment."""
    command = config["Config"]["Cmd"]
    env = dict(e.split("=", 1) for e in config["Config"]["Env"])
    if _program(command) != "vllm":
        env.update({"PYTHONPATH": config["SitePackages"], "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
        return [sys.executable, "-S", *command[1:]], env
    args = command[2:]
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    if knobs.get("image") not in (None, config["Image"]):
        knobs = {k: v for k, v in knobs.items() if k != "fault"}  # the fault is another image's
    kv_s, startup_s = knobs.get("warm_s", WARM_S) if _warm(config["Mounts"]) else knobs.get("cold_s", COLD_S)
    if "--headless" in args:
        return [sys.executable, "-c", _WORKER, _option(args, "--node-rank") or "1", str(kv_s)], env
    if knobs.get("fault") == "exit":
        return [sys.executable, "-c", _CRASH, "0.0.0"], env
    port = int(_option(args, "--port") or 8000)
    bound = {c: h for h, c in ((int(v[0]["HostPort"]), int(k.split("/")[0]))
                               for k, v in config["HostConfig"]["PortBindings"].items())}
    model = _option(args, "--served-model-name") or (args[0] if args and not args[0].startswith("-") else "model")
    if knobs.get("fault") == "hang":
        kv_s = 3600.0
    return [sys.executable, "-m", "sandbox.model_server", "--rootfs", config["Rootfs"], "--host", "127.0.0.1",
            "--port", str(bound.get(port, port)), "--served-model-name", model,
            "--kv-after-s", str(kv_s), "--startup-after-s", str(startup_s)], env


def _fill_jit_caches(config: dict[str, Any]) -> None:
    for mount in config["Mounts"]:
        if mount["RW"]:
            kernels = Path(mount["Source"]) / "sm121a"
            kernels.mkdir(parents=True, exist_ok=True)
            (kernels / f"flashinfer_jit_{config['Image'][7:19]}.so").write_bytes(b"\x7fELF sandbox jit kernel\n")


def shim(state: Path, cid: str, home: Path) -> int:
    containers = Containers(state)
    config = containers.config(cid)
    knobs_path = home / SERVE_KNOBS
    knobs = json.loads(knobs_path.read_text(encoding="utf-8")) if knobs_path.is_file() else {}
    argv, env = container_argv(config, knobs)
    log = containers.log_path(cid).open("a", encoding="utf-8")
    lock = threading.Lock()

    def pump(stream: Any, name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            with lock:
                log.write(json.dumps({"log": line if line.endswith("\n") else line + "\n", "stream": name,
                                      "time": _now()}) + "\n")
                log.flush()
            if any(done in line for done in _JIT_DONE):
                _fill_jit_caches(config)

    with tempfile.TemporaryDirectory(prefix="container-") as tmp:
        env.update({"HOME": tmp, "HOSTNAME": cid[:12]})
        child = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        containers.set_status(cid, Status="running", Running=True, Pid=child.pid, ShimPid=os.getpid(), StartedAt=_now())
        pumps = [threading.Thread(target=pump, args=(s, n), daemon=True)
                 for s, n in ((child.stdout, "stdout"), (child.stderr, "stderr"))]
        for t in pumps:
            t.start()
        # A node directory removed under a running container (a test's tmp dir cleaned up): stop with it.
        def orphaned() -> None:
            while child.poll() is None:
                if not (state / "containers" / cid).is_dir():
                    child.kill()
                    return
                time.sleep(1.0)

        threading.Thread(target=orphaned, daemon=True).start()
        code = child.wait()
        for t in pumps:
            t.join(5)
    log.close()
    if not (state / "containers" / cid).is_dir():
        return 0
    containers.set_status(cid, Status="exited", Running=False, Pid=0, ExitCode=128 - code if code < 0 else code,
                          FinishedAt=_now())
    if config["AutoRemove"]:
        _remove(containers, cid)
    return 0


# ---- ps, logs, inspect, stop, rm -----------------------------------------------------------------


def _remove(containers: Containers, cid: str) -> None:
    shutil.rmtree(containers.root / cid, ignore_errors=True)


def inspect_doc(containers: Containers, cid: str) -> dict[str, Any]:
    config = containers.config(cid)
    state = {k: v for k, v in containers.status(cid).items() if k != "ShimPid"}
    return {"Id": cid, "Created": config["Created"], "Path": config["Path"], "Args": config["Args"], "State": state,
            "Image": config["Image"], "Name": config["Name"], "RestartCount": 0, "Driver": "overlay2",
            "HostConfig": config["HostConfig"], "Mounts": config["Mounts"], "Config": config["Config"]}


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return "Less than a second" if seconds < 1 else f"{seconds} seconds"
    return f"{seconds // 60} minutes" if seconds < 3600 else f"{seconds // 3600} hours"


def ps_row(containers: Containers, cid: str) -> dict[str, str]:
    config, state = containers.config(cid), containers.status(cid)
    now = time.time()
    if state["Status"] == "running":
        status = f"Up {_ago(now - _parse_time(state['StartedAt']))}"
    elif state["Status"] == "exited":
        status = f"Exited ({state['ExitCode']}) {_ago(now - _parse_time(state['FinishedAt']))} ago"
    else:
        status = "Created"
    command = " ".join(config["Config"]["Cmd"])
    return {"ID": cid[:12], "Image": config["Config"]["Image"], "Command": json.dumps(command[:17] + "…" if len(command) > 20 else command, ensure_ascii=False),
            "CreatedAt": config["Created"], "RunningFor": f"{_ago(now - _parse_time(config['Created']))} ago", "Status": status, "State": state["Status"], "Names": config["Name"][1:],
            "Ports": ", ".join(f"0.0.0.0:{v[0]['HostPort']}->{k}" for k, v in config["HostConfig"]["PortBindings"].items())}


def ps(containers: Containers, argv: list[str], render: Any) -> int:
    show_all = quiet = False
    fmt, filters = None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-a", "--all"):
            show_all, i = True, i + 1
        elif a in ("-q", "--quiet"):
            quiet, i = True, i + 1
        elif a in ("--filter", "-f", "--format") and i + 1 < len(argv):
            (filters.append(argv[i + 1]) if a != "--format" else None)
            fmt = argv[i + 1] if a == "--format" else fmt
            i += 2
        elif a.startswith(("--filter=", "--format=")):
            key, value = a.split("=", 1)
            (filters.append(value) if key == "--filter" else None)
            fmt = value if key == "--format" else fmt
            i += 1
        else:
            _err(f"unknown flag: {a}\nSee 'docker ps --help'.", 125)
    rows = []
    for cid in sorted(containers.ids(), key=lambda c: containers.config(c)["Created"], reverse=True):
        row = ps_row(containers, cid)
        if not show_all and row["State"] != "running":
            continue
        keep = True
        for f in filters:
            key, _, value = f.partition("=")
            if key == "name":
                keep &= re.search(value, "/" + row["Names"]) is not None or re.search(value, row["Names"]) is not None
            elif key == "status":
                keep &= row["State"] == value
            else:
                _err(f'Error response from daemon: invalid filter \'{key}\'')
        if keep:
            rows.append(row)
    if quiet:
        print("".join(r["ID"] + "\n" for r in rows), end="")
    elif fmt is not None:
        print("".join(render(fmt, r) + "\n" for r in rows), end="")
    else:
        cols = ["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"]
        table = [cols] + [[r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], r["Ports"], r["Names"]] for r in rows]
        widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
        for t in table:
            print("   ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
    return 0


def _one(containers: Containers, ref: str) -> str:
    cid = containers.find(ref)
    if cid is None:
        _err(f"Error response from daemon: No such container: {ref}")
    return cid


def logs(containers: Containers, argv: list[str]) -> int:
    tail, stamps, refs = None, False, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-t", "--timestamps"):
            stamps, i = True, i + 1
        elif a in ("-n", "--tail") and i + 1 < len(argv):
            tail, i = argv[i + 1], i + 2
        elif a.startswith(("--tail=", "-n=")):
            tail, i = a.split("=", 1)[1], i + 1
        elif a in ("-f", "--follow"):
            _err("the sandbox docker does not follow logs (-f): poll `docker logs` instead", 125)
        else:
            refs.append(a)
            i += 1
    if len(refs) != 1:
        _err('"docker logs" requires exactly 1 argument.\nSee \'docker logs --help\'.')
    cid = _one(containers, refs[0])
    path = containers.log_path(cid)
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
    if tail not in (None, "all"):
        if not str(tail).isdigit():
            _err(f'invalid value "{tail}" for flag --tail: strconv.Atoi: parsing "{tail}": invalid syntax')
        entries = entries[len(entries) - int(tail):] if int(tail) else []
    for entry in entries:
        out = sys.stdout if entry["stream"] == "stdout" else sys.stderr
        out.write((entry["time"] + " " if stamps else "") + entry["log"])
        out.flush()
    return 0


def stop(containers: Containers, argv: list[str]) -> int:
    timeout, refs = STOP_TIMEOUT_S, []
    i = 0
    while i < len(argv):
        if argv[i] in ("-t", "--time", "--timeout") and i + 1 < len(argv):
            timeout, i = int(argv[i + 1]), i + 2
        else:
            refs.append(argv[i])
            i += 1
    if not refs:
        _err('"docker stop" requires at least 1 argument.\nSee \'docker stop --help\'.')

    def stop_it(cid: str) -> bool:
        stop_one(containers, cid, timeout)
        return True

    return _each(containers, refs, stop_it)


def _each(containers: Containers, refs: list[str], act: Callable[[str], bool]) -> int:
    """docker's loop over named containers: each found one is acted on and echoed when `act` succeeds;
    an unknown one is said on stderr; the exit is 1 if any failed."""
    code = 0
    for ref in refs:
        cid = containers.find(ref)
        if cid is None:
            print(f"Error response from daemon: No such container: {ref}", file=sys.stderr)
            code = 1
        elif act(cid):
            print(ref)
        else:
            code = 1
    return code


def stop_one(containers: Containers, cid: str, timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds (as `docker stop -t`); the exit is recorded."""
    state = containers.status(cid)
    if state["Status"] != "running":
        return
    shim_pid = state["ShimPid"]
    with contextlib.suppress(ProcessLookupError):
        os.kill(shim_pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(shim_pid):
        time.sleep(0.05)
    if _alive(shim_pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shim_pid, signal.SIGKILL)
        containers.set_status(cid, Status="exited", Running=False, Pid=0, ExitCode=137, FinishedAt=_now())


def rm(containers: Containers, argv: list[str]) -> int:
    force = any(a in ("-f", "--force") for a in argv)
    refs = [a for a in argv if not a.startswith("-")]
    if not refs:
        _err('"docker rm" requires at least 1 argument.\nSee \'docker rm --help\'.')

    def remove(cid: str) -> bool:
        if containers.status(cid)["Status"] == "running":
            if not force:
                print(f'Error response from daemon: cannot remove container "{containers.config(cid)["Name"]}": '
                      "container is running: stop the container before removing or force remove", file=sys.stderr)
                return False
            stop_one(containers, cid, 0)
        _remove(containers, cid)
        return True

    return _each(containers, refs, remove)


def stop_sandbox_containers(sandbox_root: Path) -> None:
    """`stop_all` on every node of a sandbox (``<root>/nodes/*/docker``)."""
    for state in sorted((sandbox_root / "nodes").glob("*/docker")):
        if (state / "containers").is_dir():
            stop_all(state)


def stop_all(state: Path) -> None:
    """Kill every running container of a node's docker state (test teardown: by the PIDs recorded)."""
    containers = Containers(state)
    for cid in containers.ids():
        with contextlib.suppress(FileNotFoundError):
            stop_one(containers, cid, 2)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--shim":
        sys.exit(shim(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])))
    print("usage: python -m sandbox.fake_containers --shim STATE ID HOME (started by `docker run -d`)", file=sys.stderr)
    sys.exit(125)
