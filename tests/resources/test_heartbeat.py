"""Heartbeats of long steps (resources/heartbeat.py): how often a line comes (a fake clock), what it
holds, and that a log tail is masked, stripped of control characters and bounded; the Jovian build's
wait loop and a distribution's stream beat through it; [timeouts] heartbeat_s is range-checked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from jovian_assets import node_build
from jovian_assets.node_build import wait_detached
from resources.errors import FileFormatError
from resources.heartbeat import (
    MAX_EVERY_S,
    TAIL_LINE_CHARS,
    TAIL_MARK,
    Heartbeat,
    duration,
    heartbeat_line,
)
from resources.site.load import load_site
from resources.spark import DetachedHandle, DetachedState, SparkNodes
from tests.support.site_text import GOOD

SECRET = "ghp_s3cr3tT0kenValue1234"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def beating(every_s: float = 60.0, **kwargs: object) -> tuple[Heartbeat, Clock, list[str]]:
    clock, lines = Clock(), []
    beat = Heartbeat(
        "build job /u/tpu-build-abc",
        budget_s=7200,
        log=lines.append,
        every_s=every_s,
        clock=clock,
        **kwargs,
    )  # type: ignore[arg-type]
    return beat, clock, lines


# ---- how often ---------------------------------------------------------------------------------


def test_polled_every_second_it_writes_one_line_per_interval_never_more() -> None:
    beat, clock, lines = beating(60)
    times = []
    for _ in range(3600):  # an hour of one-second polls
        if beat.beat(state="running"):
            times.append(clock.now)
        clock.sleep(1)
    # at 60 s, 120 s, ... 3540 s: the start itself has its own line
    assert len(lines) == len(times) == 59
    gaps = [b - a for a, b in zip([beat.started, *times], times, strict=False)]
    assert min(gaps) >= 60 and max(gaps) <= 61


def test_a_loop_that_polls_every_ten_minutes_still_beats_at_least_every_five() -> None:
    """A slow poll (iris poll_max_s = 600, say) sleeps only until the next line is due."""
    beat, clock, _lines = beating(MAX_EVERY_S)
    times = []
    while clock.now - beat.started <= 3 * 3600:
        if beat.beat(state="running"):
            times.append(clock.now)
        clock.sleep(beat.sleep_for(600))
    gaps = [b - a for a, b in zip([beat.started, *times], times, strict=False)]
    assert len(times) == 36 and max(gaps) <= MAX_EVERY_S and min(gaps) >= MAX_EVERY_S


def test_due_in_counts_down_and_resets_after_a_line() -> None:
    beat, clock, _ = beating(60)
    assert beat.due_in() == 60 and beat.sleep_for(5) == 5
    clock.sleep(45)
    assert beat.due_in() == 15 and beat.sleep_for(30) == 15
    clock.sleep(20)
    assert beat.due_in() == 0 and beat.beat(state="running") is not None
    assert beat.due_in() == 60 and beat.count == 1


@pytest.mark.parametrize("every_s", [0, -1, MAX_EVERY_S + 1])
def test_an_interval_outside_the_bound_is_refused(every_s: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        Heartbeat("x", budget_s=None, log=print, every_s=every_s)


# ---- what a line holds -------------------------------------------------------------------------


def test_a_line_names_the_step_its_state_elapsed_against_budget_bytes_and_the_tail() -> None:
    beat, clock, lines = beating(60)
    clock.sleep(12 * 60 + 3)
    line = beat.beat(
        state="running",
        bytes_moved=1288490189,
        tail_lines=["step 3/9 : RUN uv sync", "Resolved 212 packages"],
    )
    assert (
        line
        == lines[0]
        == (
            "heartbeat: build job /u/tpu-build-abc: running, 12m03s of 2h00m, 1.2 GiB moved\n"
            f"{TAIL_MARK}\n  | step 3/9 : RUN uv sync\n  | Resolved 212 packages"
        )
    )


def test_without_budget_bytes_or_tail_the_line_says_so_briefly() -> None:
    assert heartbeat_line(
        step="distribution of img:r1", state="streaming", elapsed_s=45, budget_s=None
    ) == ("heartbeat: distribution of img:r1: streaming, 45s (no total budget)")
    assert heartbeat_line(
        step="s", state="pending", elapsed_s=3 * 3600 + 61, budget_s=4 * 3600, tail=[]
    ).endswith(f"3h01m of 4h00m\n{TAIL_MARK} (no lines yet)")
    assert [duration(s) for s in (0, 59.9, 60, 3599, 3600, 90061)] == [
        "0s",
        "59s",
        "1m00s",
        "59m59s",
        "1h00m",
        "25h01m",
    ]


def test_the_tail_is_read_only_when_a_line_is_due_and_a_failed_read_is_shown_not_raised() -> None:
    beat, clock, lines = beating(60, secrets=[SECRET])
    reads = []

    def tail() -> list[str]:
        reads.append(clock.now)
        raise OSError(f"ssh: connection reset reading the log (token {SECRET})")

    for _ in range(150):
        beat.beat(state="running", tail_lines=tail)
        clock.sleep(1)
    # not once per poll: a log read costs a call to the cluster or node
    assert len(reads) == len(lines) == 2
    assert lines[0].endswith(
        f"{TAIL_MARK} (unavailable: OSError: ssh: connection reset reading the log (token ***))"
    )
    assert SECRET not in "".join(lines)


# ---- the tail is untrusted text ----------------------------------------------------------------


def test_a_secret_in_the_tail_or_the_state_is_masked_even_split_by_a_control_character() -> None:
    half = len(SECRET) // 2
    line = heartbeat_line(
        step="build",
        state=f"pending: pulling with {SECRET}",
        elapsed_s=61,
        budget_s=600,
        secrets=[SECRET],
        tail=[
            f"+ echo {SECRET}",
            f"+ docker login -p {SECRET[:half]}\x00{SECRET[half:]}",
            "fetching https://bot:hunter2hunter2@github.com/org/repo.git",
        ],
    )
    assert SECRET not in line and SECRET[:half] + SECRET[half:] not in line
    assert (
        line.count("***") == 4
        and "hunter2" not in line
        and "https://***@github.com/org/repo.git" in line
    )


def test_control_and_format_characters_are_stripped_and_each_line_bounded() -> None:
    hostile = [
        "the seventh line from the end: not shown",
        # a carriage return redraws a terminal line: two lines here
        "progress 10%\rprogress 100%\x08\x07",
        "\x1b[31mERROR\x1b[0m red only in a terminal \x1b]0;owned title\x07after the title",
        "invoice \u202egnp.exe\u202c and a zero\u200bwidth space",
        "tab\there\x00nul\x7fdel\x9bc1",
        "x" * 5000,
    ]
    line = heartbeat_line(
        step="build", state="running\nfaked: succeeded", elapsed_s=61, budget_s=600, tail=hostile
    )
    head, mark, *tail = line.split("\n")
    # a state cannot start a line
    assert head == "heartbeat: build: runningfaked: succeeded, 1m01s of 10m00s"
    assert mark == TAIL_MARK and len(tail) == 5  # the last five
    shown = "\n".join(tail)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown.replace("\n", ""))
    assert (
        "\u202e" not in shown
        and "\u200b" not in shown
        and "owned title" not in shown
        and "seventh" not in shown
    )
    assert (
        tail[0] == "  | progress 100%"
        and tail[1] == "  | ERROR red only in a terminal after the title"
    )
    assert (
        tail[2] == "  | invoice gnp.exe and a zerowidth space" and tail[3] == "  | tab herenuldel1"
    )
    assert tail[4] == "  | " + "x" * (TAIL_LINE_CHARS - 1) + "…"


def test_a_tail_of_blank_lines_and_embedded_newlines_keeps_the_last_real_lines() -> None:
    line = heartbeat_line(
        step="s",
        state="running",
        elapsed_s=60,
        budget_s=None,
        tail=["a\nb", "", "   ", "c\r\nd", "e", "f"],
    )
    assert line.split("\n")[2:] == ["  | b", "  | c", "  | d", "  | e", "  | f"]


# ---- wired into the wait loops -----------------------------------------------------------------


class FakeNode:
    """A detached build on a node that runs for `polls`
    polls, writing a line per poll to its log."""

    def __init__(self, polls: int) -> None:
        self.polls, self.seen, self.tails = polls, 0, 0

    def poll(self, *, handle: DetachedHandle) -> DetachedState:
        self.seen += 1
        return (
            DetachedState(state="running")
            if self.seen < self.polls
            else DetachedState(state="exited", exit_code=0)
        )

    def tail(self, *, handle: DetachedHandle, lines: int = 40) -> str:
        self.tails += 1
        return "".join(f"[{n}/{self.polls}] building with {SECRET}\n" for n in range(self.seen))[
            -lines * 60 :
        ]


def test_the_node_builds_wait_beats_with_the_build_logs_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(node_build, "time", SimpleNamespace(monotonic=clock, sleep=clock.sleep))
    node = FakeNode(polls=40)
    lines: list[str] = []
    beat = Heartbeat(
        "build of img:r1 on spark-a",
        budget_s=4 * 3600,
        log=lines.append,
        every_s=60,
        clock=clock,
        secrets=[SECRET],
    )
    handle = DetachedHandle(
        node="spark-a",
        pid=4242,
        log="lockstep-builds/r1/abc/build.log",
        exit_file="lockstep-builds/r1/abc/build.log.exit",
        started_at="2026-12-06T00:00:00Z",
        tag="t",
    )
    # poll_s 600: longer than a heartbeat may wait; the
    # loop still sleeps only until the next line is due.
    assert wait_detached(node, handle, timeout_s=4 * 3600, poll_s=600, heartbeat=beat) == 0  # type: ignore[arg-type]
    elapsed = clock.now - beat.started
    assert len(lines) == node.tails >= 5 and int(elapsed // 60) - 1 <= len(lines) <= int(
        elapsed // 60
    )
    assert lines[0].startswith(
        "heartbeat: build of img:r1 on spark-a: running (pid 4242 on spark-a, log "
        "lockstep-builds/r1/abc/build.log), 1m00s of 4h00m\n" + TAIL_MARK
    )
    assert "building with ***" in lines[-1] and SECRET not in "".join(lines)


def test_a_distribution_stream_reports_the_bytes_it_moved(tmp_path: Path) -> None:
    (tmp_path / "a" / "bin").mkdir(parents=True)
    (tmp_path / "b" / "bin").mkdir(parents=True)
    spark = SparkNodes(
        nodes=[{"name": n, "transport": "local", "root": str(tmp_path / n)} for n in ("a", "b")],
        command_timeout_s=60.0,
    )
    seen: list[int] = []
    try:
        result = spark.pipe(
            src="a",
            src_argv=["head", "-c", str(8 << 20), "/dev/zero"],
            dsts=["b"],
            dst_argv=["sh", "-c", "cat > out"],
            progress=seen.append,
        )
    finally:
        spark.close()
    assert seen and seen == sorted(seen) and seen[-1] == result.src.bytes == 8 << 20
    assert (tmp_path / "b" / "out").stat().st_size == 8 << 20


# ---- the site key ------------------------------------------------------------------------------


def test_heartbeat_s_defaults_to_a_minute_and_is_range_checked_naming_the_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "site.toml"
    path.write_text(GOOD)
    assert load_site(path).timeouts.heartbeat_s == 60
    path.write_text(GOOD + "\n[timeouts]\nheartbeat_s = 2\n")
    assert load_site(path).timeouts.heartbeat_s == 2
    for bad in ("0.5", "301"):
        path.write_text(GOOD + f"\n[timeouts]\nheartbeat_s = {bad}\n")
        with pytest.raises(FileFormatError) as info:
            load_site(path)
        assert f"{path}:12: [timeouts] heartbeat_s" in str(info.value) and f"(got {bad})" in str(
            info.value
        )


def test_a_stream_that_stalls_completely_still_beats_from_the_covering_thread_and_stops_with_it() -> (  # noqa: E501
    None
):
    """A stalled `docker save | docker load` blocks in a read and calls no progress callback: the
    heartbeat's thread writes the lines (the byte
    count standing still), and none after the block."""
    import threading
    import time

    lines: list[str] = []
    beat = Heartbeat("distribution of lab/img:r1", budget_s=None, log=lines.append, every_s=0.05)
    stalled = threading.Event()
    with beat.covering(state="docker save -> docker load", bytes_moved=lambda: 4096, poll_s=0.01):
        stalled.wait(0.6)  # the read that never returns (until its timeout): nothing else beats
    ended = len(lines)
    time.sleep(0.2)
    assert ended >= 2, lines  # 0.6 s at one line per 0.05 s: a loaded machine still gets two in
    assert all("docker save -> docker load" in line and "4.0 KiB moved" in line for line in lines)
    assert len(lines) == ended, "the thread stops when the stream ends"


def test_a_distribution_whose_save_stalls_still_beats(tmp_path: Path) -> None:
    """distribute_image over real local nodes whose
    `docker save` says nothing for a while (a stalled
    stream): heartbeat lines come anyway, then the image IDs are compared as always."""
    image_id = "sha256:" + "ab" * 32
    fake_docker = (
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  save) sleep 0.8; head -c 2048 /dev/zero ;;\n"
        "  load) cat > /dev/null ;;\n"
        f'  image) printf \'[{{"Id": "{image_id}"}}]\' ;;\n'
        "esac\n"
    )
    for node in ("build", "lane-a"):
        (tmp_path / node / "bin").mkdir(parents=True)
        script = tmp_path / node / "bin" / "docker"
        script.write_text(fake_docker)
        script.chmod(0o755)
    spark = SparkNodes(
        nodes=[
            {"name": n, "transport": "local", "root": str(tmp_path / n)}
            for n in ("build", "lane-a")
        ],
        command_timeout_s=60.0,
    )
    lines: list[str] = []
    image = node_build.NodeImage(
        rev="r1",
        tag="lab/img:r1",
        node="build",
        image_id=image_id,
        build_dir_checksum="x",
        duration_s=1.0,
    )
    try:
        done = node_build.distribute_image(
            spark,
            image,
            nodes=["lane-a"],
            mode="star",
            heartbeat=Heartbeat(
                "distribution of lab/img:r1", budget_s=None, log=lines.append, every_s=0.1
            ),
        )
    finally:
        spark.close()
    assert done.nodes == {"lane-a": image_id} and done.bytes == 2048
    # beats while nothing moved
    assert len([line for line in lines if "0 B moved" in line]) >= 2, lines
