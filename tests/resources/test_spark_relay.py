"""The relay chain (SparkNodes.relay, [jovian]
distribute = "relay") against three real OpenSSH sshds.

Each sshd stands for one lane node: its own port, host key, PATH (the node's bin/, where the
sandbox's docker lives) and HOME. The source is a local node. lockstep reaches only the first node;
every hop after it is the node's own `ssh` client with the key and known_hosts the site names for
that hop, so what each node received is checked on disk, and a hop's trust failure is OpenSSH's own.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from jovian_assets.node_assets import distributed_image
from jovian_assets.node_build import NodeImage
from resources.errors import FileFormatError
from resources.site.load import load_site
from resources.site.resource import SiteResource
from resources.spark import SparkNodes, spark_for
from resources.spark.relay import RelayFailed
from sandbox.engines import stop_engines
from sandbox.spark_nodes import install_node, node_env
from tests.support.site_text import GOOD, write
from tests.support.sshd_server import (
    PASSPHRASE,
    PASSPHRASE_ENV,
    SshdServer,
    known_hosts_line,
    start_sshd,
    stop_sshd,
)

CHAIN = ["n1", "n2", "n3"]
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Three sshds (n1..n3), each node a sandbox node
    dir; a relay key every node may log in with."""
    base = tmp_path_factory.mktemp("relay")
    relay_key = base / "relay_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(relay_key)],
        check=True,
        timeout=30,
    )
    servers: dict[str, SshdServer] = {}
    roots = {}
    try:
        for name in CHAIN:
            root = install_node(base / "nodes" / name)
            roots[name] = root
            servers[name] = start_sshd(
                base / f"sshd-{name}",
                extra_config=(
                    f"SetEnv PATH={root / 'bin'}:/usr/local/bin:/usr/bin:/bin "
                    f"HOME={root / 'home'}\n"
                ),
            )
        # lockstep's (passphrase-protected) key and the relay key open every node.
        authorized = (servers["n1"].client_key.with_suffix(".pub").read_text()
                      + relay_key.with_suffix(".pub").read_text())  # fmt: skip
        for server in servers.values():
            (server.root / "authorized_keys").write_text(authorized)
        known_hosts = base / "lockstep_known_hosts"
        known_hosts.write_text(
            "".join(
                known_hosts_line(s.host, s.port, s.host_key.with_suffix(".pub"))
                for s in servers.values()
            )
        )
        # On node X, the known_hosts of X's hop: the next node's host key only.
        for name, nxt in itertools.pairwise(CHAIN):
            s = servers[nxt]
            (roots[name] / "relay_known_hosts").write_text(
                known_hosts_line(s.host, s.port, s.host_key.with_suffix(".pub"))
            )
        src = install_node(base / "nodes" / "src")
        yield {
            "servers": servers,
            "roots": roots,
            "src": src,
            "relay_key": relay_key,
            "known_hosts": known_hosts,
            "client_key": servers["n1"].client_key,
            "base": base,
        }
    finally:
        for server in servers.values():
            stop_sshd(server)
        stop_engines(base)  # the nodes' engines, started by their first docker command: by PID


@pytest.fixture(autouse=True)
def passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSPHRASE_ENV, PASSPHRASE)


def spark(lane: dict, **known_hosts_of: Path) -> SparkNodes:
    nodes: list[dict[str, object]] = [
        {"name": "src", "transport": "local", "root": str(lane["src"])}
    ]
    for name, server in lane["servers"].items():
        node = server.node(name)
        if name != CHAIN[-1]:
            node |= {
                "relay_key": str(lane["relay_key"]),
                "relay_known_hosts": str(
                    known_hosts_of.get(name, lane["roots"][name] / "relay_known_hosts")
                ),
            }
        nodes.append(node)
    return SparkNodes(
        nodes=nodes,
        known_hosts=str(lane["known_hosts"]),
        key_path=str(lane["client_key"]),
        passphrase_env=PASSPHRASE_ENV,
        connect_timeout_s=10.0,
        command_timeout_s=60.0,
    )


