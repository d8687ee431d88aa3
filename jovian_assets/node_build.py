"""Building, gating and distributing a Jovian image
on DGX Spark nodes (runbook: Building / distributing).

The build runs detached on the build node (`setsid nohup`, log to a file) and is judged by its exit
code, polled — never by a log line. `docker load` keeps only the image ID (the config digest), so
distribution is verified by comparing image IDs on every node, never a registry digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import time
from pathlib import Path, PurePosixPath

from pydantic import Field

from jovian_assets.models import Finding
from jovian_assets.source_lock import SourceLock
from resources.errors import LockstepError
from resources.heartbeat import TAIL_LINES, Heartbeat
from resources.model import Model
from resources.names import under
from resources.site.jovian import BootGate
from resources.spark import DetachedHandle, SparkError, SparkNodes

# The label `sm121 build` stamps, and lockstep too (through build.sh's BUILD_DIR_CHECKSUM): one
# label, one definition (manifest_checksum over the build dir as committed), so an image built by
# either tool compares with the dir, and a hand-built
# (unlabeled) one is the informational STALE warning.
CHECKSUM_LABEL = "sm121.checksum"
MAX_POLL_MISSES = 5


class NodeBuildFailed(LockstepError):
    """The build, a gate, a transfer or the bench failed on a node; the message names the node."""


class NodeImage(Model):
    """`jovian/image`: what the build node holds after the build."""

    rev: str
    tag: str
    node: str
    image_id: str
    labels: dict[str, str] = Field(default_factory=dict)
    build_dir_checksum: str
    duration_s: float
    log_tail: str = ""
    expected_pins: dict[str, str] = Field(default_factory=dict)
    gates: dict[str, dict[str, str]] = Field(default_factory=dict)


class Distribution(Model):
    tag: str
    image_id: str
    nodes: dict[str, str]  # node -> image ID it holds after `docker load`
    bytes: int
    mode: str = "star"  # [jovian] distribute: star (lockstep to each node) or relay (node to node)


def distribute_image(
    spark: SparkNodes,
    image: NodeImage,
    *,
    nodes: list[str],
    mode: str,
    heartbeat: Heartbeat | None = None,
) -> Distribution:
    """ONE plain `docker save` on the build node into every node's `docker load` — in parallel from
    lockstep (star) or along the chain `nodes` (relay)
    — then the image ID on every node compared with
    the built one, whichever way the bytes went. `heartbeat` beats as the bytes move."""
    save, load = ["docker", "save", image.tag], ["docker", "load"]
    state = f"docker save {image.tag} on {image.node} -> docker load on {', '.join(nodes)} ({mode})"
    moved = [0]

    def progress(sent: int) -> None:
        moved[0] = sent
        if heartbeat:
            heartbeat.beat(state=state, bytes_moved=sent)

    # A stream that stalls blocks in a read and calls
    # `progress` no more: the heartbeat's own thread covers it.
    with (
        heartbeat.covering(state=state, bytes_moved=lambda: moved[0])
        if heartbeat
        else contextlib.nullcontext()
    ):
        if mode == "relay":
            sent = spark.relay(
                src=image.node, src_argv=save, chain=nodes, load_argv=load, progress=progress
            ).src.bytes
        else:
            sent = spark.pipe(
                src=image.node, src_argv=save, dsts=nodes, dst_argv=load, progress=progress
            ).src.bytes
    ids = {node: inspect_image(spark, node=node, tag=image.tag)["Id"] for node in nodes}
    wrong = [f"{node} holds {i}" for node, i in ids.items() if i != image.image_id]
    if wrong:
        raise NodeBuildFailed(
            f"{image.tag} is {image.image_id} on {image.node}, but " + "; ".join(wrong)
        )
    return Distribution(tag=image.tag, image_id=image.image_id, nodes=ids, bytes=sent, mode=mode)


def manifest_checksum(root: Path) -> str:
    """sha256 over (relative path, file sha256) of every file under `root`, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(
            f"{path.relative_to(root)}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode()
        )
    return digest.hexdigest()


