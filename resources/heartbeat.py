"""Heartbeats of long steps: one log line now and then while lockstep waits on something slow.

A kaniko job on iris, a detached build on a DGX node, a lane boot and an image distribution each run
for minutes to hours; between their start and end lines a run's log would otherwise say nothing, and
a person cannot tell a slow step from a stuck one. Each wait loop calls `Heartbeat.beat` on every
poll; a line is written only when one is due: never more often than `every_s`, and the loops sleep
no longer than `due_in()`, so one comes at least
every `every_s` (at most MAX_EVERY_S) while they run.

A line holds the step, its state, the time it has run against its budget, the bytes moved when
known, and the last few lines of the job's or build's log. That tail is untrusted text someone
else's process printed: it is masked (resources/secrets.py), stripped of control and format
characters (a terminal escape or a bidi override must not rewrite what the reader sees) and bounded,
and it is marked as information: the step's verdict comes from its state, never from a log line.

`heartbeat_line` is the pure formatting; `Heartbeat` holds the clock logic; `observe_start` puts
what a person needs to follow a step (a job id, a log's path) on the asset while it still runs.
"""

from __future__ import annotations

import re
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dagster as dg

from resources.secrets import redact, secret_values

if TYPE_CHECKING:
    from resources.site.schema import SiteConfig

# 60 s: a person watching a run sees it move within a minute, and an hour-long build writes sixty
# lines, not thousands; each line may cost one extra log read on the cluster or node (the tail).
DEFAULT_EVERY_S = 60.0
# The bound: never five minutes without a line
# while a long step runs ([timeouts] heartbeat_s).
MAX_EVERY_S = 300.0
TAIL_LINES = 5
TAIL_LINE_CHARS = 200
STATE_CHARS = 300
TAIL_MARK = "log tail (information, not a verdict):"

# CSI/OSC escape sequences whole (their ESC alone would leave "[31m" behind), then any other
# character of Unicode category Cc (controls), Cf (format: bidi overrides, zero-width), Zl, Zp.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]"
)
_DROPPED = frozenset({"Cc", "Cf", "Zl", "Zp"})

TailSource = Sequence[str] | Callable[[], Sequence[str]] | None


def duration(seconds: float) -> str:
    """`45s`, `12m03s`, `2h00m`: as a person reads a step's time."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def size(n: int) -> str:
    """`512 B`, `3.4 MiB`, `1.2 GiB`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable: GiB ends the loop


def clean_text(text: str, secrets: Iterable[str] = (), *, limit: int = TAIL_LINE_CHARS) -> str:
    """One line of untrusted text fit for a log: masked, without escapes, controls or format
    characters (a tab becomes a space), at most `limit` characters."""
    secrets = list(secrets)
    # Masked before and after the strip: a secret with a control
    # character spliced into it is whole again only after.
    text = redact(text, secrets)
    text = _ESCAPES.sub("", text).replace("\t", " ")
    text = "".join(c for c in text if unicodedata.category(c) not in _DROPPED)
    text = redact(text, secrets).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_tail(
    lines: Iterable[str],
    secrets: Iterable[str] = (),
    *,
    keep: int = TAIL_LINES,
    limit: int = TAIL_LINE_CHARS,
) -> list[str]:
    """The last `keep` non-empty lines of `lines`, each through `clean_text`."""
    secrets = list(secrets)
    split = [part for line in lines for part in str(line).splitlines()]  # a "line" may hold several
    cleaned = [clean_text(line, secrets, limit=limit) for line in split[-4 * keep :]]
    return [line for line in cleaned if line][-keep:]


def heartbeat_line(
    *,
    step: str,
    state: str,
    elapsed_s: float,
    budget_s: float | None,
    bytes_moved: int | None = None,
    tail: Sequence[str] | None = None,
    tail_error: str = "",
    secrets: Iterable[str] = (),
) -> str:
    """The heartbeat's text: ``heartbeat: STEP: STATE,
    12m03s of 2h00m, 1.2 GiB moved``, then the log
    tail, each line indented under TAIL_MARK (or why it could not be read)."""
    secrets = list(secrets)
    budget = f" of {duration(budget_s)}" if budget_s else " (no total budget)"
    moved = f", {size(bytes_moved)} moved" if bytes_moved is not None else ""
    head = (
        f"heartbeat: {clean_text(step, secrets, limit=STATE_CHARS)}: "
        f"{clean_text(state, secrets, limit=STATE_CHARS)}, "
        f"{duration(elapsed_s)}{budget}{moved}"
    )
    if tail_error:
        return (
            f"{head}\n{TAIL_MARK} (unavailable: "
            f"{clean_text(tail_error, secrets, limit=STATE_CHARS)})"
        )
    if tail is None:
        return head
    lines = clean_tail(tail, secrets)
    return f"{head}\n{TAIL_MARK}" + (
        "".join(f"\n  | {line}" for line in lines) if lines else " (no lines yet)"
    )