def received(lane: dict, name: str) -> Path:
    return lane["roots"][name] / "home" / "received"


def test_relay_to_three_nodes_delivers_identical_bytes_to_each(lane: dict) -> None:
    payload = lane["base"] / "payload"
    payload.write_bytes(os.urandom(8 * MiB + 12345))
    want = hashlib.sha256(payload.read_bytes()).hexdigest()
    for name in CHAIN:
        received(lane, name).unlink(missing_ok=True)
    nodes = spark(lane)
    try:
        result = nodes.relay(src="src", src_argv=["cat", str(payload)], chain=CHAIN,
                             load_argv=["sh", "-c", 'cat > "$HOME/received"'])  # fmt: skip
    finally:
        nodes.close()
    assert result.ok and result.loaded == CHAIN
    assert (result.src.bytes, result.src.sha256) == (payload.stat().st_size, want)
    # lockstep sent one copy, to the head only; each node's copy came over the hop before it.
    assert (result.head.node, result.head.bytes, result.head.sha256) == (
        "n1",
        result.src.bytes,
        want,
    )
    assert [(h.hop.src, h.hop.dst, h.exit_code) for h in result.hops] == [
        ("n1", "n2", 0),
        ("n2", "n3", 0),
    ]
    for name in CHAIN:
        assert hashlib.sha256(received(lane, name).read_bytes()).hexdigest() == want, name
    # each node cleaned up
    assert not {d for d in relay_dirs() if d.stat().st_mtime >= payload.stat().st_mtime}


def test_a_load_that_fails_midchain_is_named_and_the_nodes_after_it_still_get_every_byte(
    lane: dict,
) -> None:
    n2_home = lane["roots"]["n2"] / "home"
    for name in CHAIN:
        received(lane, name).unlink(missing_ok=True)
    nodes = spark(lane)
    try:
        with pytest.raises(RelayFailed) as info:  # n2's load exits at once, reading nothing
            nodes.relay(
                src="src",
                src_argv=["head", "-c", str(4 * MiB), "/dev/zero"],
                chain=CHAIN,
                load_argv=[
                    "sh",
                    "-c",
                    f'[ "$HOME" = {n2_home} ] && exit 3; cat > "$HOME/received"',
                ],
            )
    finally:
        nodes.close()
    assert "the load on n2 exited 3; got the image: n1, n3; did not: n2" in str(info.value)
    assert info.value.result.loads == {"n1": 0, "n2": 3, "n3": 0}
    assert received(lane, "n1").stat().st_size == received(lane, "n3").stat().st_size == 4 * MiB


def relay_dirs() -> set[Path]:
    return set(Path("/tmp").glob("lockstep-relay-*"))


def test_a_hop_whose_known_hosts_lacks_the_next_host_fails_naming_the_hop_and_trusts_nothing(
    lane: dict,
) -> None:
    # n2's hop file holds n1's host key, not n3's: the hop must fail, never learn n3's key.
    wrong = lane["roots"]["n2"] / "wrong_known_hosts"
    s1 = lane["servers"]["n1"]
    wrong.write_text(known_hosts_line(s1.host, s1.port, s1.host_key.with_suffix(".pub")))
    before, dirs = wrong.read_bytes(), relay_dirs()
    for name in CHAIN:
        received(lane, name).unlink(missing_ok=True)
    nodes = spark(lane, n2=wrong)
    try:
        with pytest.raises(RelayFailed) as info:
            nodes.relay(src="src", src_argv=["head", "-c", str(MiB), "/dev/zero"], chain=CHAIN,
                        load_argv=["sh", "-c", 'cat > "$HOME/received"'])  # fmt: skip
    finally:
        nodes.close()
    message = str(info.value)
    assert (
        "relay hop n2 -> n3 (n2's ssh to "
        f"{lane['servers']['n3'].user}@127.0.0.1:{lane['servers']['n3'].port}"
    ) in message
    assert f"known_hosts {wrong}" in message and "Host key verification failed" in message
    # Every hop connects before a byte is sent: a hop that
    # cannot is found first, and nobody gets half a relay.
    assert "nothing was sent, so no node got the image" in message
    result = info.value.result
    assert result.loads == dict.fromkeys(CHAIN) and [h.exit_code for h in result.hops] == [0, 255]
    assert not any(received(lane, name).exists() for name in CHAIN)
    assert wrong.read_bytes() == before  # StrictHostKeyChecking=yes: nothing was added
    assert relay_dirs() == dirs  # n1's hop, which did connect, was closed and its directory removed


