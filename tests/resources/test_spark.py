"""SparkNodes against a real OpenSSH sshd on 127.0.0.1 and against local nodes.

One sshd is started for the module (tests/support/sshd_server.py: its own host key, a
passphrase-protected client key, known_hosts, stopped by PID). Behaviour that both transports share
is parametrized over `ssh` (three node names on that sshd) and `local` (three node roots under tmp).
Everything runs on this machine, so what a "node" wrote is checked directly on disk.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from resources.site.load import load_site
from resources.spark import (
    ConnectionLost,
    DetachedHandle,
    DetachedState,
    HostKeyRefused,
    PipeFailed,
    SparkError,
    SparkNodes,
    local_manifest,
    spark_for,
)
from tests.support.sshd_server import (
    PASSPHRASE,
    PASSPHRASE_ENV,
    SshdServer,
    known_hosts_line,
    start_sshd,
    stop_sshd,
)

NODES = ["n1", "n2", "n3"]
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        stop_sshd(server)


@pytest.fixture(autouse=True)
def passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSPHRASE_ENV, PASSPHRASE)


def ssh_nodes(sshd: SshdServer, **overrides: object) -> SparkNodes:
    fields: dict[str, object] = {
        "nodes": [sshd.node(n) for n in NODES], "known_hosts": str(sshd.known_hosts),
        "key_path": str(sshd.client_key), "passphrase_env": PASSPHRASE_ENV,
        "connect_timeout_s": 10.0, "command_timeout_s": 60.0, "keepalive_s": 5,
    }  # fmt: skip
    fields.update(overrides)
    return SparkNodes(**fields)


def local_nodes(root: Path) -> SparkNodes:
    nodes = []
    for n in NODES:
        (root / n / "bin").mkdir(parents=True)
        nodes.append({"name": n, "transport": "local", "root": str(root / n)})
    return SparkNodes(nodes=nodes, passphrase_env=PASSPHRASE_ENV, command_timeout_s=60.0)


@pytest.fixture(params=["ssh", "local"])
def spark(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SparkNodes]:
    if request.param == "ssh":
        nodes = ssh_nodes(request.getfixturevalue("sshd"))
    else:
        nodes = local_nodes(tmp_path / "nodes")
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def ssh_spark(sshd: SshdServer) -> Iterator[SparkNodes]:
    nodes = ssh_nodes(sshd)
    try:
        yield nodes
    finally:
        nodes.close()


def wait_for_exit(
    spark: SparkNodes, handle: DetachedHandle, timeout_s: float = 30.0
) -> DetachedState:
    deadline = time.monotonic() + timeout_s
    while (state := spark.poll(handle=handle)).state == "running":
        assert time.monotonic() < deadline, f"{handle} still running after {timeout_s}s"
        time.sleep(0.1)
    return state


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(MiB):
            digest.update(block)
    return digest.hexdigest()


# ---- run -----------------------------------------------------------------------------------------


def test_run_returns_stdout_stderr_and_exit_code(spark: SparkNodes) -> None:
    result = spark.run(
        node="n1", argv=["sh", "-c", "echo built; echo 'warning: cache miss' >&2; exit 3"]
    )
    assert (result.exit_code, result.stdout, result.stderr) == (
        3,
        b"built\n",
        b"warning: cache miss\n",
    )
    assert result.node == "n1" and result.argv[0] == "sh" and result.duration_s >= 0
    assert (
        "n1" in result.describe()
        and "exit 3" in result.describe()
        and "with no output" not in result.describe()
    )
    with pytest.raises(SparkError, match=r"exit 3.*\n.*warning: cache miss"):
        result.check()


def test_run_feeds_stdin_and_applies_cwd_and_env(spark: SparkNodes, tmp_path: Path) -> None:
    work = tmp_path / "build dir"
    work.mkdir()
    data = os.urandom(3 * MiB)
    result = spark.run(node="n2", argv=["sha256sum"], stdin=data)
    assert result.check().text().split()[0] == hashlib.sha256(data).hexdigest()
    result = spark.run(node="n2", argv=["sh", "-c", 'pwd; echo "$TAG/$PROFILE"'], cwd=str(work),
                       env={"TAG": "jovian-judgement:r28-glm53", "PROFILE": "r28"})  # fmt: skip
    assert result.check().text() == f"{work}\njovian-judgement:r28-glm53/r28\n"


def test_silent_exit_120_is_described_as_exit_with_no_output(spark: SparkNodes) -> None:
    # The runbook's dead pipe pump: tool-eval-bench died
    # on its first stderr write, exit 120, empty log.
    result = spark.run(node="n1", argv=["sh", "-c", "exit 120"])
    assert result.exit_code == 120 and result.silent
    assert "exit 120 with no output" in result.describe()
    assert "n1" in result.describe() and "pipe pump" in str(result)
    with pytest.raises(SparkError, match="exit 120 with no output"):
        result.check()


def test_command_killed_by_a_signal_reports_128_plus_signal(spark: SparkNodes) -> None:
    # A build killed by the OOM reaper must not look like a clean exit or a lost connection.
    result = spark.run(node="n1", argv=["sh", "-c", "kill -9 $$"])
    assert result.exit_code == 137


def test_run_timeout_is_an_error_naming_the_limit(spark: SparkNodes) -> None:
    started = time.monotonic()
    with pytest.raises(SparkError, match=r"did not finish within 1s.*start_detached"):
        spark.run(node="n1", argv=["sleep", "30"], timeout_s=1)
    assert time.monotonic() - started < 10


def test_hostile_names_are_names_never_commands(spark: SparkNodes, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    touched = [tmp_path / f"x-{tag}", tmp_path / f"y-{tag}", tmp_path / f"z-{tag}"]
    evil_dir = f"r28; touch {touched[0]}"
    evil_tag = f"$(touch {touched[1]})"
    evil_tick = f"`touch {touched[2]}`"
    work = tmp_path / evil_dir

    assert spark.run(node="n1", argv=["mkdir", "-p", str(work)]).ok
    assert work.is_dir()
    assert (
        spark.run(node="n1", argv=["echo", evil_tag, evil_tick]).text()
        == f"{evil_tag} {evil_tick}\n"
    )
    assert spark.run(node="n1", argv=["pwd"], cwd=str(work)).text() == f"{work}\n"
    assert (
        spark.run(node="n1", argv=["printenv", "TAG"], env={"TAG": evil_tag}).text()
        == f"{evil_tag}\n"
    )
    handle = spark.start_detached(
        node="n1",
        argv=["echo", evil_tag],
        log=str(work / f"{evil_tick}.log"),
        cwd=str(work),
        env={"TAG": evil_tick},
    )
    assert wait_for_exit(spark, handle) == DetachedState(state="exited", exit_code=0)
    assert spark.tail(handle=handle) == f"{evil_tag}\n"
    tree = tmp_path / "ctx"
    tree.mkdir()
    evil_file = "$(id); `id` && echo pwned"
    (tree / evil_file).write_text("profile\n")
    put = spark.put_tree(node="n1", local_dir=tree, remote_dir=str(work / evil_tag))
    assert put.files == 1 and (work / evil_tag / evil_file).read_text() == "profile\n"
    piped = spark.pipe(
        src="n1",
        src_argv=["echo", evil_tag],
        dsts=["n2"],
        dst_argv=["sh", "-c", 'cat > "$0"', str(work / "p")],
    )
    assert piped.dsts[0].exit_code == 0 and (work / "p").read_text() == f"{evil_tag}\n"

    assert [p for p in touched if p.exists()] == []
    with pytest.raises(SparkError, match="not a shell identifier"):
        spark.run(node="n1", argv=["true"], env={f"X; touch {touched[0]}": "1"})
    assert not touched[0].exists()


def test_a_background_child_holding_stderr_leaves_no_thread_on_the_freed_pipes(
    tmp_path: Path,
) -> None:
    """`docker run -d`-like commands leave a child holding stderr. The run still ends, and no reader
    is left in select() on its fds: their numbers go to the next pipes this process opens, and a
    select() asleep on a reused write end keeps that pipe open, so
    e.g. a git subprocess's reader never sees EOF (the
    canary test's 556 s hang in `git rev-parse` before this was fixed)."""
    spark = local_nodes(tmp_path / "nodes")
    before = set(threading.enumerate())
    result = spark.run(node="n1", argv=["sh", "-c", "sleep 30 >&2 & echo $!"])
    child = int(result.stdout)
    try:
        deadline = time.monotonic() + 5
        while (
            left := [t for t in threading.enumerate() if t not in before and t.is_alive()]
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == [], f"threads still on the closed command's pipes: {left}"
        for _ in range(20):  # the freed fd numbers are reused by these pipes; each must see EOF
            subprocess.run(["git", "--version"], capture_output=True, timeout=10, check=True)
    finally:
        os.kill(child, signal.SIGKILL)
        spark.close()


def test_unknown_node_lists_the_known_ones(spark: SparkNodes) -> None:
    with pytest.raises(
        SparkError, match=r"no \[\[spark.nodes\]\] entry named 'spark9'.*n1, n2, n3"
    ):
        spark.run(node="spark9", argv=["true"])


# ---- detached builds -----------------------------------------------------------------------------


def test_detached_build_is_polled_until_it_exits_with_its_code(
    spark: SparkNodes, tmp_path: Path
) -> None:
    log = tmp_path / "builds" / "r27build.log"
    handle = spark.start_detached(
        node="n1", argv=["sh", "-c", "echo step 1/9; sleep 1; echo step 9/9; exit 7"], log=str(log)
    )
    assert handle.pid > 0 and handle.exit_file == f"{log}.exit"
    assert spark.poll(handle=handle).state == "running"
    assert wait_for_exit(spark, handle) == DetachedState(state="exited", exit_code=7)
    assert spark.tail(handle=handle, lines=1) == "step 9/9\n"


def test_detached_build_with_relative_log_and_cwd_finds_its_exit_file(spark: SparkNodes) -> None:
    # The asset's shape: log and cwd relative to the login directory (ssh) or the node root (local);
    # the build `cd`s into its dir, and its exit file must still land next to the log.
    rel = f"lockstep-test-{uuid.uuid4().hex[:8]}"
    try:
        spark.run(node="n1", argv=["mkdir", "-p", f"{rel}/r28"]).check()
        handle = spark.start_detached(
            node="n1",
            argv=["sh", "-c", "pwd; exit 5"],
            log=f"{rel}/r28/build.log",
            cwd=f"{rel}/r28",
        )
        assert wait_for_exit(spark, handle) == DetachedState(state="exited", exit_code=5)
        assert spark.tail(handle=handle).endswith(f"/{rel}/r28\n")
    finally:
        spark.run(node="n1", argv=["rm", "-rf", "--", rel])


def test_detached_build_killed_without_exit_file_has_vanished(
    spark: SparkNodes, tmp_path: Path
) -> None:
    # State comes from the pid and the exit file: a
    # reaped build prints no last line, and says nothing.
    handle = spark.start_detached(node="n1", argv=["sleep", "60"], log=str(tmp_path / "b.log"))
    assert spark.poll(handle=handle).state == "running"
    # The build's shell first (so it never writes an exit
    # file), then its `sleep`, which would outlive the test.
    kill = 'children=$(pgrep -P "$1"); kill -9 "$1" && kill -9 $children'
    assert spark.run(node="n1", argv=["sh", "-c", kill, "sh", str(handle.pid)]).ok
    deadline = time.monotonic() + 10
    while (state := spark.poll(handle=handle)).state == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state == DetachedState(state="vanished", exit_code=None)


def test_recycled_pid_is_not_mistaken_for_the_build(spark: SparkNodes, tmp_path: Path) -> None:
    handle = spark.start_detached(node="n1", argv=["true"], log=str(tmp_path / "b.log"))
    wait_for_exit(spark, handle)
    (tmp_path / "b.log.exit").unlink()
    other = subprocess.Popen(["sleep", "30"])  # a live process that is not the build
    try:
        assert spark.poll(handle=handle.model_copy(update={"pid": other.pid})).state == "vanished"
    finally:
        other.kill()
        other.wait()


def _drop_by_killing_sshd_child(spark: SparkNodes, sshd: SshdServer) -> None:
    client_port = spark._transport("n1")._client.get_transport().sock.getsockname()[1]  # type: ignore[attr-defined]
    pids = sshd.connection_pids(client_port)
    assert pids, "found no sshd process serving our connection"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _drop_by_shutting_the_socket(spark: SparkNodes, sshd: SshdServer) -> None:
    spark._transport("n1")._client.get_transport().sock.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]


