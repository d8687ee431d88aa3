"""jovian/dep_trees on real-sized repos: a first rev
vs plain clones of the same pins, then a second rev.

    uv run python bench/dep_trees_bench.py [--mib 216] [--repeat 3] [--move cutlass] [--ahead 20]

Generates 8 bare repos shaped like vLLM's cmake dependencies (cutlass, vllm-flash-attn, flashmla,
...) with `git fast-import` fed from Python: `--mib` MiB of incompressible blobs in total, over a
few hundred commits each that rewrite 2 files at a time (so a checkout is about a fifth of a repo's
history). flashmla's tree has a gitlink `csrc/cutlass` (relative url `../cutlass.git`) to an older
cutlass commit than the cutlass pin, as in vLLM. Rev 1 pins every dep 40 commits behind its tip;
rev 2 moves `--move` `--ahead` commits later and keeps the other seven.

The repos are served by a `git daemon` on 127.0.0.1 (protocol v2, started here and stopped by PID)
behind a byte-counting TCP proxy in this process, so every fetch of lockstep and of the references
is counted on the wire, per session and repo. The server allows what GitHub allows:
`uploadpack.allowFilter` (blob:none) and `uploadpack.allowReachableSHA1InWant` (a reachable sha
fetched by id), not `allowAnySHA1InWant`. (Over protocol v2, git's default since 2.26, upload-pack
serves any object it has by id whatever the last two say; a v0 client needs the second.)

Side by side, `--repeat` times, the order rotated each round so a neighbour's load hits all alike:

- lockstep: `fetch_dep` for each dep (what the `jovian/dep_trees` asset runs) into a fresh cache,
  gitlinks populated; then rev 2 on that warm cache;
- plain: `git clone --no-checkout` + `git checkout --detach
  PIN` + `git submodule update --init --recursive`;
- blobless: the same with `--filter=blob:none` on the clone and the submodule update;
- shallow: `git init` + `git fetch --depth 1 origin
  PIN` + checkout + `submodule update --init --depth 1`;

each into empty directories. Every tree is checked at its pin with a clean status and the gitlink
at its recorded commit. Medians are compared. Asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Run as a script: the repo root is not on sys.path, and the server helpers live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jovian_assets.dep_trees import fetch_dep, gitlinks_populated
from resources.git import GitRemotes
from tests.support.servers import (
    ServerNotReady,
    start_on_free_port,
    stop_process,
    wait_until_ready,
)

MiB = 1024 * 1024
# name, share of the history, files in the tree, commits. cutlass is the big one, as in vLLM.
DEPS = [
    ("cutlass", 64, 160, 320), ("vllm-flash-attn", 40, 120, 260), ("flashmla", 24, 90, 200),
    ("deepgemm", 24, 90, 200), ("flashinfer", 20, 80, 180), ("qutlass", 16, 60, 160),
    ("triton_kernels", 16, 60, 160), ("flashkda", 12, 50, 140),
]  # fmt: skip
GITLINK_PARENT, GITLINK_PATH, GITLINK_TARGET = "flashmla", "csrc/cutlass", "cutlass"
PIN_BEHIND_TIP = 40
CHANGED_PER_COMMIT = 2
_GIT_ENV = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=_GIT_ENV,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


# -- the repos -------------------------------------------------------------------------------------


def generate(
    path: Path,
    *,
    history: int,
    files: int,
    commits: int,
    seed: int,
    gitlink: tuple[str, list[str]] | None = None,
) -> list[str]:
    """A bare repo with `history` bytes of random blobs
    over `commits` commits; returns the shas, oldest first.

    `gitlink` = (path, target commits): every commit records a gitlink that steps forward through
    the target's history, stopping well behind its tip."""
    git("init", "--quiet", "--bare", "--initial-branch=main", str(path))
    for key, value in (
        ("uploadpack.allowFilter", "true"),
        ("uploadpack.allowReachableSHA1InWant", "true"),
    ):
        git("config", key, value, cwd=path)
    rnd = random.Random(seed)
    average = history // (files + CHANGED_PER_COMMIT * (commits - 1))
    sizes = [max(1024, int(average * rnd.uniform(0.25, 1.75))) for _ in range(files)]
    names = [
        f"{('include', 'csrc', 'kernels', 'python', 'tools')[i % 5]}/d{i % 7}/f{i:04d}.bin"
        for i in range(files)
    ]
    # The blobs are random, so no delta can help: above the 1 KiB threshold fast-import stores each
    # whole without trying one, and level 0 skips deflating what
    # would not shrink (bytes on the wire are the same).
    proc = subprocess.Popen(
        ["git", "-c", "pack.compression=0", "fast-import", "--quiet", "--big-file-threshold=1k"],
        cwd=path,
        stdin=subprocess.PIPE,
        env=_GIT_ENV,
    )
    assert proc.stdin is not None
    out = proc.stdin
    mark = 0
    for c in range(commits):
        changed = range(files) if c == 0 else rnd.sample(range(files), CHANGED_PER_COMMIT)
        lines = []
        for i in changed:
            mark += 1
            size = max(1024, int(sizes[i] * rnd.uniform(0.8, 1.2)))
            out.write(b"blob\nmark :%d\ndata %d\n" % (mark, size) + os.urandom(size) + b"\n")
            lines.append(b"M 100644 :%d %s\n" % (mark, names[i].encode()))
        message = b"%s commit %d" % (path.stem.encode(), c)
        out.write(
            (
                b"commit refs/heads/main\ncommitter Bench <bench@example.invalid> %d "
                b"+0000\ndata %d\n%s\n"
            )
            % (1_700_000_000 + c * 3600, len(message), message)
        )
        out.write(b"".join(lines))
        if gitlink is not None:
            link_path, targets = gitlink
            if c == 0:
                modules = (
                    f'[submodule "{link_path}"]\n\tpath = {link_path}\n\turl = '
                    f"../{GITLINK_TARGET}.git\n"
                ).encode()
                out.write(b"M 100644 inline .gitmodules\ndata %d\n%s\n" % (len(modules), modules))
            # moves every commit or so, stays old
            step = (len(targets) - 3 * PIN_BEHIND_TIP) * c // commits
            out.write(b"M 160000 %s %s\n" % (targets[step].encode(), link_path.encode()))
        out.write(b"\n")
    out.close()
    if proc.wait() != 0:
        raise RuntimeError(f"git fast-import failed for {path}")
    return git("rev-list", "--reverse", "main", cwd=path).split()


