"""Booting a rev on the lane: what the lane served, the rev's container started on every lane node,
its readiness followed to the endpoint, and the lane put back when the rev must not stay.

The runbook's order is "rebuild on the build node, boot on the lane, then bench+report". A serving
container has one fixed name per lane (`lockstep-<lane>`), so what the lane serves is whatever runs
under that name: `docker container inspect` says its image ID (`.Image`), the reference it was
started from (`.Config.Image`) and, when lockstep started it, the rev and tag in its labels. The
head (the lane's first node) runs the recipe's serve command and is the only node that binds the
endpoint port; every other node runs the same command with `worker_args` (vLLM `--headless`) and
binds nothing — which is also why a sandbox whose nodes all live on 127.0.0.1 can run a 2x lane.

Readiness is read from the head container's log (`docker logs --timestamps`), the site's patterns in
order (defaults: `GPU KV cache size: N tokens`, then `Application startup complete`), then the
endpoint's `/v1/models` asked ON the head node, where it is local. The budget is the warm one when
every node's JIT cache directory already held files before the start, else the cold one. A container
that exits, a worker that dies, an image ID that is not the distributed one, or the budget running
out fails the boot with the log tail and exit code, after the lane is put back to what it served.

Every state the lane reaches (a boot, a restore, a lane left empty) is a materialization of
`jovian/lane`: the lane's serving history, read back by `lane_history`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal, Protocol

import dagster as dg
from pydantic import ConfigDict, Field, ValidationError

from jovian_assets.keys import LANE, lane_container
from jovian_assets.models import LaneServing, ServedImage
from resources.errors import LockstepError
from resources.heartbeat import TAIL_LINES, Heartbeat
from resources.model import Model
from resources.names import NameRefused, check_name
from resources.secrets import redact, secret_values
from resources.site.jovian import LaneSection
from resources.site.rules import check_local_image_tag
from resources.site.schema import SiteConfig
from resources.spark import SparkNodes

REV_LABEL = "lockstep.rev"
TAG_LABEL = "lockstep.tag"
ENDPOINT = "endpoint"  # the last readiness mark: /v1/models lists the served model
STOP_GRACE_S = 30  # `docker stop -t`: vLLM frees the GPU's memory on SIGTERM; give it time
_LOG_TAIL = 40
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_DOCKER_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


class LaneBootFailed(LockstepError):
    """The rev did not come up serving on the lane
    (the lane was put back before this was raised)."""


class _Log(Protocol):
    def info(self, msg: str) -> None: ...
    def warning(self, msg: str) -> None: ...


# ---- what docker says, validated where it enters -------------------------------------------------


class _State(Model):
    model_config = ConfigDict(extra="ignore")
    Status: str
    ExitCode: int = 0
    StartedAt: str = ""


class _Config(Model):
    model_config = ConfigDict(extra="ignore")
    Image: str = ""
    Labels: dict[str, str] | None = None


class _Inspect(Model):
    model_config = ConfigDict(extra="ignore")
    Id: str
    Name: str
    Image: str
    State: _State
    Config: _Config


class Container(Model):
    """One lane node's serving container as `docker container inspect` reports it."""

    node: str
    name: str
    status: str  # created | running | exited | dead ...
    exit_code: int
    image_id: str
    image_ref: str  # .Config.Image: what it was started from
    started_at: datetime | None
    rev: str | None  # from lockstep's label, when lockstep started it
    tag: str | None


def parse_docker_time(text: str) -> datetime | None:
    """docker's RFC 3339 times with nanoseconds
    (`2026-12-01T15:38:21.669297000Z`); None for the zero time."""
    m = _DOCKER_TIME.match(text.strip())
    if m is None or m.group(1).startswith("0001-"):
        return None
    frac = (m.group(2) or "0")[:6].ljust(6, "0")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(f"{m.group(1)}.{frac}{zone}")


