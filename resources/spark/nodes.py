"""SparkNodes, the resource: the node inventory and the commands lockstep runs on it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from resources.errors import LockstepError
from resources.secrets import redact_argv
from resources.site.schema import SiteConfig
from resources.site.spark import SparkNode
from resources.spark.results import (
    ConnectionLost,
    DetachedHandle,
    DetachedState,
    PipeEnd,
    PipeFailed,
    PipeResult,
    PutResult,
    RunResult,
    SparkError,
    Unreachable,
    _short,
)
from resources.spark.transfer import (
    _MANIFEST_PY,
    _TAIL,
    _Drain,
    _Feeder,
    _first_difference,
    _pipe_failure,
    _TarSink,
    local_manifest,
)
from resources.spark.transports import (
    _WINDOW,
    TransportSettings,
    _Closed,
    _LocalStream,
    _LocalTransport,
    _Lost,
    _NotStarted,
    _script,
    _SshTransport,
    _Stream,
    _Transport,
)

# Idempotent reads (poll, tail, manifest) retry on a
# dropped connection this often, with these pauses.
_READ_PAUSES = (0.0, 1.0, 3.0)


# ---- the resource --------------------------------------------------------------------------------


class SparkNodes(dg.ConfigurableResource):
    """The DGX Spark nodes a site names, and the commands lockstep runs on them.

    Build it from the site file with `spark_for(site)`. Every call names a node; every command is
    an argv list, quoted for the remote shell, never spliced into a string. Every call has a
    timeout. Secret values (the key's passphrase, the variables in `redact_env`) never appear in a
    log line, an error or a result.
    """

    nodes: list[dict[str, Any]] = Field(description="[[spark.nodes]] entries (SparkNode fields).")
    known_hosts: str = Field(
        default="~/.ssh/known_hosts", description="Host keys to verify against; never written."
    )
    key_path: str | None = Field(
        default=None, description="Private key file; none: the ssh agent and ~/.ssh keys."
    )
    passphrase_env: str | None = Field(
        default=None, description="NAME of the env var with the key's passphrase."
    )
    passphrase: str | None = Field(
        default=None,
        description="The passphrase, as a dg.EnvVar of passphrase_env when wired in Definitions; "
        "unset: read $passphrase_env when the key is loaded.",
    )
    connect_timeout_s: float = Field(default=15.0, gt=0)
    command_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Default timeout of `run`; for bulk streams, the longest stall allowed.",
    )
    keepalive_s: int = Field(default=30, ge=0, description="SSH keepalive interval (0: none).")
    # default=[] (pydantic copies it per instance): default_factory=list would have pydantic call
    # inspect.signature(list), which compiles tokenize's
    # regexes at import (~3 ms per location load).
    redact_env: list[str] = Field(
        default=[],
        description="Names of more env vars whose values are masked in everything said here.",
    )

    _transports: dict[str, _Transport] = PrivateAttr(default_factory=dict)
    _settings_cache: list[TransportSettings] = PrivateAttr(default_factory=list)

    @field_validator("nodes", mode="before")
    @classmethod
    def _valid_nodes(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        nodes = [
            SparkNode.model_validate(n.model_dump() if isinstance(n, SparkNode) else n)
            for n in value
        ]
        names = [n.name for n in nodes]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"node names must be unique; {', '.join(dupes)} appear more than once")
        for n in nodes:
            if n.transport == "ssh" and not n.host:
                raise ValueError(f"node {n.name}: an ssh node needs a host")
            if n.transport == "local" and not n.root:
                raise ValueError(f"node {n.name}: a local node needs a root directory")
        # Dagster config maps refuse None values
        return [n.model_dump(exclude_none=True) for n in nodes]

    # -- plumbing --

    def _settings(self) -> TransportSettings:
        """The transports' settings from this resource's fields; one object (and one decrypted key)
        while they stay the same. A model_copy shares the private cache but may differ in value."""
        fresh = TransportSettings(
            known_hosts=self.known_hosts,
            key_path=self.key_path,
            passphrase_env=self.passphrase_env,
            passphrase=self.passphrase,
            redact_env=tuple(self.redact_env),
            connect_timeout_s=self.connect_timeout_s,
            keepalive_s=self.keepalive_s,
        )
        if self._settings_cache and self._settings_cache[0] == fresh:
            return self._settings_cache[0]
        self._settings_cache = [fresh]
        return fresh

    def _secrets(self) -> list[str]:
        return self._settings().secrets()

    def _say(self, text: str) -> str:
        return self._settings().say(text)

    def node(self, name: str) -> SparkNode:
        """The inventory entry of node `name`."""
        for raw in self.nodes:
            if raw["name"] == name:
                return SparkNode.model_validate(raw)
        known = ", ".join(n["name"] for n in self.nodes) or "none"
        raise SparkError(
            f"no [[spark.nodes]] entry named {name!r} (the site has: {known}); add it to the "
            "site file"
        )

    def names(self, role: str | None = None) -> list[str]:
        """Node names, optionally only those with `role` ("build" or "lane")."""
        return [n["name"] for n in self.nodes if role is None or role in n.get("roles", [])]

    def _transport(self, name: str) -> _Transport:
        settings = self._settings()
        cached = self._transports.get(name)
        # A model_copy shares the private cache with its original; its settings may differ.
        if cached is None or cached.settings is not settings:
            spec = self.node(name)
            cached = (
                _LocalTransport(spec, settings)
                if spec.transport == "local"
                else _SshTransport(spec, settings)
            )
            self._transports = {**self._transports, name: cached}
        return cached

    def _open(
        self, node: str, script: str, *, timeout_s: float | None, bulk: bool = False
    ) -> tuple[_Transport, _Stream]:
        """Start a script; a connection found dead before anything was sent is replaced once."""
        transport = self._transport(node)
        try:
            return transport, transport.open(script, timeout_s=timeout_s, bulk=bulk)
        except _NotStarted:
            try:
                return transport, transport.open(script, timeout_s=timeout_s, bulk=bulk)
            except _NotStarted as exc:
                raise Unreachable(
                    self._say(
                        f"the connection keeps dropping before a command can start ({exc}); is "
                        "the node up?"
                    ),
                    node=node,
                    where=transport.where,
                ) from None

    def close(self) -> None:
        """Close every cached connection (they are reopened when needed)."""
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    # -- commands --

    def run(
        self,
        *,
        node: str,
        argv: list[str],
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """Run `argv` on `node` to its end and return its exit code and output (a non-zero exit is
        a result, not an error: use `.check()`).

        `cwd` and `env` apply on the node (a relative `cwd` is relative to the login directory for
        ssh, to the node's root for local). Raises SparkError when the node cannot be reached, when
        the command outlives `timeout_s` (default command_timeout_s), or when the connection drops
        while it runs (it may or may not have finished then: check before running it again).
        """
        argv = [str(a) for a in argv]
        script = self._checked_script(node, argv, cwd=cwd, env=env)
        limit = timeout_s if timeout_s is not None else self.command_timeout_s
        shown = redact_argv(argv, self._secrets())
        dg.get_dagster_logger().debug(f"spark {node}: {shlex.join(shown)}")
        started = time.monotonic()
        transport, stream = self._open(node, script, timeout_s=None)
        try:
            out = _Drain(stream.read)
            err = _Drain(stream.read_stderr)
            feeder = threading.Thread(target=self._feed, args=(stream, stdin), daemon=True)
            feeder.start()
            deadline = started + limit
            try:
                code = stream.wait(max(0.0, deadline - time.monotonic()))
            except _Lost:
                raise ConnectionLost(
                    self._say(
                        f"the connection dropped while `{_short(shown)}` ran; it may or may not "
                        "have "
                        "finished there — check on the node before running it again"
                    ),
                    node=node,
                    where=transport.where,
                ) from None
            if code is None:
                stream.abort()
                what = (
                    "it was killed"
                    if isinstance(stream, _LocalStream)
                    else ("the channel was closed; the command may still be running on the node")
                )
                raise SparkError(
                    self._say(
                        f"`{_short(shown)}` did not finish within {limit:g}s; {what}. "
                        "Give it a longer timeout_s, or start it with start_detached and poll it"
                    ),
                    node=node,
                    where=transport.where,
                )
            stdout = out.result(max(1.0, deadline - time.monotonic()))
            stderr = err.result(1.0)
        finally:
            stream.close()
        return RunResult(
            node=node,
            where=transport.where,
            argv=shown,
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            duration_s=round(time.monotonic() - started, 3),
        )

    @staticmethod
    def _feed(stream: _Stream, data: bytes | None) -> None:
        with contextlib.suppress(_Closed, TimeoutError):
            if data:
                stream.write(data)
        stream.close_stdin()

    def _checked_script(
        self, node: str, argv: list[str], *, cwd: str | None, env: dict[str, str] | None
    ) -> str:
        try:
            return _script(argv, cwd=cwd, env=env)
        except ValueError as exc:
            raise SparkError(str(exc), node=node) from None

    def _read(self, *, node: str, argv: list[str], timeout_s: float | None = None) -> RunResult:
        """`run` for an idempotent read: a dropped
        connection is reconnected and the read repeated."""
        last: SparkError | None = None
        for pause in _READ_PAUSES:
            time.sleep(pause)
            try:
                return self.run(node=node, argv=argv, timeout_s=timeout_s)
            except (ConnectionLost, Unreachable) as exc:
                last = exc  # the network blinked or the node is coming back: try again shortly
            self._transport(node).close()
        assert last is not None
        raise last

    def start_detached(
        self,
        *,
        node: str,
        argv: list[str],
        log: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> DetachedHandle:
        """Start `argv` on `node` so it outlives this connection and this process; return its pid.

        Runs ``setsid nohup sh -c '<argv>; echo $? > <exit file>' > <log> 2>&1 < /dev/null &``
        (the exit file is ``<log>.exit``, written atomically when the command ends), every part
        quoted. Follow it with `poll` (state) and `tail` (log lines for metadata only).
        """
        argv = [str(a) for a in argv]
        body = self._checked_script(node, argv, cwd=cwd, env=env)
        tag = f"lockstep-{uuid.uuid4().hex[:16]}"
        exit_file = f"{log}.exit"
        # The command may `cd` (cwd): the exit file is
        # addressed by an absolute path fixed before it starts.
        inner = (
            f': {tag}; {body}; echo $? > "$LOCKSTEP_EXIT_FILE.{tag}" && mv -f '
            f'"$LOCKSTEP_EXIT_FILE.{tag}" "$LOCKSTEP_EXIT_FILE"'
        )
        outer = (
            f"rm -f {shlex.quote(exit_file)} || exit 1; "
            f'mkdir -p -- "$(dirname -- {shlex.quote(log)})" || exit 1; '
            f'LOCKSTEP_EXIT_FILE="$(cd -- "$(dirname -- {shlex.quote(exit_file)})" && '
            f'pwd)/$(basename -- {shlex.quote(exit_file)})" '
            f"|| exit 1; export LOCKSTEP_EXIT_FILE; "
            f"setsid nohup sh -c {shlex.quote(inner)} > {shlex.quote(log)} 2>&1 < /dev/null & "
            "echo $!"
        )
        shown = redact_argv(argv, self._secrets())
        dg.get_dagster_logger().info(f"spark {node}: detached `{shlex.join(shown)}`, log {log}")
        started_at = datetime.now(UTC)
        transport, stream = self._open(node, outer, timeout_s=None)
        try:
            stream.close_stdin()
            out = _Drain(stream.read)
            err = _Drain(stream.read_stderr)
            try:
                code = stream.wait(self.command_timeout_s)
            except _Lost:
                code = None
            stdout, stderr = out.result(5.0), err.result(1.0)
        finally:
            stream.close()
        pid_text = stdout.decode("utf-8", "replace").strip()
        if code != 0 or not pid_text.isdigit():
            raise SparkError(
                self._say(
                    f"could not start `{_short(shown)}` detached (exit {code}): "
                    f"{(stderr or stdout).decode('utf-8', 'replace').strip()[-2000:] or 'no output'}"  # noqa: E501
                ),
                node=node,
                where=transport.where,
            )
        return DetachedHandle(
            node=node,
            pid=int(pid_text),
            log=log,
            exit_file=exit_file,
            started_at=started_at,
            tag=tag,
        )

    # A process counts as ours while it lives AND its command line carries the handle's tag: a pid
    # recycled by another process (or a zombie, whose cmdline is empty) is not our command.
    _POLL = (
        'if [ -s "$2" ]; then echo "exited $(cat "$2")"; '
        'elif kill -0 "$1" 2>/dev/null && { [ ! -d /proc/self ] || tr "\\000" "\\n" < '
        '"/proc/$1/cmdline" '
        '| grep -qF -- "$3"; }; then echo running; '
        'elif [ -s "$2" ]; then echo "exited $(cat "$2")"; '
        "else echo vanished; fi"
    )

    def poll(self, *, handle: DetachedHandle) -> DetachedState:
        """The state of a detached command: running (its pid is alive and is ours), exited (with the
        code from its exit file), or vanished (gone without
        an exit file: killed, or the node rebooted).

        Never reads the log. A dropped connection is reconnected and the poll repeated.
        """
        result = self._read(
            node=handle.node,
            argv=[
                "sh",
                "-c",
                self._POLL,
                "lockstep-poll",
                str(handle.pid),
                handle.exit_file,
                handle.tag,
            ],
        )
        words = result.text().split()
        if result.exit_code != 0 or not words:
            raise SparkError(
                self._say(f"cannot tell the state of pid {handle.pid}: {result.describe()}"),
                node=handle.node,
                where=result.where,
            )
        if words[0] == "exited":
            if len(words) == 2 and words[1].lstrip("-").isdigit():
                return DetachedState(state="exited", exit_code=int(words[1]))
            raise SparkError(
                f"exit file {handle.exit_file} holds {' '.join(words[1:])!r}, not an exit code",
                node=handle.node,
                where=result.where,
            )
        if words[0] in ("running", "vanished"):
            return DetachedState(state=words[0])  # type: ignore[arg-type]
        raise SparkError(
            f"unexpected poll answer {result.text()!r}", node=handle.node, where=result.where
        )

    def tail(self, *, handle: DetachedHandle, lines: int = 40) -> str:
        """The last `lines` lines of a detached command's log, secrets masked — for metadata only;
        its state comes from `poll`."""
        result = self._read(
            node=handle.node, argv=["tail", "-n", str(int(lines)), "--", handle.log]
        )
        return self._say((result.stdout or result.stderr).decode("utf-8", "replace"))

    def put_tree(self, *, node: str, local_dir: Path, remote_dir: str) -> PutResult:
        """Copy a local directory tree into `remote_dir`
        on `node` as ONE tar stream, then verify it.

        Both sides compute a manifest (sha256 of every file, sizes, owner-exec bits, symlink
        targets, directories; sorted by path) — the node with `python3` — and must agree; otherwise
        SparkError names the first differing path. `remote_dir` is created if missing; files
        already there that the tree does not have count as differences (use a fresh directory).
        """
        import tarfile

        local = Path(local_dir)
        if not local.is_dir():
            raise SparkError(f"put_tree: {local} is not a directory", node=node)
        started = time.monotonic()
        manifest = local_manifest(local)
        extract = shlex.join(["mkdir", "-p", "--", remote_dir]) + " && " + shlex.join(
            ["tar", "-x", "-f", "-", "--no-same-owner", "-C", remote_dir])  # fmt: skip
        dg.get_dagster_logger().info(
            f"spark {node}: put {local} -> {remote_dir} ({len(manifest)} entries)"
        )
        transport, stream = self._open(node, extract, timeout_s=self.command_timeout_s, bulk=True)
        try:
            err = _Drain(stream.read_stderr, keep=_TAIL)
            out = _Drain(stream.read, keep=_TAIL)
            sink = _TarSink(stream)
            failure: str | None = None
            try:
                with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    for line in manifest:
                        rel = json.loads(line)[0]
                        info = tar.gettarinfo(str(local / rel), arcname=rel)
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        if info.isreg():
                            with open(local / rel, "rb") as f:
                                tar.addfile(info, f)
                        else:
                            tar.addfile(info)
                sink.flush()
            except _Closed:
                failure = "tar on the node stopped reading"
            except TimeoutError:
                failure = f"the stream stalled for {self.command_timeout_s:g}s"
            stream.close_stdin()
            try:
                code = stream.wait(self.command_timeout_s)
            except _Lost:
                code = None
            stderr = err.result(5.0) or out.result(1.0)
        finally:
            stream.close()
        if failure or code != 0:
            raise SparkError(
                self._say(f"put_tree into {remote_dir} failed ({failure or f'tar exit {code}'}): "
                          f"{stderr.decode('utf-8', 'replace').strip()[-2000:] or 'no output'}"),
                node=node, where=transport.where,
            )  # fmt: skip
        remote = self._read(node=node, argv=["python3", "-c", _MANIFEST_PY, remote_dir])
        if remote.exit_code != 0:
            raise SparkError(
                self._say(
                    f"cannot list {remote_dir} to verify the copy (needs python3 on the node): "
                    f"{remote.describe()}\n{remote.stderr.decode('utf-8', 'replace')[-2000:]}"
                ),
                node=node,
                where=transport.where,
            )
        remote_lines = remote.text().splitlines()
        if difference := _first_difference(manifest, remote_lines):
            raise SparkError(f"put_tree into {remote_dir} did not arrive identical: {difference}",
                             node=node, where=transport.where)  # fmt: skip
        files = [json.loads(line) for line in manifest]
        return PutResult(
            node=node,
            remote_dir=remote_dir,
            files=sum(1 for e in files if e[1] == "file"),
            bytes=sum(e[3] for e in files if e[1] == "file"),
            sha256=hashlib.sha256("".join(line + "\n" for line in manifest).encode()).hexdigest(),
            duration_s=round(time.monotonic() - started, 3),
        )

    def pipe(
        self,
        *,
        src: str,
        src_argv: list[str],
        dsts: list[str],
        dst_argv: list[str],
        progress: Callable[[int], object] | None = None,
    ) -> PipeResult:
        """Stream `src_argv`'s stdout on node `src` into `dst_argv`'s stdin on every node in `dsts`,
        in parallel: each chunk is read once and handed to one writer thread per destination through
        a bounded queue, so the slowest destination sets the pace (backpressure) and nothing is
        buffered without bound. This is ``docker save IMG | ssh dst docker load`` for a whole lane.

        Returns per side: exit code, bytes, sha256 of exactly the bytes it was sent (the producer's:
        of what it produced). Raises PipeFailed (with `.result`) naming the node and exit code when
        the producer exits non-zero or with no output, or any destination fails or got less than all
        of it. A stall longer than command_timeout_s on either side aborts the whole stream.

        `progress` is told the bytes read from the producer so far after every chunk (a heartbeat).
        """
        if not dsts:
            raise SparkError("pipe needs at least one destination node", node=src)
        if len(set(dsts)) != len(dsts):
            raise SparkError(f"pipe destinations repeat a node: {', '.join(dsts)}", node=src)
        src_script = self._checked_script(src, [str(a) for a in src_argv], cwd=None, env=None)
        dst_script = self._checked_script(dsts[0], [str(a) for a in dst_argv], cwd=None, env=None)
        secrets = self._secrets()
        shown = (
            f"{shlex.join(redact_argv(src_argv, secrets))} | "
            f"{shlex.join(redact_argv(dst_argv, secrets))}"
        )
        dg.get_dagster_logger().info(f"spark pipe {src} -> {', '.join(dsts)}: {shown}")
        stall = self.command_timeout_s
        started = time.monotonic()
        opened: list[_Stream] = []
        feeders: list[tuple[str, _Transport, _Feeder, _Drain, _Drain]] = []
        try:
            # Destinations first: the producer should not
            # start before its output has somewhere to go.
            for dst in dsts:
                transport, stream = self._open(dst, dst_script, timeout_s=stall, bulk=True)
                opened.append(stream)
                feeder = _Feeder(stream)
                feeders.append((dst, transport, feeder, _Drain(stream.read, keep=_TAIL),
                                _Drain(stream.read_stderr, keep=_TAIL)))  # fmt: skip
            src_transport, producer = self._open(src, src_script, timeout_s=stall, bulk=True)
            opened.append(producer)
            producer.close_stdin()
            src_err = _Drain(producer.read_stderr, keep=_TAIL)
            src_sha = hashlib.sha256()
            total = 0
            src_error: str | None = None
            while True:
                try:
                    # all that has arrived: paramiko's buffer is cheapest emptied
                    chunk = producer.read(_WINDOW)
                except TimeoutError:
                    src_error = f"no output for {stall:g}s (command_timeout_s); stream aborted"
                    producer.abort()
                    break
                if not chunk:
                    break
                src_sha.update(chunk)
                digest_after = src_sha.copy()
                total += len(chunk)
                live = [f for _, _, f, _, _ in feeders if f.error is None]
                if not live:
                    src_error = "every destination failed; producer stopped"
                    producer.abort()
                    break
                for feeder in live:
                    feeder.queue.put((chunk, digest_after))
                if progress is not None:
                    progress(total)
            for _, _, feeder, _, _ in feeders:
                feeder.finish()
            try:
                src_code = producer.wait(stall) if src_error is None else None
            except _Lost:
                src_code, src_error = None, "the connection dropped before it exited"
            src_end = PipeEnd(node=src, exit_code=src_code, bytes=total, sha256=src_sha.hexdigest(),
                              stderr=src_err.result(5.0), error=src_error)  # fmt: skip
            ends: list[PipeEnd] = []
            for dst, _, feeder, out, err in feeders:
                feeder.join(stall)
                error = feeder.error
                try:
                    code = feeder.stream.wait(stall)
                    if code is None:
                        error = error or f"did not exit within {stall:g}s of its stdin closing"
                except _Lost:
                    code, error = None, error or "the connection dropped before it exited"
                ends.append(
                    PipeEnd(
                        node=dst,
                        exit_code=code,
                        bytes=feeder.sent,
                        sha256=feeder.sha.hexdigest(),
                        stdout=out.result(5.0),
                        stderr=err.result(1.0),
                        error=error,
                    )
                )
        finally:
            for stream in opened:
                stream.close()
            for _, _, feeder, _, _ in feeders:
                feeder.finish()
        result = PipeResult(src=src_end, dsts=ends, duration_s=round(time.monotonic() - started, 3))
        if not result.ok:
            node, where, message = _pipe_failure(
                result, src_transport.where, {d: t.where for d, t, *_ in feeders}
            )
            raise PipeFailed(
                self._say(f"{shown}: {message}"), node=node, where=where, result=result
            )
        return result

    def relay(
        self,
        *,
        src: str,
        src_argv: list[str],
        chain: list[str],
        load_argv: list[str],
        progress: Callable[[int], object] | None = None,
    ) -> Any:
        """Stream `src_argv`'s stdout on node `src` along `chain`: lockstep sends it to ``chain[0]``
        only, and every node tees it into its own `load_argv` and into its own OpenSSH client to the
        next node, with the key and known_hosts the site names for that hop
        (``relay_key``/``relay_known_hosts`` of the sending node's [[spark.nodes]] entry;
        resources/spark/relay.py). One copy crosses each link.

        Every hop's connection is opened first, all at once; a hop that cannot connect (an unknown
        host key, a refused key) fails the relay before a byte is sent. Returns a RelayResult (the
        producer, what the head was sent, each node's load exit code, each hop's). Raises
        RelayFailed naming the hop or node at fault and which nodes got the stream.
        """
        from resources.spark.relay import run_relay

        return run_relay(
            self, src=src, src_argv=src_argv, chain=chain, load_argv=load_argv, progress=progress
        )


def spark_for(site: SiteConfig, *, env_vars: bool = False) -> SparkNodes:
    """The SparkNodes a site file describes: its [spark] table, with `root` of local nodes, the
    known_hosts file and the key path resolved against the site file's directory.

    `env_vars`: the passphrase as ``dg.EnvVar`` (for
    Definitions); otherwise read when the key loads.
    """
    section = site.spark
    if section is None:
        raise LockstepError(
            f"{site.path}: no [spark] table; add one with the nodes (see [[spark.nodes]])"
        )
    nodes = []
    for node in section.nodes:
        data = node.model_dump(exclude_none=True)
        if node.transport == "local" and node.root:
            data["root"] = str(site.resolve_path(node.root))
        nodes.append(data)
    return SparkNodes(
        nodes=nodes,
        known_hosts=str(site.resolve_path(section.known_hosts)),
        key_path=str(site.resolve_path(section.key_path)) if section.key_path else None,
        passphrase_env=section.passphrase_env,
        passphrase=dg.EnvVar(section.passphrase_env)
        if env_vars and section.passphrase_env
        else None,
        connect_timeout_s=section.connect_timeout_s,
        command_timeout_s=section.command_timeout_s,
        keepalive_s=section.keepalive_s,
        redact_env=[name for name in site.secret_env_names() if name != section.passphrase_env],
    )