@pytest.mark.parametrize("drop", [_drop_by_killing_sshd_child, _drop_by_shutting_the_socket],
                         ids=["sshd-child-killed", "socket-shut"])  # fmt: skip
def test_connection_dropped_mid_build_does_not_fail_poll_or_build(
    ssh_spark: SparkNodes, sshd: SshdServer, tmp_path: Path, drop: object
) -> None:
    handle = ssh_spark.start_detached(
        node="n1", argv=["sh", "-c", "sleep 3; exit 7"], log=str(tmp_path / "b.log")
    )
    before = ssh_spark._transport("n1")._client  # type: ignore[attr-defined]
    assert ssh_spark.poll(handle=handle).state == "running"
    drop(ssh_spark, sshd)  # type: ignore[operator]
    assert wait_for_exit(ssh_spark, handle) == DetachedState(state="exited", exit_code=7)
    assert ssh_spark._transport("n1")._client is not before  # type: ignore[attr-defined]


def test_connection_dropped_while_a_command_runs_is_said_plainly(
    ssh_spark: SparkNodes, sshd: SshdServer
) -> None:
    ssh_spark.run(node="n1", argv=["true"])
    client_port = ssh_spark._transport("n1")._client.get_transport().sock.getsockname()[1]  # type: ignore[attr-defined]

    def later() -> None:
        time.sleep(1)  # the kill lands while `sleep 10` runs
        for pid in sshd.connection_pids(client_port):
            os.kill(pid, signal.SIGKILL)

    threading.Thread(target=later, daemon=True).start()
    with pytest.raises(ConnectionLost, match="may or may not have finished"):
        ssh_spark.run(node="n1", argv=["sleep", "10"])
    assert ssh_spark.run(node="n1", argv=["echo", "back"]).text() == "back\n"