def parse_container(node: str, stdout: bytes) -> Container:
    """The one container of `docker container inspect NAME` (JSON), checked field by field."""
    try:
        (doc,) = [_Inspect.model_validate(d) for d in json.loads(stdout)]
    except (ValueError, ValidationError) as exc:
        raise LaneBootFailed(
            f"{node}: `docker container inspect` gave what is not one container: {str(exc)[:300]}"
        ) from None
    if not _IMAGE_ID.match(doc.Image):
        raise LaneBootFailed(
            f"{node}: container {doc.Name} reports image {doc.Image[:80]!r}, not a sha256 image ID"
        )
    labels = doc.Config.Labels or {}
    # What it was started from becomes a label and the `{tag}`
    # of a restore: a reference docker accepts, or the ID.
    ref = doc.Config.Image
    if (
        not _IMAGE_ID.match(ref)
        and _label(ref, lambda k, v: check_local_image_tag(k, str(v)), "image") is None
    ):
        ref = doc.Image
    return Container(
        node=node,
        name=doc.Name.removeprefix("/"),
        status=doc.State.Status,
        exit_code=doc.State.ExitCode,
        image_id=doc.Image,
        image_ref=ref,
        started_at=parse_docker_time(doc.State.StartedAt),
        rev=_label(labels.get(REV_LABEL), check_name, "rev"),
        tag=_label(labels.get(TAG_LABEL), lambda k, v: check_local_image_tag(k, str(v)), "tag"),
    )


def _label(value: str | None, rule: Any, kind: str) -> str | None:
    if value is None:
        return None
    try:
        return rule(f"container label {kind}", value)
    except (NameRefused, ValueError):
        return None  # a label someone else wrote: not ours to trust, and not needed


class Mark(Model):
    pattern: str
    line: str
    at: datetime | None  # the log line's timestamp (docker logs --timestamps)
    value: str | None = None  # the pattern's first group, e.g. the KV cache size


def readiness_marks(log: str, patterns: Iterable[str]) -> list[Mark]:
    """The readiness lines found in `log`, each pattern searched only after the previous one's line
    (the order is part of the contract: startup before
    the KV-cache line is not this server starting)."""
    lines = log.splitlines()
    found: list[Mark] = []
    start = 0
    for pattern in patterns:
        regex = re.compile(pattern)
        for i in range(start, len(lines)):
            stamp, _, text = lines[i].partition(" ")
            at = parse_docker_time(stamp)
            if at is None:  # a line without docker's timestamp prefix: match all of it
                text = lines[i]
            m = regex.search(text)
            if m:
                found.append(
                    Mark(
                        pattern=pattern,
                        line=text.strip()[:300],
                        at=at,
                        value=m.group(1) if m.groups() else None,
                    )
                )
                start = i + 1
                break
        else:
            return found
    return found


class _Model(Model):
    model_config = ConfigDict(extra="ignore")
    id: str


class _Models(Model):
    model_config = ConfigDict(extra="ignore")
    data: list[_Model] = Field(default_factory=list)


def lists_model(body: bytes, model: str) -> bool:
    """Whether an OpenAI-compatible `/v1/models` answer lists `model`."""
    try:
        return any(m.id == model for m in _Models.model_validate_json(body).data)
    except ValidationError:
        return False


# ---- the commands --------------------------------------------------------------------------------


def container_name(lane: LaneSection) -> str:
    return lane_container(lane.name)


def serve_argv(lane: LaneSection, *, tag: str, rank: int, head: str) -> list[str]:
    """The recipe's serve command for lane node `rank` (0 = the head), placeholders filled."""
    values = {
        "tag": tag,
        "model": lane.served_model,
        "port": lane.serve_port,
        "rank": rank,
        "nnodes": len(lane.nodes),
        "head": head,
    }
    words = [*lane.serve_command, *(lane.worker_args if rank else [])]
    return [w.format(**values) for w in words]


def docker_run_argv(
    lane: LaneSection, *, image: str, rev: str | None, tag: str, jit_dir: str, rank: int, head: str
) -> list[str]:
    """`docker run -d` of one lane node's serving container
    (host network: the head's port is the node's)."""
    labels = [f"{REV_LABEL}={rev}"] if rev else []
    argv = [
        "docker",
        "run",
        "-d",
        "--name",
        container_name(lane),
        "--network",
        "host",
        "--ipc",
        "host",
        *(["--gpus", lane.gpus] if lane.gpus else []),
        "-v",
        f"{jit_dir}:{lane.jit_cache_mount}",
    ]
    for key, value in (lane.serve_variables or {}).items():
        argv += ["-e", f"{key}={value}"]
    for label in [*labels, f"{TAG_LABEL}={tag}", f"lockstep.lane={lane.name}"]:
        argv += ["--label", label]
    return [*argv, image, *serve_argv(lane, tag=tag, rank=rank, head=head)]