# docker's reference grammar for `name:tag`
# (distribution/reference): what `docker build -t` accepts.
_IMAGE_NAME = re.compile(
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def image_tag(template: str, rev: str) -> str:
    """The site's image tag template with the rev in it, refused unless docker would read it as one
    `name:tag` (a value that starts with '-' or holds shell syntax never reaches the node)."""
    try:
        tag = template.format(rev=rev)
    except (KeyError, IndexError, ValueError) as exc:
        raise NodeBuildFailed(
            f"[jovian].image_tag {template!r} is not a template with only {{rev}} in it: {exc!r}"
        ) from None
    name, version = tag.rsplit(":", 1) if ":" in tag.rsplit("/", 1)[-1] else (tag, "latest")
    first, _, rest = name.partition("/")
    host, path = (
        (first, rest)
        if rest and ("." in first or ":" in first or first == "localhost")
        else ("", name)
    )
    if not (
        _IMAGE_NAME.fullmatch(path)
        and _IMAGE_TAG.fullmatch(version)
        and (not host or re.fullmatch(r"[A-Za-z0-9.-]+(?::[0-9]+)?", host))
    ):
        raise NodeBuildFailed(
            f"image tag {tag!r} (from [jovian].image_tag {template!r} and rev {rev!r}) is not a "
            "docker "
            "name:tag: fix the site's image_tag"
        )
    return tag


def stage_build_dir(
    *, build_checkout: Path, build_dir: str, deps_root: Path | None, dest: Path
) -> str:
    """The build context to ship: the rev's lineage dir (versions.env, profiles/, build.sh, ...)
    plus the fetched dependency trees under deps/, without
    any .git links. Returns the build dir's checksum.

    The checksum covers the build dir alone, as sm121
    computes it: deps/ is lockstep's staging of what
    the dir's pins already name, and a manually built image (no deps/) must compare equal."""
    if dest.exists():
        shutil.rmtree(dest)
    ignore = shutil.ignore_patterns(".git")
    shutil.copytree(
        under(build_checkout, *PurePosixPath(build_dir).parts), dest, ignore=ignore, symlinks=True
    )
    checksum = manifest_checksum(dest)
    if deps_root is not None and deps_root.exists():
        shutil.copytree(deps_root, dest / "deps", ignore=ignore, symlinks=True)
    return checksum


def label_finding(tag: str, labels: dict[str, str], checksum: str) -> Finding:
    """Whether the image's sm121.checksum label is the
    build dir's checksum (a WARN, informational)."""
    label = labels.get(CHECKSUM_LABEL)
    if label == checksum:
        return Finding(
            passed=True,
            description=f"labelled {CHECKSUM_LABEL}={checksum[:16]}...: built from this build dir",
        )
    if not label:
        return Finding(
            passed=False,
            description=(
                f"STALE: unlabeled {tag}: no {CHECKSUM_LABEL} label, so nothing says which build "
                "dir it came from "
                f"(a hand-built image?). Informational; the build dir is {checksum[:16]}... — "
                "rebuild through lockstep "
                "or `sm121 build` to know what it holds"
            ),
        )
    return Finding(
        passed=False,
        description=(
            f"STALE: {tag} carries {CHECKSUM_LABEL}={label[:16]}..., not this build dir's "
            f"{checksum[:16]}...: it was "
            "built from another state of the dir (another profile or pin set)"
        ),
    )


def expected_pins(lock: SourceLock) -> dict[str, str]:
    """What the engine strings should carry: each package's version (when pinned) or commit."""
    return {name: pkg.version or pkg.commit for name, pkg in lock.packages.items()}


def gate_context(lock: SourceLock, *, escape: bool = True) -> dict[str, str]:
    """What a gate's `expect` is filled with; `escape=False`: the plain values, for a message."""
    ctx = {"rev": lock.rev}
    for name, pkg in lock.packages.items():
        ctx[f"{name}_commit8"] = pkg.commit[:8]
        ctx[f"{name}_version"] = re.escape(pkg.version or "") if escape else (pkg.version or "")
    return ctx


def run_gates(
    spark: SparkNodes, *, node: str, tag: str, gates: list[BootGate], lock: SourceLock
) -> tuple[Finding, dict[str, dict[str, str]]]:
    """Each boot gate as `docker run --rm --network none
    TAG python -c CODE` on the node (a gate reads the
    image, never the network); every gate's output is kept."""
    ctx, plain = gate_context(lock), gate_context(lock, escape=False)
    outputs: dict[str, dict[str, str]] = {}
    failed: list[str] = []
    for gate in gates:
        result = spark.run(
            node=node,
            argv=["docker", "run", "--rm", "--network", "none", tag, "python", "-c", gate.code],
        )
        out = result.stdout.decode(errors="replace").strip()
        err = result.stderr.decode(errors="replace").strip()
        outputs[gate.name] = {
            "exit": str(result.exit_code),
            "stdout": out[-2000:],
            "stderr": err[-2000:],
        }
        if result.exit_code != 0:
            failed.append(
                f"{gate.name}: {result.describe()}: "
                f"{(err or out).splitlines()[-1] if (err or out) else ''}"
            )
            continue
        if gate.expect:
            pattern = gate.expect.format(**ctx)
            if not re.search(pattern, out, re.MULTILINE):
                expected = gate.expect.format(**plain).removeprefix("^").removesuffix("$")
                failed.append(
                    f"{gate.name}: expected {expected!r}, found {out[-200:]!r} (pattern "
                    f"{pattern!r})"
                )
    if failed:
        return Finding(
            passed=False,
            description=f"{len(failed)} of {len(gates)} boot gates failed on {node}: "
            + "; ".join(failed),
        ), outputs
    return Finding(passed=True, description=f"all {len(gates)} boot gates pass on {node}"), outputs


def wait_detached(
    spark: SparkNodes,
    handle: DetachedHandle,
    *,
    timeout_s: float,
    poll_s: float,
    heartbeat: Heartbeat | None = None,
) -> int:
    """Poll the build's STATE (pid + exit file) until it exits; return its exit code. `heartbeat`
    beats on every poll, its tail the build log's last lines; no sleep outlasts its next line."""
    deadline = time.monotonic() + timeout_s
    delay = min(1.0, poll_s)
    misses = 0

    def pause() -> None:
        time.sleep(heartbeat.sleep_for(delay) if heartbeat else delay)

    def tail() -> list[str]:
        return spark.tail(handle=handle, lines=TAIL_LINES).splitlines()

    while True:
        try:
            state = spark.poll(handle=handle)
            misses = 0
        except SparkError as exc:
            # The node is unreachable for a while; the detached
            # build goes on. Give up only after several polls.
            misses += 1
            if misses >= MAX_POLL_MISSES or time.monotonic() > deadline:
                raise NodeBuildFailed(
                    f"lost {handle.node} for {misses} polls while building (pid {handle.pid}): "
                    f"{exc}"
                ) from None
            if heartbeat:
                heartbeat.beat(
                    state=f"not answering ({misses} polls missed; the detached build goes on)"
                )
            pause()
            delay = min(delay * 2, poll_s)
            continue
        if state.state == "exited":
            return state.exit_code if state.exit_code is not None else -1
        if state.state == "vanished":
            raise NodeBuildFailed(
                f"the build on {handle.node} (pid {handle.pid}) vanished without an exit code: "
                f"look at {handle.log} on the node"
            )
        if time.monotonic() > deadline:
            raise NodeBuildFailed(
                f"the build on {handle.node} (pid {handle.pid}) is still running after "
                f"{timeout_s:.0f}s; "
                "it was not killed"
            )
        if heartbeat:
            heartbeat.beat(
                state=f"running (pid {handle.pid} on {handle.node}, log {handle.log})",
                tail_lines=tail,
            )
        pause()
        delay = min(delay * 2, poll_s)


def inspect_image(spark: SparkNodes, *, node: str, tag: str) -> dict:
    result = spark.run(node=node, argv=["docker", "image", "inspect", tag])
    if result.exit_code != 0:
        raise NodeBuildFailed(
            f"{node}: docker image inspect {tag}: {result.describe()}: "
            f"{result.stderr.decode(errors='replace').strip()}"
        )
    (info,) = json.loads(result.stdout)
    return info
