"""A relay chain through the lane: lockstep streams to the first node only, and each node tees what
arrives into its own load command and into its OWN OpenSSH client to the next node.

On a lane behind a shared uplink, a star (one stream per node from lockstep) puts N copies on the
source's link; a chain puts one there and one on each node-to-node link, so the time to N nodes
stays close to the time to one (bench/lane_fanout_bench.py measures it).

Trust stays the site's: a hop from node X to node Y runs on X as
``ssh -F none -o BatchMode=yes -o StrictHostKeyChecking=yes -o
UserKnownHostsFile=<X.relay_known_hosts> -o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -i
<X.relay_key> ...``: only the known_hosts file the site names for that hop decides whether Y is Y
(never the node's own ssh config, its global known_hosts or an agent), and an unknown host key fails
the hop instead of being added.

Before the stream, lockstep opens every hop's connection at once: on each sending node an OpenSSH
control master (same options) in a fresh 0700 directory, `/tmp/lockstep-relay-<token>-<node>`. A hop
that cannot connect fails the relay before a byte is sent; otherwise the stream's hops are sessions
on those connections, so a chain starts in about one connection's time, not one per hop. The
stream's hop keeps the same options, so should a
master be gone, it connects anew under the same trust.

Every word of every node's script is `shlex.quote`d. The next node's script travels as base64 inside
the hop's remote command (``sh -c "$(printf %s B64 | base64 -d)"``), because quoting a quoted script
once per hop grows it fourfold per hop, and base64 only by a third.

Each node reports on its stdout, which flows back up the chain to lockstep, one tab-separated line
per fact: ``lockstep-relay load NODE EXIT``, ``lockstep-relay hop NODE NEXT EXIT`` and, for a hop
that failed, ``lockstep-relay err NODE LINE`` (the tail of its ssh's stderr). The load command's own
stdout goes to stderr, so nothing it prints can be read as a report.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import shlex
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from resources.secrets import redact_argv
from resources.spark.results import PipeEnd, PipeFailed, SparkError

MARK = "lockstep-relay"
# What a failed hop reports of its ssh's stderr.
_ERR_LINES = 20
# The same preference as lockstep's own connections (transports._CIPHERS): AES-GCM is the cheapest
# on nodes with AES instructions; every entry has been in OpenSSH since 6.5.
_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr"
# The key exchange of lockstep's own paramiko connection to the head (so a hop is no weaker than the
# first link). OpenSSH 9's default, sntrup761x25519, cost 0.4
# s more per connection in bench/lane_fanout_bench.py.
_KEX = "curve25519-sha256,curve25519-sha256@libssh.org"


class RelayHop(BaseModel):
    """How node `src` forwards to node `dst`: `src`'s key
    and known_hosts (paths on `src`), `dst`'s address."""

    src: str
    dst: str
    host: str
    port: int
    user: str = ""
    key: str
    known_hosts: str

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.port}"

    def describe(self) -> str:
        return (
            f"hop {self.src} -> {self.dst} ({self.src}'s ssh to {self.where}, key {self.key}, "
            f"known_hosts {self.known_hosts})"
        )


def relay_site_rule(
    nodes: Sequence[Any], chain: Sequence[str]
) -> tuple[tuple[str | int, ...], str] | None:
    """Why the [[spark.nodes]] cannot carry a relay along
    `chain` (the key to fix, relative to [spark], and
    what to do), or None: the first of `relay_site_problems`."""
    return next(iter(relay_site_problems(nodes, chain)), None)


def relay_site_problems(
    nodes: Sequence[Any], chain: Sequence[str]
) -> list[tuple[tuple[str | int, ...], str]]:
    """Every reason the [[spark.nodes]] cannot carry a relay along `chain`, each as (the key to fix,
    relative to [spark], what to do). Every node but the last
    forwards, so it needs relay_key and relay_known_hosts;
    every node but the first is reached by a node's ssh, so it needs to be an ssh node."""
    index = {n.name: i for i, n in enumerate(nodes)}
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for position, name in enumerate(chain):
        if name not in index:
            continue  # the lane's own rule names an unknown node
        i = index[name]
        node = nodes[i]
        if position + 1 < len(chain):
            for key in ("relay_key", "relay_known_hosts"):
                if getattr(node, key) is None:
                    problems.append(
                        (
                            ("nodes", i, key),
                            (
                                f"node {name!r} forwards the relay to {chain[position + 1]!r} "
                                '([jovian] distribute = "relay") '
                                f"and has no {key}: set it to the absolute path ON {name} of the "
                                + (
                                    "private key it uses for that hop"
                                    if key == "relay_key"
                                    else "known_hosts file that holds the next node's host key"
                                )
                            ),
                        )
                    )
        if position > 0 and node.transport != "ssh":
            problems.append(
                (
                    ("nodes", i, "transport"),
                    (
                        f"node {name!r} is a {node.transport} node, but in a relay "
                        f"{chain[position - 1]!r} reaches it with "
                        'ssh: relay between ssh nodes, or set [jovian] distribute = "star"'
                    ),
                )
            )
    return problems