# Resolves the site's JIT cache dir on the node (`~/` is the node user's home), creates it, and
# prints it, then its first entry if it has one (a populated cache: a warm start).
_JIT_PY = (
    'd="$1"; case "$d" in "~/"*) d="$HOME/${d#??}";; esac; '
    'mkdir -p -- "$d" && printf "%s\\n" "$d" && ls -A -- "$d" | head -n 1'
)
# The endpoint asked on the node where it is local; prints the body, exit 1 when nothing answers.
_MODELS_PY = (
    "import sys, urllib.request\n"
    "try:\n"
    "    sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=10).read())\n"
    "except Exception as exc:\n"
    "    print(exc, file=sys.stderr); sys.exit(1)\n"
)


class Lane:
    """The lane's nodes through SparkNodes: its
    container on each node, started, read and stopped."""

    def __init__(self, spark: SparkNodes, site: SiteConfig, lane: LaneSection, log: _Log) -> None:
        self.spark, self.site, self.lane, self.log = spark, site, lane, log
        self.name = container_name(lane)
        self.head = lane.nodes[0]

    def say(self, text: str) -> str:
        return redact(text, secret_values(self.site.secret_env_names()))

    def head_host(self) -> str:
        node = self.spark.node(self.head)
        return node.host if node.transport == "ssh" else "127.0.0.1"

    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.lane.serve_port}"  # as seen from the head node

    def inspect(self, node: str) -> Container | None:
        result = self.spark.run(
            node=node, argv=["docker", "container", "inspect", self.name], timeout_s=60
        )
        if result.exit_code != 0:
            if b"No such container" in result.stderr:
                return None
            raise LaneBootFailed(
                self.say(
                    f"{node}: docker container inspect {self.name}: {result.describe()}: "
                    f"{result.stderr.decode(errors='replace').strip()[-500:]}"
                )
            )
        return parse_container(node, result.stdout)

    def log_text(self, node: str, *, tail: int | None = None) -> str:
        # Both streams, in the order docker logged them: vLLM logs to stdout, uvicorn to stderr.
        script = 'exec docker logs --timestamps --tail "$2" "$1" 2>&1'
        result = self.spark.run(
            node=node,
            argv=["sh", "-c", script, "lockstep-logs", self.name, str(tail or "all")],
            timeout_s=120,
        )
        return self.say(result.text())

    def tail(self, node: str) -> str:
        return self.log_text(node, tail=_LOG_TAIL).strip() or "(the container logged nothing)"

    def remove(self) -> None:
        """Stop (gracefully: vLLM frees the GPU on SIGTERM) and remove the lane's container on every
        node; a node without one is fine."""
        for node in self.lane.nodes:
            for argv, limit in (
                (["docker", "stop", "-t", str(STOP_GRACE_S), self.name], STOP_GRACE_S + 60),
                (["docker", "rm", self.name], 60),
            ):
                result = self.spark.run(node=node, argv=argv, timeout_s=limit)
                if result.exit_code != 0 and b"No such container" in result.stderr:
                    break
                result.check()

    def jit_dirs(self) -> dict[str, tuple[str, bool]]:
        """Per node: the JIT cache dir as an absolute path, and whether it held anything (warm)."""
        out = {}
        for node in self.lane.nodes:
            result = self.spark.run(
                node=node,
                argv=["sh", "-c", _JIT_PY, "lockstep-jit", self.lane.jit_cache_dir],
                timeout_s=60,
            ).check()
            lines = result.text().splitlines()
            path = lines[0] if lines else ""
            if not path.startswith("/") or any(c in path for c in ":,\n"):
                raise LaneBootFailed(
                    f"{node}: the JIT cache dir {self.lane.jit_cache_dir!r} resolves to {path!r}, "
                    "not an absolute path docker can mount: set [jovian.lane] jit_cache_dir"
                )
            out[node] = (path, len(lines) > 1)
        return out

    def start(
        self, *, image: str, rev: str | None, tag: str, jit: dict[str, tuple[str, bool]]
    ) -> None:
        head = self.head_host()
        for rank, node in enumerate(self.lane.nodes):
            argv = docker_run_argv(
                self.lane, image=image, rev=rev, tag=tag, jit_dir=jit[node][0], rank=rank, head=head
            )
            result = self.spark.run(node=node, argv=argv, timeout_s=300)
            if result.exit_code != 0:
                raise LaneBootFailed(
                    self.say(
                        f"{node}: could not start {self.name} from {image}: {result.describe()}: "
                        f"{result.stderr.decode(errors='replace').strip()[-1000:]}"
                    )
                )

    def endpoint_lists_model(self) -> bool:
        url = f"{self.base_url()}/v1/models"
        result = self.spark.run(
            node=self.head, argv=["python3", "-c", _MODELS_PY, url], timeout_s=60
        )
        return result.exit_code == 0 and lists_model(result.stdout, self.lane.served_model)

    def wait_ready(
        self, *, budget_s: float, started: float, what: str, image_id: str
    ) -> dict[str, float]:
        """Poll every node's container (running, and running `image_id`) and the head's log until
        the endpoint serves; seconds to each mark. Anything
        else, or the budget running out, is a LaneBootFailed.
        A heartbeat every [timeouts] heartbeat_s says which
        readiness line it waits for, with the head's log tail."""
        deadline = started + budget_s
        patterns = self.lane.ready_patterns
        heartbeat = Heartbeat.for_site(
            self.site,
            f"lane boot of {what} on {self.lane.name}",
            budget_s=budget_s,
            log=self.log.info,
            started=started,
        )
        while True:
            states = {node: self.inspect(node) for node in self.lane.nodes}
            wrong = [
                f"{node} runs {s.image_id}"
                for node, s in states.items()
                if s is not None and s.image_id != image_id
            ]
            if wrong:
                raise LaneBootFailed(
                    f"{what}: {self.name} must run {image_id} (jovian/distributed_image), but "
                    + "; ".join(wrong)
                    + ": the tag points elsewhere on that node — distribute again"
                )
            for node, state in states.items():
                if state is None or state.status != "running":
                    said = (
                        "is gone"
                        if state is None
                        else f"{state.status} with exit code {state.exit_code}"
                    )
                    raise LaneBootFailed(
                        self.say(
                            f"{what}: container {self.name} on {node} {said} after "
                            f"{time.monotonic() - started:.0f}s, "
                            f"before it served; log tail:\n{self.tail(node)}"
                        )
                    )
            log = self.log_text(self.head)
            marks = readiness_marks(log, patterns)
            if len(marks) == len(patterns) and self.endpoint_lists_model():
                elapsed = round(time.monotonic() - started, 2)
                origin = states[self.head].started_at  # type: ignore[union-attr]
                seconds = {
                    m.pattern: round((m.at - origin).total_seconds(), 2)
                    if m.at and origin
                    else elapsed
                    for m in marks
                }
                return {**seconds, ENDPOINT: elapsed}
            waiting = (
                patterns[len(marks)]
                if len(marks) < len(patterns)
                else f"{self.base_url()}/v1/models"
            )
            if time.monotonic() > deadline:
                raise LaneBootFailed(
                    self.say(
                        f"{what}: {self.name} on {self.head} did not serve within its "
                        f"{budget_s:g}s budget (seen "
                        f"{len(marks)} of {len(patterns)} readiness lines; waiting for "
                        f"{waiting!r}); log tail:\n"
                        f"{self.tail(self.head)}"
                    )
                )
            heartbeat.beat(
                state=(
                    f"{len(marks)} of {len(patterns)} readiness lines seen, waiting for {waiting!r}"
                ),
                tail_lines=log.splitlines()[-TAIL_LINES:],
            )
            time.sleep(heartbeat.sleep_for(self.lane.serve_poll_s))