# ---- host keys and secrets -----------------------------------------------------------------------


def fingerprint(pubkey: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(pubkey)], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[1]


def test_wrong_host_key_is_refused_and_nothing_runs(sshd: SshdServer, tmp_path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "imposter")],
        check=True,
    )
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_line("127.0.0.1", sshd.port, tmp_path / "imposter.pub"))
    marker = tmp_path / f"ran-{uuid.uuid4().hex[:8]}"
    spark = ssh_nodes(sshd, known_hosts=str(known))
    with pytest.raises(HostKeyRefused) as info:
        spark.run(node="n1", argv=["touch", str(marker)])
    message = str(info.value)
    assert "HOST KEY MISMATCH" in message and "nothing was run" in message
    assert fingerprint(sshd.host_key.with_suffix(".pub")) in message  # what it offered
    assert fingerprint(tmp_path / "imposter.pub") in message  # what we expected
    assert (
        f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in message
        and f"ssh-keyscan -p {sshd.port}" in message
    )
    assert info.value.node == "n1" and info.value.where == f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert not marker.exists()
    # never rewritten
    assert known.read_text() == known_hosts_line("127.0.0.1", sshd.port, tmp_path / "imposter.pub")


def test_unknown_host_is_refused_with_how_to_add_its_key(sshd: SshdServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(
        known_hosts_line("127.0.0.1", sshd.port + 1, sshd.host_key.with_suffix(".pub"))
    )
    spark = ssh_nodes(sshd, known_hosts=str(known))
    with pytest.raises(HostKeyRefused, match=r"not in .*known_hosts.*never auto-added") as info:
        spark.run(node="n1", argv=["true"])
    assert fingerprint(sshd.host_key.with_suffix(".pub")) in str(info.value)
    assert f"ssh-keyscan -p {sshd.port} -t ed25519 127.0.0.1 >> {known}" in str(info.value)
    assert len(known.read_text().splitlines()) == 1  # nothing auto-added


def test_missing_known_hosts_file_is_refused(sshd: SshdServer, tmp_path: Path) -> None:
    with pytest.raises(HostKeyRefused, match="does not exist.*ssh-keyscan"):
        ssh_nodes(sshd, known_hosts=str(tmp_path / "nope")).run(node="n1", argv=["true"])


def test_passphrase_never_appears_in_errors_and_is_named_by_its_variable(
    sshd: SshdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "not-the-passphrase-9d1e"
    monkeypatch.setenv(PASSPHRASE_ENV, wrong)
    with pytest.raises(SparkError) as info:
        ssh_nodes(sshd).run(node="n1", argv=["true"])
    assert (
        PASSPHRASE_ENV in str(info.value)
        and wrong not in str(info.value)
        and PASSPHRASE not in str(info.value)
    )
    monkeypatch.delenv(PASSPHRASE_ENV)
    with pytest.raises(
        SparkError, match=f"encrypted and no passphrase was given: export {PASSPHRASE_ENV}"
    ):
        ssh_nodes(sshd).run(node="n1", argv=["true"])


def test_secret_values_are_masked_in_results_errors_and_local_env(
    spark: SparkNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKSTEP_TEST_GHCR_TOKEN", "ghp_s3cr3tvalue0123456789")
    spark = spark.model_copy(update={"redact_env": ["LOCKSTEP_TEST_GHCR_TOKEN"]})
    result = spark.run(node="n1", argv=["sh", "-c", "exit 120", "ghp_s3cr3tvalue0123456789"])
    assert "ghp_s3cr3tvalue0123456789" not in result.describe() and "***" in result.describe()
    with pytest.raises(SparkError) as info:
        spark.run(
            node="n1", argv=["sh", "-c", "sleep 5", "ghp_s3cr3tvalue0123456789"], timeout_s=0.5
        )
    assert "ghp_s3cr3tvalue0123456789" not in str(info.value)
    # A node never sees lockstep's secrets in its environment (an ssh node never could).
    assert spark.run(node="n1", argv=["printenv", PASSPHRASE_ENV]).exit_code == 1
    spark.close()


# ---- put_tree ------------------------------------------------------------------------------------


def make_tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "versions.env").write_text("VLLM_COMMIT=63a82f8d\n")
    (root / "sub" / "deeper" / "blob.bin").write_bytes(os.urandom(4096))
    (root / "sub" / "build.sh").write_text("#!/bin/sh\nexec docker build .\n")
    (root / "sub" / "build.sh").chmod(0o755)
    (root / "build.sh").symlink_to("sub/build.sh")
    with open(root / "big.bin", "wb") as f:
        f.writelines(os.urandom(MiB) for _ in range(20))
    return root


def test_put_tree_arrives_identical(spark: SparkNodes, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "context")
    remote = tmp_path / "remote" / "r27-context"
    result = spark.put_tree(node="n2", local_dir=tree, remote_dir=str(remote))
    sizes = [p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    assert (result.files, result.bytes) == (4, sum(sizes)) and max(sizes) == 20 * MiB
    assert local_manifest(remote) == local_manifest(tree)
    assert sha256_file(remote / "big.bin") == sha256_file(tree / "big.bin")
    assert os.readlink(remote / "build.sh") == "sub/build.sh" and os.access(
        remote / "sub" / "build.sh", os.X_OK
    )
    assert (remote / "empty").is_dir() and len(result.sha256) == 64


def test_put_tree_names_the_first_file_that_differs(spark: SparkNodes, tmp_path: Path) -> None:
    tree = tmp_path / "context"
    tree.mkdir()
    (tree / "versions.env").write_text("VLLM_COMMIT=63a82f8d\n")
    remote = tmp_path / "remote"
    (remote / "profiles").mkdir(parents=True)
    # left over: the copy is not what we sent
    (remote / "profiles" / "r18.env").write_text("stale\n")
    with pytest.raises(
        SparkError,
        match=r"did not arrive identical: profiles: on the node but not in the local tree",
    ):
        spark.put_tree(node="n2", local_dir=tree, remote_dir=str(remote))


# ---- pipe (fan-out) ------------------------------------------------------------------------------

# Each destination writes what it receives to a fresh file and prints the file's name.
RECEIVE = ["sh", "-c", 'f=$(mktemp "$0/recv.XXXXXX") && cat > "$f" && echo "$f"']


def test_fanout_of_256_mib_arrives_byte_identical_on_every_destination(
    spark: SparkNodes, tmp_path: Path
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    started = time.monotonic()
    result = spark.pipe(src="n1", src_argv=["head", "-c", str(256 * MiB), "/dev/urandom"],
                        dsts=["n2", "n3"], dst_argv=[*RECEIVE, str(inbox)])  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.ok and result.src.exit_code == 0 and result.src.bytes == 256 * MiB
    files = []
    for end in result.dsts:
        assert (end.exit_code, end.bytes, end.sha256) == (0, 256 * MiB, result.src.sha256)
        files.append(Path(end.stdout.decode().strip()))
    assert len(set(files)) == 2
    assert {sha256_file(f) for f in files} == {result.src.sha256}
    assert elapsed < 60


def test_failing_destination_is_named_and_the_others_still_get_everything(
    spark: SparkNodes, tmp_path: Path
) -> None:
    # The first destination to take the lock dies mid-stream, like a `docker load` out of disk.
    lock = tmp_path / "first"
    dst_argv = [
        "sh",
        "-c",
        (
            'if mkdir "$0" 2>/dev/null; then head -c 65536 >/dev/null; '
            'echo "write /var/lib/docker: no space left on device" >&2; exit 3; fi; '
            "cat > /dev/null"
        ),
        str(lock),
    ]
    with pytest.raises(PipeFailed) as info:
        spark.pipe(
            src="n1",
            src_argv=["head", "-c", str(32 * MiB), "/dev/zero"],
            dsts=["n2", "n3"],
            dst_argv=dst_argv,
        )
    result = info.value.result
    bad = [d for d in result.dsts if d.exit_code == 3]
    good = [d for d in result.dsts if d.exit_code == 0]
    assert len(bad) == 1 and len(good) == 1
    assert info.value.node == bad[0].node
    assert f"destination {bad[0].node} failed" in str(info.value) and "exit 3" in str(info.value)
    assert "no space left on device" in str(info.value)
    assert good[0].bytes == 32 * MiB and good[0].sha256 == result.src.sha256


def test_producer_exiting_120_with_no_output_is_a_failure_not_an_empty_image(
    spark: SparkNodes,
) -> None:
    with pytest.raises(PipeFailed, match=r"producer on n1 failed: exit 120 after 0 bytes") as info:
        spark.pipe(src="n1", src_argv=["sh", "-c", "exit 120"], dsts=["n2", "n3"], dst_argv=["cat"])
    assert info.value.node == "n1"
    with pytest.raises(PipeFailed, match=r"producer on n1 exit 0 with no output"):
        spark.pipe(src="n1", src_argv=["true"], dsts=["n2"], dst_argv=["cat"])


def test_producer_failing_midway_is_named(spark: SparkNodes) -> None:
    src = [
        "sh",
        "-c",
        (
            "head -c 1048576 /dev/zero; echo 'Error response from daemon: reference does not "
            "exist' >&2; exit 1"
        ),
    ]
    with pytest.raises(
        PipeFailed,
        match=r"producer on n1 failed: exit 1 after 1048576 bytes.*reference does not exist",
    ):
        spark.pipe(src="n1", src_argv=src, dsts=["n2"], dst_argv=["cat"])


# ---- site wiring ---------------------------------------------------------------------------------


def test_spark_for_reads_the_site_and_resolves_local_roots(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "spark1").mkdir(parents=True)
    site_file = tmp_path / "site.toml"
    site_file.write_text(
        '[tpu]\nharbor_repo = "https://example.invalid/h.git"\nharbor_branch = '
        '"main"\nconsumer_repo = "https://example.invalid/c.git"\nconsumer_branch = "main"\n'
        'image = "ghcr.io/x/y"\n\n'
        '[spark]\nknown_hosts = "keys/known_hosts"\npassphrase_env = '
        '"SPARK_KEY_PASSPHRASE"\ncommand_timeout_s = 30\n\n'
        '[[spark.nodes]]\nname = "spark1"\ntransport = "local"\nroot = "nodes/spark1"\nroles = '
        '["build", "lane"]\n\n'
        '[[spark.nodes]]\nname = "dgx4"\nhost = "dgx4.lab"\nuser = "bf"\nroles = ["lane"]\n'
    )
    spark = spark_for(load_site(site_file))
    assert spark.node("spark1").root == str(tmp_path / "nodes" / "spark1")
    assert spark.known_hosts == str(tmp_path / "keys" / "known_hosts")
    assert spark.names("lane") == ["spark1", "dgx4"] and spark.names("build") == ["spark1"]
    assert spark.run(node="spark1", argv=["pwd"]).text() == f"{tmp_path / 'nodes' / 'spark1'}\n"

    @dg.asset
    def uses_spark(spark: SparkNodes) -> str:
        return spark.run(node="spark1", argv=["echo", "ok"]).text()

    assert (
        dg.materialize([uses_spark], resources={"spark": spark}).output_for_node("uses_spark")
        == "ok\n"
    )