def relay_hops(nodes: Sequence[Any], *, chain: Sequence[str]) -> list[RelayHop]:
    """The hops of `chain` from the node entries (SparkNode),
    refused with SparkError when one is missing."""
    if refused := relay_site_rule(nodes, chain):
        node = nodes[refused[0][1]]
        raise SparkError(f"{refused[1]} (in its [[spark.nodes]] entry)", node=node.name)
    by_name = {n.name: n for n in nodes}
    hops = []
    for src, dst in itertools.pairwise(chain):
        a, b = by_name[src], by_name[dst]
        hops.append(
            RelayHop(
                src=src,
                dst=dst,
                host=b.relay_host or b.host,
                port=b.port,
                user=b.user,
                key=a.relay_key,
                known_hosts=a.relay_known_hosts,
            )
        )
    return hops


def rendezvous_dir(token: str, node: str) -> str:
    """Where sending node `node` keeps its hop's control
    socket and fifo for one relay (`token`: 32 hex;
    the node's name too, for nodes that share a /tmp)."""
    return f"/tmp/lockstep-relay-{token}-{node}"


def hop_ssh_argv(
    hop: RelayHop, *, connect_timeout_s: float, keepalive_s: int, control: list[str] | None = None
) -> list[str]:
    """The OpenSSH client argv node `hop.src` runs to
    reach `hop.dst` (the remote command goes after it);
    `control`: the ControlMaster/ControlPath options of the hop's shared connection."""
    argv = [
        "ssh", "-F", "none", "-T", "-x",
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={hop.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-i", hop.key,
        "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}", "-o", f"Ciphers={_CIPHERS}",
        "-o", f"KexAlgorithms={_KEX}",
    ]  # fmt: skip
    if keepalive_s:
        argv += ["-o", f"ServerAliveInterval={keepalive_s}"]
    argv += [*(control or []), "-p", str(hop.port)]
    if hop.user:
        argv += ["-l", hop.user]
    return [*argv, "--", hop.host]


# The node's tee: stdin to stdout (its own load) and to the hop's fifo, in 1 MiB reads through 1 MiB
# pipes. GNU tee copies 8 KiB at a time through 64 KiB pipes, and a chain of such stages waits on
# the scheduler at every step: on the contended bench lane this tee made the chain ~20% faster. An
# output that closes (a load that exits, a hop that dies) is dropped and the other still gets every
# byte, as with `tee -p`. Run as `python3 -c` (the node already needs python3: put_tree's manifest).
_TEE_PY = r"""
import fcntl, os, sys
outs = [1, os.open(sys.argv[1], os.O_WRONLY)]
for fd in (0, *outs):
    try:
        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
while outs:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    for fd in list(outs):
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            outs.remove(fd)
"""


def _report(*fields: str, var: str) -> str:
    """A `printf` of one report line: the literal `fields` quoted, then the shell variable `var`."""
    fmt = "%s" + "\\t%s" * (len(fields) + 1) + "\\n"
    return " ".join(["printf", shlex.quote(fmt), MARK, *map(shlex.quote, fields), f'"${var}"'])


def _control(token: str, node: str, master: str) -> list[str]:
    return ["-o", f"ControlMaster={master}", "-o", f"ControlPath={rendezvous_dir(token, node)}/cm"]


def connect_script(
    hop: RelayHop,
    *,
    token: str,
    connect_timeout_s: float = 15.0,
    keepalive_s: int = 30,
    persist_s: int = 120,
) -> str:
    """What lockstep runs on `hop.src` BEFORE the stream: open the hop's connection (host key
    checked, key auth) as an OpenSSH control master in
    a fresh private directory, and return once it is up.

    Every hop connects at once this way, instead of one after another as the stream reaches each
    node (a chain's start-up then costs one connection,
    not one per hop). The master stays only while it
    serves the hop, and exits by itself `persist_s`
    after its last session (or if none ever comes)."""
    d = shlex.quote(rendezvous_dir(token, hop.src))
    ssh = hop_ssh_argv(
        hop,
        connect_timeout_s=connect_timeout_s,
        keepalive_s=keepalive_s,
        control=[*_control(token, hop.src, "yes"), "-o", f"ControlPersist={persist_s}"],
    )
    # The master goes to the background: it must hold none
    # of this session's outputs, or the session never ends.
    return "\n".join(
        [
            f"mkdir -m 700 -- {d} || exit 1",
            (
                f"{shlex.join([*ssh[:-2], '-N', '-f', *ssh[-2:]])} < /dev/null > /dev/null 2> "
                f"{d}/connect.err"
            ),
            "c=$?",
            f'if [ "$c" -ne 0 ]; then cat -- {d}/connect.err >&2; rm -rf -- {d}; fi',
            'exit "$c"',
        ]
    )


def cleanup_script(hop: RelayHop, *, token: str) -> str:
    """Close a hop's control master and remove its
    directory (after a relay that did not get there)."""
    d = shlex.quote(rendezvous_dir(token, hop.src))
    stop = shlex.join(
        [
            "ssh",
            "-F",
            "none",
            *_control(token, hop.src, "no"),
            "-O",
            "exit",
            "-p",
            str(hop.port),
            "--",
            hop.host,
        ]
    )
    return f"[ -S {d}/cm ] && {stop} > /dev/null 2>&1; rm -rf -- {d}; true"


def node_script(
    chain: Sequence[str],
    hops: Sequence[RelayHop],
    *,
    load_argv: Sequence[str],
    token: str,
    connect_timeout_s: float = 15.0,
    keepalive_s: int = 30,
) -> str:
    """The POSIX sh script the first node of `chain` runs with the stream on its stdin (the rest of
    the chain is inside it). `hops[i]` goes from chain[i] to chain[i + 1], through the connection
    `connect_script` opened (or, if that is gone, a new one with the same options)."""
    if not chain or len(hops) != len(chain) - 1:
        raise ValueError("a relay needs a chain of nodes and one hop between each two")
    node = chain[0]
    load = shlex.join(list(load_argv))
    if len(chain) == 1:
        return f'{{ {load} ; }} >&2; l=$?; {_report("load", node, var="l")}; exit "$l"'
    hop = hops[0]
    inner = node_script(
        chain[1:],
        hops[1:],
        load_argv=load_argv,
        token=token,
        connect_timeout_s=connect_timeout_s,
        keepalive_s=keepalive_s,
    )
    encoded = base64.b64encode(inner.encode()).decode()
    remote = f'sh -c "$(printf %s {encoded} | base64 -d)"'
    ssh = hop_ssh_argv(
        hop,
        connect_timeout_s=connect_timeout_s,
        keepalive_s=keepalive_s,
        control=_control(token, node, "no"),
    )
    d = shlex.quote(rendezvous_dir(token, node))
    lines = [
        f"d={d}",
        '[ -d "$d" ] || mkdir -m 700 -- "$d" || exit 1',
        "trap " + shlex.quote(f"{cleanup_script(hop, token=token)}") + " EXIT",
        'mkfifo -- "$d/next" || exit 1',
        # The hop reads the fifo; its stdout (the chain's
        # reports) is ours, its stderr is kept for the report.
        f'{shlex.join([*ssh, remote])} < "$d/next" 2> "$d/err" &',
        "p=$!",
        # A hop that dies stops getting bytes, but this
        # node's own load still gets all of them (and back).
        f'{shlex.join(["python3", "-c", _TEE_PY])} "$d/next" | {{ {load} ; }} >&2',
        "l=$?",
        'wait "$p"; h=$?',
        _report("load", node, var="l"),
        _report("hop", node, hop.dst, var="h"),
        (
            f'if [ "$h" -ne 0 ]; then tail -n {_ERR_LINES} -- "$d/err" | while IFS= read -r x; do '
            f"{_report('err', node, var='x')}; done; fi"
        ),
        'cat -- "$d/err" >&2',
        '[ "$l" -eq 0 ] && [ "$h" -eq 0 ]',
    ]
    return "\n".join(lines)


# ---- what came back ------------------------------------------------------------------------------


class RelayHopEnd(BaseModel):
    """One hop as its sending node saw it."""

    hop: RelayHop
    exit_code: int | None = Field(
        description="The hop's ssh exit code; None: the sending node never reported."
    )
    stderr: list[str] = Field(
        default_factory=list, description="The tail of its ssh's stderr, when it failed."
    )


class RelayResult(BaseModel):
    """A stream relayed along a chain of nodes: what
    lockstep sent, and what each node says it did."""

    src: PipeEnd = Field(description="The producer.")
    head: PipeEnd = Field(
        description="The first node, as lockstep streamed to it (bytes, sha256 of them, exit)."
    )
    chain: list[str]
    loads: dict[str, int | None] = Field(
        description="Each node's load exit code; None: it never reported."
    )
    hops: list[RelayHopEnd]
    duration_s: float

    @property
    def loaded(self) -> list[str]:
        """The nodes whose load command took the stream and exited 0."""
        return [n for n in self.chain if self.loads.get(n) == 0]

    @property
    def ok(self) -> bool:
        return (
            self.src.ok
            and self.src.bytes > 0
            and self.head.bytes == self.src.bytes
            and self.head.error is None
            and self.loaded == self.chain
            and all(h.exit_code == 0 for h in self.hops)
        )


def read_reports(
    stdout: bytes, chain: Sequence[str], hops: Sequence[RelayHop]
) -> tuple[dict[str, int | None], list[RelayHopEnd]]:
    """The load and hop lines from the head's stdout (lines that are not reports are ignored)."""
    loads: dict[str, int | None] = dict.fromkeys(chain)
    codes: dict[str, int] = {}
    errs: dict[str, list[str]] = {}
    for line in stdout.decode("utf-8", "replace").splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0] != MARK:
            continue
        kind, node = fields[1], fields[2]
        if kind == "load" and len(fields) == 4 and node in loads and fields[3].isdigit():
            loads[node] = int(fields[3])
        elif kind == "hop" and len(fields) == 5 and fields[4].isdigit():
            codes[node] = int(fields[4])
        elif kind == "err":
            errs.setdefault(node, []).append("\t".join(fields[3:]))
    ends = [
        RelayHopEnd(hop=h, exit_code=codes.get(h.src), stderr=errs.get(h.src, [])) for h in hops
    ]
    return loads, ends