# ---- boot and restore ----------------------------------------------------------------------------


def served(lane: Lane) -> ServedImage | None:
    """What the lane serves now: the head's running container (None when nothing runs there)."""
    head = lane.inspect(lane.head)
    if head is None or head.status != "running":
        return None
    return ServedImage(
        rev=head.rev, tag=head.tag or head.image_ref, image_id=head.image_id, container=lane.name
    )


def _bring_up(
    lane: Lane, *, image: str, image_id: str, rev: str | None, tag: str, what: str
) -> tuple[dict[str, bool], float, dict[str, float]]:
    """Start `image` on every lane node and wait until it serves, running `image_id` everywhere;
    (node -> warm, budget, seconds to each mark). The caller cleans up when this raises."""
    jit = lane.jit_dirs()
    warm = {node: w for node, (_, w) in jit.items()}
    budget = lane.lane.warm_budget_s if all(warm.values()) else lane.lane.cold_budget_s
    started = time.monotonic()
    lane.start(image=image, rev=rev, tag=tag, jit=jit)
    lane.log.info(
        f"{what}: {lane.name} started on {', '.join(lane.lane.nodes)} "
        f"({'warm' if all(warm.values()) else 'cold'} JIT caches, budget {budget:g}s)"
    )
    return (
        warm,
        budget,
        lane.wait_ready(budget_s=budget, started=started, what=what, image_id=image_id),
    )