def docker_archive(tag: str) -> bytes:
    """A minimal `docker save` archive (one layer) the
    sandbox's docker loads, keeping its image ID."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = os.urandom(2 * MiB)
        info = tarfile.TarInfo("blob.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    config = json.dumps(
        {
            "architecture": "arm64",
            "os": "linux",
            "created": "2026-12-01T00:00:00Z",
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()],
            },
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    config_hex = hashlib.sha256(config).hexdigest()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, body in (
            ("l1/layer.tar", layer_bytes),
            (f"{config_hex}.json", config),
            (
                "manifest.json",
                json.dumps(
                    [
                        {
                            "Config": f"{config_hex}.json",
                            "RepoTags": [tag],
                            "Layers": ["l1/layer.tar"],
                        }
                    ]
                ).encode(),
            ),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def lane_site(lane: dict, path: Path) -> Path:
    """A site file for this lane: the build node is the
    local `src`, the lane n1..n3 over ssh, a relay."""
    nodes = (
        f'[[spark.nodes]]\nname = "src"\ntransport = "local"\nroot = "{lane["src"]}"\nroles = '
        '["build"]\n'
    )
    for name, server in lane["servers"].items():
        nodes += (
            f'\n[[spark.nodes]]\nname = "{name}"\nhost = "{server.host}"\nport = '
            f'{server.port}\nuser = "{server.user}"\n'
        )
        if name != CHAIN[-1]:
            nodes += (
                f'relay_key = "{lane["relay_key"]}"\n'
                f'relay_known_hosts = "{lane["roots"][name] / "relay_known_hosts"}"\n'
            )
    path.write_text(
        GOOD
        + f"""
[jovian]
lab_repo = "https://github.com/lab/rtx6kpro.git"
build_repo = "https://github.com/lab/docker-images.git"
build_node = "src"
distribute = "relay"

[jovian.lane]
nodes = {json.dumps(CHAIN)}

[spark]
known_hosts = "{lane["known_hosts"]}"
key_path = "{lane["client_key"]}"
passphrase_env = "{PASSPHRASE_ENV}"

"""
        + nodes
    )
    return path


def test_distributed_image_in_relay_mode_loads_the_image_on_every_node_and_compares_the_ids(
    lane: dict, tmp_path: Path
) -> None:
    tag = "jovian-judgement:r28-glm53"
    load = subprocess.run(
        ["docker", "load"],
        input=docker_archive(tag),
        env=node_env(lane["src"]),
        cwd=lane["src"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert load.returncode == 0, load.stderr
    inspected = subprocess.run(
        ["docker", "image", "inspect", tag],
        env=node_env(lane["src"]),
        cwd=lane["src"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    image_id = json.loads(inspected.stdout)[0]["Id"]
    image = NodeImage(
        rev="r28",
        tag=tag,
        node="src",
        image_id=image_id,
        build_dir_checksum="c0ffee",
        duration_s=0.0,
    )
    site_file = lane_site(lane, tmp_path / "site.toml")
    spark_nodes = spark_for(load_site(site_file))
    try:
        done = distributed_image(
            dg.build_asset_context(),
            site=SiteResource(path=str(site_file)),
            spark=spark_nodes,
            image=image,
        )
    finally:
        spark_nodes.close()
    assert done.value.mode == "relay" and done.metadata["mode"].value == "relay"
    assert done.value.nodes == dict.fromkeys(CHAIN, image_id) and done.value.bytes > 2 * MiB
    # Each node's docker holds it, loaded from what the node before it forwarded.
    for name in CHAIN:
        shown = subprocess.run(
            ["docker", "image", "inspect", tag],
            env=node_env(lane["roots"][name]),
            cwd=lane["roots"][name],
            capture_output=True,
            timeout=60,
            check=True,
        )
        assert json.loads(shown.stdout)[0]["Id"] == image_id, name


# -- the site keys ---------------------------------------------------------------------------------

RELAY_SITE = (
    GOOD
    + """