def relay_failure(result: RelayResult) -> tuple[str, str]:
    """(the node at fault, a message naming the hop or node and which nodes got the image)."""
    got = result.loaded
    missing = [n for n in result.chain if n not in got]
    tally = f"got the image: {', '.join(got) or 'none'}; did not: {', '.join(missing) or 'none'}"
    src = result.src
    if not src.ok or src.bytes == 0:
        what = src.error or (
            f"exit {src.exit_code}" if src.exit_code else f"exit {src.exit_code} with no output"
        )
        tail = src.stderr.decode("utf-8", "replace").strip()[-1000:]
        return (
            src.node,
            (
                f"the producer on {src.node} failed: {what} after {src.bytes} "
                f"bytes{': ' + tail if tail else ''}; {tally}"
            ),
        )
    head = result.head
    if head.error or head.bytes != src.bytes:
        return head.node, (
            f"the stream from lockstep to the chain's head {head.node} failed: "
            f"{head.error or f'it took {head.bytes} of {src.bytes} bytes'}; {tally}"
        )
    for end in result.hops:
        reached = result.loads.get(end.hop.dst) is not None
        if end.exit_code is None and result.loads.get(end.hop.src) is None:
            continue  # the sending node itself was never reached: reported at the hop before
        if end.exit_code != 0 and not reached:
            detail = (
                "; ".join(line.strip() for line in end.stderr if line.strip())[-1000:]
                or "no message"
            )
            code = "never reported" if end.exit_code is None else f"ssh exit {end.exit_code}"
            return end.hop.src, f"relay {end.hop.describe()} failed ({code}): {detail}; {tally}"
    for node in result.chain:
        code = result.loads.get(node)
        if code not in (0, None):
            return node, f"the load on {node} exited {code}; {tally}"
    if missing:
        return missing[
            0
        ], f"{missing[0]} never reported its load (exit {head.exit_code} at the head); {tally}"
    return head.node, f"the chain's head {head.node} exited {head.exit_code}; {tally}"