def boot_rev(
    context: Any,
    spark: SparkNodes,
    site: SiteConfig,
    lane_section: LaneSection,
    *,
    rev: str,
    tag: str,
    image_id: str,
) -> LaneServing:
    """Put `rev`'s image on the lane in place of what it serves, proven serving and proven the
    distributed image; on any failure put the previous image back (recorded) and raise."""
    lane = Lane(spark, site, lane_section, context.log)
    previous = served(lane)
    lane.remove()
    what = f"{rev} ({tag})"
    try:
        warm, budget, seconds = _bring_up(
            lane, image=tag, image_id=image_id, rev=rev, tag=tag, what=what
        )
    except Exception as exc:  # whatever stopped the boot, the rev must not stay on the lane
        failed = LaneServing(
            rev=rev,
            lane=lane_section.name,
            tag=tag,
            image_id=image_id,
            nodes={},
            bench_node=lane.head,
            base_url=lane.base_url(),
            model=lane_section.served_model,
            container=lane.name,
            warm=False,
            previous=previous,
        )
        try:
            _put_back(context, lane, failed, reason=f"boot of {rev} failed")
        except LockstepError as again:
            raise LaneBootFailed(f"{exc}\nPutting the lane back failed too: {again}") from None
        if not isinstance(exc, LockstepError):
            raise
        raise LaneBootFailed(
            f"{exc}\nThe lane was put back to "
            f"{_said(previous) if previous else 'nothing (it served nothing before)'}"
        ) from None
    # wait_ready saw every node's container run it
    ids = dict.fromkeys(lane_section.nodes, image_id)
    serving = LaneServing(
        rev=rev,
        lane=lane_section.name,
        tag=tag,
        image_id=image_id,
        nodes=ids,
        bench_node=lane.head,
        base_url=lane.base_url(),
        model=lane_section.served_model,
        container=lane.name,
        warm=all(warm.values()),
        seconds_to=seconds,
        previous=previous,
        jit_warm=warm,
        budget_s=budget,
    )
    context.log_event(
        lane_record(
            site,
            action="boot",
            now=ServedImage(rev=rev, tag=tag, image_id=image_id, container=lane.name),
            nodes=ids,
            reason=f"booted {rev} for its bench",
            before=previous,
        )
    )
    return serving


def restore_previous(
    context: Any,
    spark: SparkNodes,
    site_config: SiteConfig,
    serving: LaneServing,
    *,
    reason: str = "the rev failed its gate",
) -> ServedImage | None:
    """Stop the rev's container and serve `serving.previous` again the same way (its image by ID),
    waiting until it serves; record the lane's new state in `jovian/lane`. None: the lane served
    nothing before, so it is left empty. Raises LaneBootFailed when the previous image does not come
    back (the lane is then left empty, and that is recorded too)."""
    if site_config.jovian is None or site_config.jovian.lane is None:
        raise LaneBootFailed(f"{site_config.path}: no [jovian.lane]: no lane to put back")
    lane = Lane(spark, site_config, site_config.jovian.lane, context.log)
    return _put_back(context, lane, serving, reason=reason)