class Heartbeat:
    """The heartbeat of one long step: `beat` on every
    poll of its wait loop, sleep at most `due_in()`.

    `clock` is monotonic seconds (injectable for tests); `started` defaults to its reading now, or
    is the moment the step began when that was earlier (a lane's start before its wait). `log` takes
    the finished line (`context.log.info`). `secrets` are values to mask in anything the line shows.
    """

    def __init__(
        self,
        step: str,
        *,
        budget_s: float | None,
        log: Callable[[str], Any],
        every_s: float = DEFAULT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        secrets: Iterable[str] = (),
        started: float | None = None,
    ) -> None:
        if not 0 < every_s <= MAX_EVERY_S:
            raise ValueError(
                f"a heartbeat's interval must be in (0, {MAX_EVERY_S:g}] seconds, not {every_s!r}"
            )
        self.step, self.budget_s, self.log, self.every_s, self.clock = (
            step,
            budget_s,
            log,
            every_s,
            clock,
        )
        self.secrets = list(secrets)
        self.started = clock() if started is None else started
        # the first line comes one interval after the start: the start has its own line
        self.last = self.started
        self.count = 0
        self._lock = threading.Lock()  # `covering`'s thread and the step's own beats share `last`

    @classmethod
    def for_site(
        cls,
        site: SiteConfig,
        step: str,
        *,
        budget_s: float | None,
        log: Callable[[str], Any],
        started: float | None = None,
    ) -> Heartbeat:
        """A step's heartbeat as a site wants it: every
        [timeouts] heartbeat_s, the site's secrets masked."""
        return cls(
            step,
            budget_s=budget_s,
            log=log,
            every_s=site.timeouts.heartbeat_s,
            started=started,
            secrets=secret_values(site.secret_env_names()),
        )

    def due_in(self) -> float:
        """Seconds until the next line is due (0 when it is): the longest a wait loop may sleep."""
        return max(0.0, self.last + self.every_s - self.clock())

    def sleep_for(self, delay: float) -> float:
        """`delay`, or less when the next line is due sooner: what a wait loop sleeps."""
        return min(delay, self.due_in())

    def beat(
        self, *, state: str, bytes_moved: int | None = None, tail_lines: TailSource = None
    ) -> str | None:
        """Write a line when one is due and return it; otherwise nothing (None). `tail_lines` may be
        a callable: it is called only when a line is due (reading a log costs a call to the cluster
        or node), and whatever it raises is shown as
        the tail's absence, never raised: a heartbeat is
        information and must not end the step it reports on."""
        with self._lock:
            now = self.clock()
            if now - self.last < self.every_s:
                return None
            # claimed before the (slow) tail read: a concurrent beat does not write a second line
            self.last = now
        tail: Sequence[str] | None
        error = ""
        if callable(tail_lines):
            try:
                tail = tail_lines()
            except Exception as exc:  # noqa: BLE001 - any failure of an information read: show it, go on
                tail, error = None, f"{type(exc).__name__}: {exc}"
        else:
            tail = tail_lines
        line = heartbeat_line(
            step=self.step,
            state=state,
            elapsed_s=now - self.started,
            budget_s=self.budget_s,
            bytes_moved=bytes_moved,
            tail=tail,
            tail_error=error,
            secrets=self.secrets,
        )
        self.count += 1
        self.log(line)
        return line

    @contextmanager
    def covering(
        self,
        *,
        state: str,
        bytes_moved: Callable[[], int | None] = lambda: None,
        poll_s: float = 1.0,
    ) -> Iterator[None]:
        """Beat from a thread while the block runs, for a step that beats only when something moves
        (a stream's progress callback): a stream that stalls completely blocks in a read, and the
        step would be silent until it moved again or its
        timeout ended it. The thread checks every `poll_s`
        (or sooner when a line is due) and beats when one
        is due, saying how many bytes moved so far."""
        stop = threading.Event()

        def keep_beating() -> None:
            while not stop.wait(min(poll_s, max(0.01, self.due_in()))):
                # a stall reads as the same byte count twice
                self.beat(state=state, bytes_moved=bytes_moved())

        thread = threading.Thread(
            target=keep_beating, name=f"heartbeat: {self.step}"[:60], daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)


def observe_start(context: Any, facts: Mapping[str, str], *, what: str) -> None:
    """Put `facts` (an iris job id, the node and path of a build's log) on the step's asset NOW,
    while it runs: an AssetObservation of its asset
    and partition (the run's log and the asset's Events
    show it at once; an Output's metadata would wait for the end), and the same as one log line."""
    partition = context.partition_key if context.has_partition_key else None
    context.log_event(
        dg.AssetObservation(
            asset_key=context.asset_key,
            partition=partition,
            metadata={k: dg.MetadataValue.text(v) for k, v in facts.items()},
        )
    )
    context.log.info(f"{what}: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