class RelayFailed(SparkError):
    """A relay did not reach every node; `result` says what each node and hop did."""

    def __init__(self, message: str, *, node: str, where: str | None, result: RelayResult) -> None:
        super().__init__(message, node=node, where=where)
        self.result = result


# ---- running it ----------------------------------------------------------------------------------


def run_relay(
    spark: Any,
    *,
    src: str,
    src_argv: list[str],
    chain: list[str],
    load_argv: list[str],
    progress: Any = None,
) -> RelayResult:
    """SparkNodes.relay (`spark` is the resource): connect every hop, stream, read the reports.
    `progress` is told the bytes sent to the head so far (SparkNodes.pipe's)."""
    if not chain:
        raise SparkError("relay needs at least one node in its chain", node=src)
    if len(set(chain)) != len(chain) or src in chain:
        raise SparkError(
            f"relay chain repeats a node or holds the source: {src} -> {' -> '.join(chain)}",
            node=src,
        )
    hops = relay_hops([spark.node(n) for n in chain], chain=chain)
    token = uuid.uuid4().hex
    timing = {"connect_timeout_s": spark.connect_timeout_s, "keepalive_s": spark.keepalive_s}
    script = node_script(chain, hops, load_argv=[str(a) for a in load_argv], token=token, **timing)
    dg.get_dagster_logger().info(
        f"spark relay {src} -> {' -> '.join(chain)}: "
        f"{shlex.join(redact_argv(src_argv, spark._secrets()))} | "
        f"{shlex.join(load_argv)} on each node"
    )
    started = time.monotonic()

    def on_senders(make: Any) -> list[Any]:
        if not hops:
            return []
        with ThreadPoolExecutor(max_workers=len(hops)) as pool:
            return list(
                pool.map(
                    lambda hop: spark.run(
                        node=hop.src,
                        argv=["sh", "-c", make(hop)],
                        timeout_s=4 * spark.connect_timeout_s + 10,
                    ),
                    hops,
                )
            )

    def cleanup() -> None:
        with contextlib.suppress(SparkError):
            on_senders(lambda hop: cleanup_script(hop, token=token))

    try:
        connected = on_senders(lambda hop: connect_script(hop, token=token, **timing))
    except SparkError:
        cleanup()
        raise
    if failed := [
        (hop, done) for hop, done in zip(hops, connected, strict=True) if done.exit_code != 0
    ]:
        cleanup()
        hop, done = failed[0]
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        ends = [
            RelayHopEnd(
                hop=h,
                exit_code=d.exit_code,
                stderr=d.stderr.decode("utf-8", "replace").splitlines()[-20:],
            )
            for h, d in zip(hops, connected, strict=True)
        ]
        idle = PipeEnd(node=src, exit_code=None, bytes=0, sha256=hashlib.sha256().hexdigest(),
                       error="not started: a relay hop could not connect")  # fmt: skip
        result = RelayResult(
            src=idle,
            head=idle.model_copy(update={"node": chain[0]}),
            chain=list(chain),
            loads=dict.fromkeys(chain),
            hops=ends,
            duration_s=round(time.monotonic() - started, 3),
        )
        raise RelayFailed(
            spark._say(
                f"relay {hop.describe()} failed (ssh exit {done.exit_code}): "
                f"{'; '.join(lines[-5:]) or 'no message'}; "
                f"nothing was sent, so no node got the image; hops that failed to connect: "
                f"{', '.join(f'{h.src} -> {h.dst}' for h, _ in failed)}"
            ),
            node=hop.src,
            where=done.where,
            result=result,
        )
    try:
        piped = spark.pipe(
            src=src,
            src_argv=src_argv,
            dsts=chain[:1],
            dst_argv=["sh", "-c", script],
            progress=progress,
        )
    except PipeFailed as exc:
        piped = exc.result
    loads, hop_ends = read_reports(piped.dsts[0].stdout, chain, hops)
    result = RelayResult(
        src=piped.src,
        head=piped.dsts[0],
        chain=list(chain),
        loads=loads,
        hops=hop_ends,
        duration_s=round(time.monotonic() - started, 3),
    )
    if not result.ok:
        cleanup()
        node, message = relay_failure(result)
        where = spark._transport(node).where if node in (src, chain[0]) else None
        raise RelayFailed(spark._say(message), node=node, where=where, result=result)
    return result