def generate_all(root: Path, total_mib: int) -> dict[str, list[str]]:
    scale = total_mib / sum(d[1] for d in DEPS)
    shas: dict[str, list[str]] = {}
    for seed, (name, share, files, commits) in enumerate(DEPS):
        link = (GITLINK_PATH, shas[GITLINK_TARGET]) if name == GITLINK_PARENT else None
        shas[name] = generate(
            root / f"{name}.git",
            history=int(share * scale * MiB),
            files=files,
            commits=commits,
            seed=seed,
            gitlink=link,
        )
    return shas


# -- the server: git daemon, and a proxy that counts what crosses the wire -----------------------


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    port: int


def start_daemon(root: Path) -> Daemon:
    def start(port: int) -> Daemon:
        log = root.parent / "daemon.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    "git",
                    "daemon",
                    "--reuseaddr",
                    "--listen=127.0.0.1",
                    f"--port={port}",
                    f"--base-path={root}",
                    "--export-all",
                    "--informative-errors",
                    str(root),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=_GIT_ENV,
            )
        daemon = Daemon(proc, port)
        probe = ["git", "ls-remote", "--", f"git://127.0.0.1:{port}/{DEPS[0][0]}.git"]
        wait_until_ready(
            proc,
            lambda: (
                subprocess.run(
                    probe, capture_output=True, env=_GIT_ENV, timeout=10, check=False
                ).returncode
                == 0
            ),
            timeout_s=15,
            interval_s=0.05,
            log=log,
            tail_chars=2000,
            stop=lambda: stop_daemon(daemon),
            message=lambda code, tail: (
                f"git daemon did not serve on port {port} (exit {code}); its log:\n{tail}"
            ),
        )
        return daemon

    return start_on_free_port(start)


def stop_daemon(daemon: Daemon) -> None:
    """The daemon and the upload-packs it forked (its own session), by its PID."""
    stop_process(daemon.proc, grace_s=5, group=True)


@dataclass
class Wire:
    received: int = 0  # server -> client: what a fetch costs
    sent: int = 0
    sessions: Counter[str] = field(default_factory=Counter)  # repo path -> upload-pack sessions