[jovian]
lab_repo = "https://github.com/lab/rtx6kpro.git"
build_repo = "https://github.com/lab/docker-images.git"
build_node = "build"
distribute = "relay"

[jovian.lane]
nodes = ["a", "b"]

[[spark.nodes]]
name = "build"
host = "10.0.0.1"

[[spark.nodes]]
name = "a"
host = "10.0.0.2"
relay_key = "/home/lockstep/.ssh/relay_ed25519"
relay_known_hosts = "/home/lockstep/.ssh/relay_known_hosts"

[[spark.nodes]]
name = "b"
host = "10.0.0.3"
relay_host = "192.168.100.3"
"""
)


def test_relay_site_keys_load_and_a_bad_relay_key_path_is_refused_with_file_line_and_value(
    tmp_path: Path,
) -> None:
    site = load_site(write(tmp_path, RELAY_SITE))
    assert site.jovian is not None and site.jovian.distribute == "relay"
    assert site.spark is not None and site.spark.node("b").relay_host == "192.168.100.3"
    # The resource's node entries go through Dagster's config, whose maps refuse a None: unset keys
    # are left out (tests/sandbox/test_sandbox_nodes.py's
    # distribute runs that path through an asset).
    spark_nodes = spark_for(site)
    assert all(value is not None for node in spark_nodes.nodes for value in node.values())
    assert spark_nodes.node("a").relay_key == "/home/lockstep/.ssh/relay_ed25519"
    assert (
        spark_nodes.node("b").relay_key is None
        and spark_nodes.node("b").relay_host == "192.168.100.3"
    )
    line = RELAY_SITE.splitlines().index('relay_key = "/home/lockstep/.ssh/relay_ed25519"') + 1
    for bad in ("../keys/relay", "~/.ssh/relay", "/home/lockstep/%h_key", "/home/lockstep/-o x"):
        with pytest.raises(FileFormatError) as info:
            load_site(write(tmp_path, RELAY_SITE.replace("/home/lockstep/.ssh/relay_ed25519", bad)))
        assert info.value.line == line, bad
        assert str(info.value).startswith(
            f"{tmp_path / 'site.toml'}:{line}: [[spark.nodes]] #2 relay_key: "
        ), bad
        assert repr(bad) in str(info.value) and "plain absolute path" in str(info.value)


def test_a_relay_node_without_its_hop_files_is_refused_at_load_naming_the_node(
    tmp_path: Path,
) -> None:
    text = RELAY_SITE.replace('relay_known_hosts = "/home/lockstep/.ssh/relay_known_hosts"\n', "")
    with pytest.raises(FileFormatError) as info:
        load_site(write(tmp_path, text))
    assert "[[spark.nodes]] #2" in str(info.value)
    assert "node 'a' forwards the relay to 'b'" in str(
        info.value
    ) and "no relay_known_hosts" in str(info.value)
    star = load_site(write(tmp_path, text.replace('distribute = "relay"', 'distribute = "star"')))
    assert star.jovian is not None and star.jovian.distribute == "star"
    with pytest.raises(FileFormatError, match="distribute: .*not a distribution mode"):
        load_site(
            write(tmp_path, RELAY_SITE.replace('distribute = "relay"', 'distribute = "chain"'))
        )