def _put_back(context: Any, lane: Lane, serving: LaneServing, *, reason: str) -> ServedImage | None:
    lane.remove()
    before = ServedImage(
        rev=serving.rev, tag=serving.tag, image_id=serving.image_id, container=serving.container
    )
    previous = serving.previous
    if previous is None:
        context.log_event(
            lane_record(
                lane.site,
                action="stop",
                now=None,
                nodes={},
                before=before,
                reason=f"{reason}; the lane served nothing before, so it serves nothing now",
            )
        )
        return None
    what = f"restore of {_said(previous)}"
    try:
        _, _, seconds = _bring_up(
            lane,
            image=previous.image_id,
            image_id=previous.image_id,
            rev=previous.rev,
            tag=previous.tag,
            what=what,
        )
    except LockstepError as exc:
        lane.remove()
        context.log_event(
            lane_record(
                lane.site,
                action="stop",
                now=None,
                nodes={},
                before=before,
                reason=f"{reason}; {what} failed, the lane serves nothing: {exc}",
            )
        )
        raise LaneBootFailed(f"{what} failed, the lane serves nothing now: {exc}") from None
    lane.log.info(f"{what}: serving again after {seconds.get(ENDPOINT, 0):g}s")
    ids = dict.fromkeys(lane.lane.nodes, previous.image_id)
    context.log_event(
        lane_record(
            lane.site, action="restore", now=previous, nodes=ids, before=before, reason=reason
        )
    )
    return previous


def _said(image: ServedImage) -> str:
    return f"{image.tag} ({image.rev or 'not booted by lockstep'}, {image.image_id[:19]})"


# ---- the lane's history --------------------------------------------------------------------------


class LaneState(Model):
    """One record of `jovian/lane`: what the lane serves after a boot, a restore or a stop."""

    action: Literal["boot", "restore", "stop"]
    rev: str | None
    tag: str | None
    image_id: str | None
    nodes: dict[str, str]
    reason: str
    before_image_id: str | None
    at: float | None = None


def lane_record(
    site: SiteConfig,
    *,
    action: str,
    now: ServedImage | None,
    nodes: dict[str, str],
    reason: str,
    before: ServedImage | None,
) -> dg.AssetMaterialization:
    summary = (
        f"**{action}**: the lane serves "
        + (
            f"`{now.tag}` ({now.rev or 'not booted by lockstep'}) `{now.image_id}`"
            if now
            else "nothing"
        )
        + f"\n\nbefore: {_said(before) if before else 'nothing'}"
        f"\n\n{reason}"
    )
    return dg.AssetMaterialization(
        asset_key=LANE,
        metadata={
            "action": dg.MetadataValue.text(action),
            "rev": dg.MetadataValue.text((now.rev or "") if now else ""),
            "tag": dg.MetadataValue.text(now.tag if now else ""),
            "image_id": dg.MetadataValue.text(now.image_id if now else ""),
            "nodes": dg.MetadataValue.json(nodes),
            "reason": dg.MetadataValue.text(
                redact(reason, secret_values(site.secret_env_names()))[:2000]
            ),
            "before_image_id": dg.MetadataValue.text(before.image_id if before else ""),
            "summary": dg.MetadataValue.md(
                redact(summary, secret_values(site.secret_env_names()))[:4000]
            ),
        },
        tags={"dagster/data_version": now.image_id if now else "none"},
    )


def lane_history(instance: dg.DagsterInstance, limit: int = 100) -> list[LaneState]:
    """`jovian/lane`'s records, newest first."""
    out = []
    for record in instance.fetch_materializations(LANE, limit=limit).records:
        event = record.asset_materialization
        assert event is not None
        m = {k: getattr(v, "value", getattr(v, "data", None)) for k, v in event.metadata.items()}
        out.append(
            LaneState(
                action=str(m["action"]),
                rev=str(m.get("rev") or "") or None,  # type: ignore[arg-type]
                tag=str(m.get("tag") or "") or None,
                image_id=str(m.get("image_id") or "") or None,
                nodes=dict(m.get("nodes") or {}),
                reason=str(m.get("reason") or ""),  # type: ignore[arg-type]
                before_image_id=str(m.get("before_image_id") or "") or None,
                at=record.timestamp,
            )
        )
    return out