def _read_pkt(sock: socket.socket) -> bytes:
    """One whole pkt-line (4 hex digits of length, then the rest): a recv may return less."""
    data = b""
    while len(data) < 4 or len(data) < int(data[:4], 16):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class CountingProxy:
    """127.0.0.1:port -> the daemon, counting bytes each way and the repo each session asks for."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.wire = Wire()
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def take(self) -> Wire:
        with self.lock:
            wire, self.wire = self.wire, Wire()
        return wire

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(client,), daemon=True).start()

    def _session(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as server:
            first = _read_pkt(client)  # "00xxgit-upload-pack /cutlass.git\0host=...\0\0version=2\0"
            service = first[4:].split(b"\0", 1)[0].decode(errors="replace")
            with self.lock:
                self.wire.sessions[service.rsplit(" ", 1)[-1].strip("/")] += 1
                self.wire.sent += len(first)
            server.sendall(first)
            up = threading.Thread(target=self._pump, args=(client, server, "sent"), daemon=True)
            up.start()
            self._pump(server, client, "received")
            up.join()

    def _pump(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        try:
            while n := src.recv_into(buf):
                dst.sendall(view[:n])
                with self.lock:
                    setattr(self.wire, counter, getattr(self.wire, counter) + n)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


# -- the ways to get the trees --------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    wire: Wire
    recorded: int = 0  # lockstep's own bytes_fetched (mirror growth), as the asset's metadata says


def check_tree(path: Path, pin: str, gitlink: str | None) -> None:
    """At the pin, nothing modified or missing, the
    gitlink checked out (a .git) at its recorded commit."""
    head = git("rev-parse", "HEAD", cwd=path)
    assert head == pin, (path, head, pin)
    status = git("status", "--porcelain", "--ignore-submodules=none", cwd=path)
    assert status == "", (path, status[:500])
    if gitlink is not None:
        sub = path / GITLINK_PATH
        assert (sub / ".git").exists(), f"{sub} holds no .git"
        assert git("rev-parse", "HEAD", cwd=sub) == gitlink, sub


def lockstep_rev(
    remotes: GitRemotes,
    proxy: CountingProxy,
    rev: str,
    pins: dict[str, str],
    url: Callable[[str], str],
    gitlink: str,
) -> Run:
    root = remotes.trees_dir() / "jovian" / rev / "deps"
    proxy.take()
    start = time.perf_counter()
    trees = [
        fetch_dep(remotes, name=name, repository=url(name), tag=pin, dest=root / name)
        for name, pin in pins.items()
    ]
    seconds = time.perf_counter() - start
    wire = proxy.take()
    errors = [f"{t.name}: {t.error}" for t in trees if t.error]
    assert not errors, errors
    finding = gitlinks_populated(trees)
    assert finding.passed, finding.description
    for tree in trees:
        check_tree(
            root / tree.name, pins[tree.name], gitlink if tree.name == GITLINK_PARENT else None
        )
    return Run(seconds, wire, sum(t.bytes_fetched for t in trees))


def reference(
    kind: str,
    proxy: CountingProxy,
    root: Path,
    pins: dict[str, str],
    url: Callable[[str], str],
    gitlink: str,
) -> Run:
    root.mkdir(parents=True)
    proxy.take()
    start = time.perf_counter()
    for name, pin in pins.items():
        dest = root / name
        if kind == "shallow":
            git("init", "--quiet", str(dest))
            git("remote", "add", "origin", url(name), cwd=dest)
            git("fetch", "--quiet", "--no-tags", "--depth", "1", "origin", pin, cwd=dest)
        else:
            blobless = ["--filter=blob:none"] if kind == "blobless" else []
            git("clone", "--quiet", "--no-checkout", *blobless, "--", url(name), str(dest))
        git("-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", pin, cwd=dest)
        if name == GITLINK_PARENT:
            extra = {"shallow": ["--depth", "1"], "blobless": ["--filter=blob:none"]}.get(kind, [])
            git("submodule", "update", "--quiet", "--init", "--recursive", *extra, cwd=dest)
    seconds = time.perf_counter() - start
    wire = proxy.take()
    for name, pin in pins.items():
        check_tree(root / name, pin, gitlink if name == GITLINK_PARENT else None)
    return Run(seconds, wire)


# -- the run --------------------------------------------------------------------------------------


def gitlink_at(repo: Path, pin: str) -> str:
    return git("rev-parse", f"{pin}:{GITLINK_PATH}", cwd=repo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mib", type=int, default=216, help="MiB of history across the 8 repos (default 216)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds of every way; medians compared (default 3)"
    )
    parser.add_argument(
        "--move", default="cutlass", choices=[d[0] for d in DEPS], help="the dep rev 2 moves"
    )
    parser.add_argument(
        "--ahead", type=int, default=20, help="commits rev 2 moves it by (default 20)"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lockstep-deptrees-bench-"))
    daemon = proxy = None
    try:
        t0 = time.perf_counter()
        served = work / "served"
        shas = generate_all(served, args.mib)
        history = sum(p.stat().st_size for p in served.rglob("objects/pack/*.pack"))
        generated_s = time.perf_counter() - t0
        rev1 = {name: commits[-1 - PIN_BEHIND_TIP] for name, commits in shas.items()}
        moved = shas[args.move]
        rev2 = {**rev1, args.move: moved[moved.index(rev1[args.move]) + args.ahead]}
        link1 = gitlink_at(served / f"{GITLINK_PARENT}.git", rev1[GITLINK_PARENT])
        link2 = gitlink_at(served / f"{GITLINK_PARENT}.git", rev2[GITLINK_PARENT])

        daemon = start_daemon(served)
        proxy = CountingProxy(daemon.port)
        port = proxy.port

        def url(name: str) -> str:
            return f"git://127.0.0.1:{port}/{name}.git"

        print(
            f"generated 8 repos, {history / MiB:,.1f} MiB of packs, "
            f"{sum(len(s) for s in shas.values())} commits, "
            f"in {generated_s:.1f} s; git daemon pid {daemon.proc.pid} ({git('--version')}), "
            "protocol v2, "
            f"counting proxy on 127.0.0.1:{port}"
        )
        runs: dict[str, list[Run]] = {
            k: [] for k in ("lockstep", "lockstep rev 2", "plain", "blobless", "shallow")
        }
        ways = ["lockstep", "plain", "blobless", "shallow"]
        for round_ in range(args.repeat):
            for way in ways[round_ % len(ways) :] + ways[: round_ % len(ways)]:
                where = work / f"round{round_}-{way}"
                if way == "lockstep":
                    remotes = GitRemotes(
                        cache_dir=str(where / "cache" / "git"), timeout_s=600, url_schemes=["git"]
                    )
                    runs["lockstep"].append(lockstep_rev(remotes, proxy, "r1", rev1, url, link1))
                    runs["lockstep rev 2"].append(
                        lockstep_rev(remotes, proxy, "r2", rev2, url, link2)
                    )
                else:
                    runs[way].append(reference(way, proxy, where, rev1, url, link1))
                shutil.rmtree(where)

        def med(way: str, pick: Callable[[Run], float]) -> float:
            return statistics.median(pick(r) for r in runs[way])

        plain_b, plain_s = (
            med("plain", lambda r: r.wire.received),
            med("plain", lambda r: r.seconds),
        )
        print(
            f"\nrev 1: 8 deps at their pins (+ flashmla's {GITLINK_PATH} gitlink), medians of "
            f"{args.repeat} rounds"
        )
        print(
            f"{'':16}{'bytes received':>16}{'/ plain':>9}{'seconds':>9}{'/ plain':>9}  "
            "upload-pack sessions"
        )
        for way in ("lockstep", "plain", "blobless", "shallow"):
            b, s = med(way, lambda r: r.wire.received), med(way, lambda r: r.seconds)
            sessions = sum(runs[way][0].wire.sessions.values())
            print(
                f"{way:16}{int(b):>16,}{b / plain_b:>8.3f}x{s:>9.2f}{s / plain_s:>8.3f}x  "
                f"{sessions}"
            )
        r1_b = med("lockstep", lambda r: r.wire.received)
        r2_b = med("lockstep rev 2", lambda r: r.wire.received)
        r2 = runs["lockstep rev 2"][0]
        print(
            f"\nrev 2: {args.move} moved {args.ahead} commits, the other 7 kept, on rev 1's cache"
        )
        print(
            f"lockstep rev 2: {int(r2_b):,} bytes received ({r2_b / r1_b:.2%} of rev 1's), "
            f"{med('lockstep rev 2', lambda r: r.seconds):.2f} s; sessions by repo: "
            f"{dict(r2.wire.sessions)}"
        )
        print(
            "lockstep's bytes_fetched metadata (mirror growth): rev 1 "
            f"{int(med('lockstep', lambda r: r.recorded)):,}, "
            f"rev 2 {int(med('lockstep rev 2', lambda r: r.recorded)):,}"
        )
        print(
            "all seconds: "
            + "; ".join(
                f"{w} " + ", ".join(f"{r.seconds:.2f}" for r in rs) for w, rs in runs.items()
            )
        )
        print(
            f"load average when the timings ended: {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
            "cores "
            "(anything above the bench's own ~1 shared the machine)"
        )

        goals = [  # figure, value, goal
            ("dep trees, first rev: bytes / plain git clone of the same pins", r1_b / plain_b, 1.0),
            (
                "dep trees, first rev: seconds / plain git clone of the same pins",
                med("lockstep", lambda r: r.seconds) / plain_s,
                1.0,
            ),
            ("second rev moving 1 of 8: bytes fetched / first rev's", r2_b / r1_b, 0.15),
        ]
        figure, value, goal = max(goals, key=lambda g: g[1] / g[2])
        print(f"RATIO {figure}: {value:.3f} (goal <= {goal})")
    finally:
        if proxy is not None:
            proxy.close()
        if daemon is not None:
            stop_daemon(daemon)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except ServerNotReady as exc:
        sys.exit(str(exc))
