"""The sandbox's DGX Spark nodes: local node dirs, each with its own real Docker engine (build.sh ->
a real BuildKit `docker build` of the runbook's Dockerfile,
inspect, run, save | load between engines), and the
real bench tools."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import git
import pytest
from click.testing import CliRunner

from jovian_assets.node_assets import distributed_image
from jovian_assets.node_build import NodeBuildFailed, NodeImage, label_finding, run_gates
from jovian_assets.source_lock import parse_source_lock
from lockstep.cli import main
from resources.site.jovian import DEFAULT_BOOT_GATES, DEFAULT_VERSIONS_KEYS
from resources.site.load import load_site
from resources.site.resource import SiteResource
from resources.spark import PipeFailed, spark_for
from sandbox.engines import stop_engines
from sandbox.jovian_sources import FLASHKDA_EXTENSION, parse_lock
from sandbox.jovian_world import BUILD_DIR, lock_path, new_lab_rev
from sandbox.spark_nodes import NODES, install_node, install_nodes, node_env, set_bench_knobs
from sandbox.teardown import stop_sandbox
from sandbox.world import Sandbox, up


def sh(
    node: Path,
    *argv: str,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[bytes]:
    """Run a command on `node` the way the `local`
    transport does: in its root, bin/ first on PATH."""
    return subprocess.run(
        list(argv),
        input=input,
        env={**node_env(node), **(env or {})},
        cwd=cwd or node,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def out(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, (
        result.returncode,
        result.stdout.decode()[-2000:],
        result.stderr.decode()[-4000:],
    )
    return result.stdout.decode()


def inspect(node: Path, tag: str) -> dict:
    (doc,) = json.loads(out(sh(node, "docker", "image", "inspect", tag)))
    return doc


def stored(node: Path) -> list[str]:
    """The image IDs the node's engine holds (its bases included)."""
    return sorted(set(out(sh(node, "docker", "images", "-q", "--no-trunc")).split()))


def build_node(path: Path) -> Path:
    """A node whose engine holds the Jovian base (the
    build node's role), as `docker build` needs it."""
    return install_node(path, bases=["jovian"])


def lab_lock(sb: Sandbox, rev: str) -> dict[str, str]:
    return parse_lock(git.Repo(sb.repos / "rtx6kpro.git").git.show(f"master:{lock_path(rev)}"))


def build_context(sb: Sandbox, dest: Path, rev: str) -> Path:
    """The shipped build dir: the build repo's
    jovian-judgement/ plus profiles/<rev>.env (the keys whose
    lock value differs from versions.env), as `jovian/build_profile` would commit it."""
    checkout = dest.parent / f"{dest.name}-checkout"
    git.Repo.clone_from((sb.repos / "docker-images.git").as_uri(), checkout)
    shutil.copytree(checkout / BUILD_DIR, dest, ignore=shutil.ignore_patterns(".git"))
    shutil.rmtree(checkout)
    (dest / "deps").mkdir()
    versions = dict(
        line.split("=", 1)
        for line in (dest / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    lock = lab_lock(sb, rev)
    diff = {
        env: lock[key]
        for key, env in DEFAULT_VERSIONS_KEYS.items()
        if key in lock and lock[key] != versions[env]
    }
    (dest / "profiles" / f"{rev}.env").write_text(
        f"# profiles/{rev}.env (test)\n" + "".join(f"{k}={v}\n" for k, v in diff.items())
    )
    return dest


def build(
    node: Path, ctx: Path, tag: str, profile: str | None, **env: str
) -> subprocess.CompletedProcess[bytes]:
    extra = {"TAG": tag, **({"PROFILE": profile} if profile else {}), **env}
    return sh(node, "bash", str(ctx / "build.sh"), env=extra, timeout=300)


def gate_context(lock: dict[str, str]) -> dict[str, str]:
    ctx = {"rev": lock["release.version"], "vllm_version": re.escape(lock["vllm.version"])}
    ctx.update({f"{p}_commit8": lock[f"{p}.commit"][:8] for p in ("vllm", "b12x", "lmcache")})
    return ctx


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = up(tmp_path_factory.mktemp("nodes") / "sandbox")
    yield sb
    # its nodes' engines (started by their first docker command) and the git daemon
    stop_sandbox(sb.root)


@pytest.fixture(autouse=True)
def stopped_engines(tmp_path: Path) -> Iterator[None]:
    """A node a test installs under its tmp_path starts
    its engine with its first docker command: stopped
    by PID after the test."""
    yield
    stop_engines(tmp_path)


@pytest.fixture(scope="module")
def r28(world: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Rev r28 adopted (profile written) and built on the build node."""
    new_lab_rev(world.root, "r28")
    ctx = build_context(world, tmp_path_factory.mktemp("ctx") / "jovian-judgement", "r28")
    node = world.nodes / "spark-build"
    tag = "jovian-judgement:r28-glm53"
    result = build(node, ctx, tag, "r28", BUILD_DIR_CHECKSUM="c0ffee")
    out(result)
    return {
        "tag": tag,
        "ctx": ctx,
        "node": node,
        "lock": lab_lock(world, "r28"),
        "log": result.stderr.decode(),
        "id": inspect(node, tag)["Id"],
    }


# -- the nodes -------------------------------------------------------------------------------------


def test_up_installs_the_nodes_idempotently_and_the_site_names_them(
    world: Sandbox, tmp_path: Path
) -> None:
    roots = install_nodes(world)
    assert [r.name for r in roots] == list(NODES) == ["spark-build", "spark-a", "spark-b"]
    wrappers = {}
    for root in roots:
        for sub in ("bin", "home", "engine"):
            assert (root / sub).is_dir()
        for tool in ("docker", "tool-eval-bench", "llama-benchy"):
            path = root / "bin" / tool
            assert path.read_text().startswith("#!/bin/sh\n") and path.stat().st_mode & 0o111
            wrappers[path] = (path.read_text(), path.stat().st_mtime_ns)
    up(world.root)
    install_nodes(world)
    assert {p: (p.read_text(), p.stat().st_mtime_ns) for p in wrappers} == wrappers

    # The wrappers work from any directory, with nothing from this project on the caller's path.
    node = world.nodes / "spark-a"
    result = subprocess.run(
        [str(node / "bin" / "docker"), "version"],
        cwd=tmp_path,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0 and b"Version:" in result.stdout
    # its own engine answered
    assert b"Server:" in result.stdout and (node / "engine" / "pid").is_file()

    site = load_site(world.site_file)
    assert site.spark is not None and site.jovian is not None
    assert {
        n.name: (n.transport, site.resolve_path(n.root), n.roles) for n in site.spark.nodes
    } == {name: ("local", world.nodes / name, roles) for name, roles in NODES.items()}
    assert site.jovian.build_node == "spark-build"
    lane = site.jovian.lane
    assert lane is not None and (lane.name, lane.nodes) == ("glm53-2x", ["spark-a", "spark-b"])
    assert (lane.seed, lane.tolerance) == (42, 1.0)


def test_an_older_sandbox_site_gets_the_nodes_added(world: Sandbox) -> None:
    original = world.site_file.read_text()
    try:
        text = original[: original.index("\n[spark]")] + "\n"
        text = re.sub(r"^build_node = .*\n", "", text, flags=re.MULTILINE)
        start = text.index("\n[jovian.lane]")
        rest = text[start + 1 :]
        nxt = re.search(r"^\[(?!jovian\.lane\])", rest, re.MULTILINE)
        text = text[: start + 1] + (rest[nxt.start() :] if nxt else "")
        world.site_file.write_text(text)
        old = load_site(world.site_file)
        assert (
            old.spark is None
            and old.jovian is not None
            and old.jovian.build_node is None
            and old.jovian.lane is None
        )
        up(world.root)
        site = load_site(world.site_file)
        assert site.spark is not None and [n.name for n in site.spark.nodes] == list(NODES)
        assert (
            site.jovian is not None
            and site.jovian.build_node == "spark-build"
            and site.jovian.lane is not None
        )
    finally:
        world.site_file.write_text(original)


# -- build, inspect, boot gates --------------------------------------------------------------------


def test_build_sh_merges_the_profile_and_the_image_carries_the_pins(
    world: Sandbox, r28: dict
) -> None:
    node, tag, lock = r28["node"], r28["tag"], r28["lock"]
    log = r28["log"]
    assert "build.sh: jovian-judgement:r28-glm53 from versions.env < profiles/r28.env" in log
    # BuildKit's own log: the clone stage fetched the pin
    # from the sandbox's git server and checked its tree.
    clone = re.search(r"^#\d+ \[vllm-clone 1/1\] RUN git init -q /src/vllm .*$", log, re.MULTILINE)
    assert clone and f'"{lock["vllm.repository"]}" "{lock["vllm.commit"]}"' in clone.group(0), log[
        -3000:
    ]
    assert lock["vllm.repository"].startswith(
        "git://127.0.0.1:"
    ) and f'= "{lock["vllm.tree"]}"' in clone.group(0)
    assert (
        "fetch-deps: flashmla" in log and "patch_cuda_sm12x: preserve_sm12x_target: applied" in log
    )
    assert "TORCH_CUDA_ARCH_LIST=12.1a -> CUDA archs 12.1a" in log  # the patched cmake keeps 12.1a
    assert f"naming to docker.io/library/{tag} done" in log

    doc = inspect(node, tag)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", doc["Id"]) and doc["Id"] == r28["id"]
    assert doc["RepoTags"] == [tag]
    assert doc["Config"]["Labels"] == {"lockstep.profile": "r28", "sm121.checksum": "c0ffee"}
    assert label_finding(tag, doc["Config"]["Labels"], "c0ffee").passed
    assert "CUDA_VERSION=13.2.0" in doc["Config"]["Env"]  # from the base it was built FROM
    fmt = out(
        sh(
            node,
            "docker",
            "image",
            "inspect",
            "--format",
            '{{.Id}} {{index .Config.Labels "lockstep.profile"}}',
            tag,
        )
    )
    assert fmt.split() == [doc["Id"], "r28"]

    # The profile's pins won over versions.env's (r27): the engine string carries the r28 pin.
    r27 = lab_lock(world, "r27")
    version = out(
        sh(
            node,
            "docker",
            "run",
            "--rm",
            tag,
            "python",
            "-c",
            "import vllm; print(vllm.__version__)",
        )
    )
    assert version.strip() == lock["vllm.version"] != r27["vllm.version"]
    meta = out(
        sh(
            node,
            "docker",
            "run",
            "--rm",
            tag,
            "python3",
            "-c",
            (
                "import importlib.metadata as m; print(m.version('vllm'), "
                "m.version('lmcache'), m.version('b12x'))"
            ),
        )
    )
    assert meta.split() == [
        lock["vllm.version"],
        lock["lmcache.version"],
        f"0.1.dev1+g{lock['b12x.commit'][:7]}",
    ]
    marker = out(
        sh(
            node,
            "docker",
            "run",
            "--rm",
            tag,
            "python",
            "-c",
            "import vllm.glm53_rev as r; print(r.GLM53_REV)",
        )
    )
    assert marker.strip() == "r28"

    # No lockstep marker file anywhere in the image: every default boot gate holds on what a real
    # build carries (cuobjdump over the built extensions,
    # the patches' effects in the installed source).
    listing = out(
        sh(
            node,
            "docker",
            "run",
            "--rm",
            tag,
            "sh",
            "-c",
            "find / -xdev -name '_cuda_archs.txt' -o "
            "-name '_sm12x_patches.json' -o -name 'sandbox_model.toml' | head",
        )
    )
    assert listing == ""
    ctx = gate_context(lock)
    for gate in DEFAULT_BOOT_GATES:
        result = sh(
            node, "docker", "run", "--rm", "--network", "none", tag, "python", "-c", gate.code
        )
        assert result.returncode == 0, (gate.name, result.stderr.decode())
        if gate.expect:
            assert re.search(gate.expect.format(**ctx), result.stdout.decode(), re.MULTILINE), (
                gate.name,
                result.stdout,
            )
    failing = sh(
        node, "docker", "run", "--rm", tag, "python", "-c", "import sys; print('out'); sys.exit(3)"
    )
    assert (failing.returncode, failing.stdout) == (3, b"out\n")


def test_a_rebuild_hits_the_layer_cache_and_labels_and_profiles_change_the_image(
    world: Sandbox, r28: dict
) -> None:
    node, ctx, tag = r28["node"], r28["ctx"], r28["tag"]
    again = build(node, ctx, "jovian-judgement:again", "r28", BUILD_DIR_CHECKSUM="c0ffee")
    # same inputs: every step CACHED
    assert inspect(node, "jovian-judgement:again")["Id"] == r28["id"]
    assert re.search(
        r"\[vllm-builder 3/3\] RUN .*uv build --wheel.*\n#\d+ sha256:[0-9a-f]+\n#\d+ CACHED",
        out_err(again),
    )
    out(build(node, ctx, "jovian-judgement:relabelled", "r28", BUILD_DIR_CHECKSUM="beef"))
    # labels are in the config
    assert inspect(node, "jovian-judgement:relabelled")["Id"] != r28["id"]
    out(build(node, ctx, "jovian-judgement:base", None))  # no PROFILE: versions.env (r27) alone
    base = inspect(node, "jovian-judgement:base")
    assert base["Id"] != r28["id"] and base["Config"]["Labels"] is None
    version = out(
        sh(
            node,
            "docker",
            "run",
            "--rm",
            "jovian-judgement:base",
            "python",
            "-c",
            "import vllm; print(vllm.__version__)",
        )
    )
    assert version.strip() == lab_lock(world, "r27")["vllm.version"]
    assert inspect(node, tag)["Id"] == r28["id"]


def out_err(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    return result.stderr.decode()


def test_build_sh_fails_clearly_without_tag_or_profile(r28: dict, tmp_path: Path) -> None:
    node = install_node(tmp_path / "node")
    ctx = r28["ctx"]
    no_tag = sh(node, "bash", str(ctx / "build.sh"), env={"PROFILE": "r28", "TAG": ""})
    assert no_tag.returncode != 0 and b"TAG is not set" in no_tag.stderr
    missing = build(node, ctx, "jovian-judgement:r99-glm53", "r99")
    err = missing.stderr.decode()
    assert (
        missing.returncode != 0 and f"{ctx}/profiles/r99.env does not exist" in err and "r28" in err
    )
    bad = tmp_path / "bad-ctx"
    shutil.copytree(ctx, bad)
    (bad / "profiles" / "r28.env").write_text("VLLM_COMMIT=abc\nnot a pin line\n")
    malformed = build(node, bad, "jovian-judgement:r28-glm53", "r28")
    assert (
        malformed.returncode != 0
        and f"{bad}/profiles/r28.env:2: not a KEY=VAL line" in malformed.stderr.decode()
    )
    # docker never ran: its engine was not even started
    assert not (node / "engine" / "pid").exists()


def test_a_tree_that_does_not_match_its_pin_fails_the_build(r28: dict, tmp_path: Path) -> None:
    node = build_node(tmp_path / "node")
    bad = tmp_path / "ctx"
    shutil.copytree(r28["ctx"], bad)
    profile = bad / "profiles" / "r28.env"
    profile.write_text(
        re.sub(r"^VLLM_TREE=.*$", "VLLM_TREE=" + "0" * 40, profile.read_text(), flags=re.MULTILINE)
    )
    before = stored(node)
    result = build(node, bad, "jovian-judgement:r28-glm53", "r28")
    err = result.stderr.decode()
    # The clone stage's own `test ... = "$VLLM_TREE"`
    # failed; BuildKit names the step and its exit code.
    assert result.returncode == 1 and '= "' + "0" * 40 + '"' in err and "exit code: 1" in err, err[
        -3000:
    ]
    assert stored(node) == before  # no image
    assert sh(node, "docker", "image", "inspect", "jovian-judgement:r28-glm53").returncode == 1


def test_a_broken_import_rev_builds_but_its_flashkda_gate_fails(
    world: Sandbox, tmp_path: Path
) -> None:
    rev = new_lab_rev(world.root, "r29", break_import=True)
    assert rev.broken_import
    tree = (
        git.Repo(world.repos / "vllm.git")
        .git.ls_tree("-r", "--name-only", rev.pins["vllm"])
        .splitlines()
    )
    assert FLASHKDA_EXTENSION not in tree and "vllm/config/cache.py" in tree
    ctx = build_context(world, tmp_path / "jovian-judgement", "r29")
    node = build_node(tmp_path / "node")
    out(build(node, ctx, "jovian-judgement:r29-glm53", "r29"))
    gates = {g.name: g for g in DEFAULT_BOOT_GATES}
    kda = sh(
        node,
        "docker",
        "run",
        "--rm",
        "jovian-judgement:r29-glm53",
        "python",
        "-c",
        gates["flashkda_extension"].code,
    )
    assert kda.returncode == 1 and b"No module named 'vllm._flashkda_C'" in kda.stderr
    for name in (
        "vllm_import_carries_pin",
        "lmcache_native",
        "b12x_enum_resolves",
        "nvfp4_ds_mla_present",
    ):
        ok = sh(
            node,
            "docker",
            "run",
            "--rm",
            "jovian-judgement:r29-glm53",
            "python",
            "-c",
            gates[name].code,
        )
        assert ok.returncode == 0, (name, ok.stderr)


def test_cli_new_lab_rev_break_import(world: Sandbox) -> None:
    result = CliRunner().invoke(
        main,
        ["sandbox", "new-lab-rev", "r30", "--break-import", "--dir", str(world.root)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    vllm = lab_lock(world, "r30")["vllm.commit"]
    tree = git.Repo(world.repos / "vllm.git").git.ls_tree("-r", "--name-only", vllm).splitlines()
    assert FLASHKDA_EXTENSION not in tree


# -- distribute ------------------------------------------------------------------------------------


def save_bytes(node: Path, tag: str) -> bytes:
    result = sh(node, "docker", "save", tag)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_save_piped_into_load_on_another_node_keeps_the_image_id(r28: dict, tmp_path: Path) -> None:
    src, tag = r28["node"], r28["tag"]
    dst = install_node(tmp_path / "lane")
    save = subprocess.Popen(
        ["docker", "save", tag], cwd=src, env=node_env(src), stdout=subprocess.PIPE
    )
    load = subprocess.run(
        ["docker", "load"],
        cwd=dst,
        env=node_env(dst),
        stdin=save.stdout,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert save.stdout is not None
    save.stdout.close()
    assert save.wait(timeout=60) == 0
    assert load.returncode == 0 and load.stdout.decode() == f"Loaded image: {tag}\n", load.stderr
    assert inspect(dst, tag)["Id"] == r28["id"]
    version = out(
        sh(
            dst,
            "docker",
            "run",
            "--rm",
            tag,
            "python",
            "-c",
            "import vllm; print(vllm.__version__)",
        )
    )
    assert version.strip() == r28["lock"]["vllm.version"]

    # docker-archive layout: the config named by the image ID, one tar per layer.
    data = save_bytes(dst, tag)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    hexid = r28["id"].removeprefix("sha256:")
    assert [(m["Config"], m["RepoTags"]) for m in manifest] == [(f"{hexid}.json", [tag])]
    assert (
        f"{hexid}.json" in names
        and set(manifest[0]["Layers"]) <= set(names)
        and len(manifest[0]["Layers"]) > 1
    )
    # Loading it again is a no-op that still reports the tag.
    again = sh(dst, "docker", "load", input=data)
    assert out(again) == f"Loaded image: {tag}\n"


def member_cuts(data: bytes) -> tuple[int, int]:
    """(end of the first complete regular member, a
    byte inside the largest member) of a tar stream."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = [m for m in tar.getmembers() if m.isfile() and m.size > 0]
    first, largest = files[0], max(files, key=lambda m: m.size)
    whole = first.offset_data + -(-first.size // 512) * 512
    assert whole < len(data) and largest.size > 1024
    return whole, largest.offset_data + largest.size // 2


def test_a_corrupt_or_cut_stream_fails_to_load_and_stores_nothing(
    r28: dict, tmp_path: Path
) -> None:
    data = save_bytes(r28["node"], r28["tag"])
    dst = install_node(tmp_path / "lane")
    flipped = bytearray(data)
    at = data.index(b"nvfp4_ds_mla")  # inside the layer tar: a byte of vllm/config/cache.py
    flipped[at] ^= 0x20
    # Cut at a member boundary the stream is a valid tar missing manifest.json; cut inside a member
    # it is a short read. Which member comes first follows the image's hashes, so the cuts are
    # found, not fixed (a fixed 1536 bytes fell inside the config when its hash sorted first).
    whole, inside = member_cuts(data)
    # What dockerd 20.10 answers to each (its own words; a cut stream names the file it missed).
    for stream, why in (
        (data[:inside], "unexpected EOF"),
        (data[:whole], "no such file or directory"),
        (bytes(flipped), "invalid diffID for layer"),
        (b"", "no such file or directory"),
        (b"not a tar stream at all" * 40, "invalid tar header"),
    ):
        result = sh(dst, "docker", "load", input=stream)
        assert result.returncode != 0 and why.encode() in result.stderr, (why, result.stderr)
        assert result.stdout == b""
        assert stored(dst) == []
        missing = sh(dst, "docker", "image", "inspect", r28["tag"])
        assert (
            missing.returncode == 1
            and f"Error: No such image: {r28['tag']}".encode() in missing.stderr
        )


def test_docker_cli_edges(r28: dict, tmp_path: Path) -> None:
    node = install_node(tmp_path / "node")
    out(sh(node, "docker", "load", input=save_bytes(r28["node"], r28["tag"])))
    unknown = sh(node, "docker", "compose", "up")  # Debian's 20.10 client has no compose plugin
    assert unknown.returncode == 1 and b"'compose' is not a docker command" in unknown.stderr
    absent = sh(node, "docker", "run", "--rm", "jovian-judgement:nope", "python", "-c", "print(1)")
    assert (
        absent.returncode == 125
        and b"Unable to find image 'jovian-judgement:nope' locally" in absent.stderr
    )
    # no GPU toolchain at runtime
    not_python = sh(node, "docker", "run", "--rm", r28["tag"], "nvidia-smi")
    assert (
        not_python.returncode == 127
        and b'exec: "nvidia-smi": executable file not found' in not_python.stderr
    )
    env = sh(
        node,
        "docker",
        "run",
        "--rm",
        "-e",
        "X=1",
        r28["tag"],
        "python",
        "-c",
        "import os; print(os.environ['X'])",
    )
    assert out(env) == "1\n"
    assert r28["tag"].split(":")[0] in out(sh(node, "docker", "images"))
    out(sh(node, "docker", "tag", r28["tag"], "jovian-judgement:alias"))
    assert sorted(inspect(node, "jovian-judgement:alias")["RepoTags"]) == [
        "jovian-judgement:alias",
        r28["tag"],
    ]
    assert (
        out(sh(node, "docker", "rmi", "jovian-judgement:alias"))
        == "Untagged: jovian-judgement:alias\n"
    )
    removed = out(sh(node, "docker", "rmi", r28["tag"])).splitlines()
    # then each layer it held
    assert removed[:2] == [f"Untagged: {r28['tag']}", f"Deleted: {r28['id']}"]
    assert stored(node) == []


# -- lockstep's distribute and gates on these nodes ------------------------------------------------


def node_image(r28: dict, image_id: str | None = None) -> NodeImage:
    return NodeImage(
        rev="r28",
        tag=r28["tag"],
        node="spark-build",
        image_id=image_id or r28["id"],
        build_dir_checksum="c0ffee",
        duration_s=0.0,
    )


def distribute(world: Sandbox, image: NodeImage) -> dg.Output:
    spark = spark_for(load_site(world.site_file))
    try:
        return distributed_image(
            dg.build_asset_context(),
            site=SiteResource(path=str(world.site_file)),
            spark=spark,
            image=image,
        )
    finally:
        spark.close()


def test_distribute_streams_plain_docker_save_because_save_to_dash_is_refused(
    world: Sandbox, r28: dict
) -> None:
    # The runbook's "docker save -o - is broken on this stack", for real: exit 0, nothing on stdout,
    # and a 160 MB file named '-' in the working directory.
    for variant in (["-o", "-"], ["--output=-"]):
        dash = r28["node"] / "-"
        dash.unlink(missing_ok=True)
        silent = sh(r28["node"], "docker", "save", *variant, r28["tag"])
        assert (
            silent.returncode == 0 and silent.stdout == b"" and dash.stat().st_size > 1_000_000
        ), silent
        dash.unlink()
    spark = spark_for(load_site(world.site_file))
    try:
        with pytest.raises(PipeFailed, match="docker save -o -") as info:
            spark.pipe(
                src="spark-build",
                src_argv=["docker", "save", "-o", "-", r28["tag"]],
                dsts=["spark-b"],
                dst_argv=["docker", "load"],
            )
        assert info.value.result.src.bytes == 0
    finally:
        spark.close()

    # lockstep's own argv: passes only as plain `docker save IMG`
    done = distribute(world, node_image(r28))
    assert done.value.nodes == {"spark-a": r28["id"], "spark-b": r28["id"]} and done.value.bytes > 0


def test_an_image_id_that_differs_after_load_fails_naming_the_node_and_both_ids(
    world: Sandbox, r28: dict
) -> None:
    # what jovian/image recorded; the tag on the build node moved since
    recorded = "sha256:" + "ab" * 32
    with pytest.raises(NodeBuildFailed) as info:
        distribute(world, node_image(r28, image_id=recorded))
    message = str(info.value)
    assert f"{r28['tag']} is {recorded} on spark-build" in message
    assert f"spark-a holds {r28['id']}" in message and f"spark-b holds {r28['id']}" in message


def test_a_wrong_engine_string_fails_the_pin_gate_naming_expected_and_found(
    world: Sandbox, r28: dict
) -> None:
    # git show drops the last newline
    text = git.Repo(world.repos / "rtx6kpro.git").git.show(f"master:{lock_path('r28')}") + "\n"
    built = r28["lock"]["vllm.version"]
    wrong = built.replace("glm53.r28", "glm53.r27")
    lock = parse_source_lock(
        text.replace(f"vllm.version={built}", f"vllm.version={wrong}"), lock_path("r28")
    )
    (gate,) = [g for g in DEFAULT_BOOT_GATES if g.name == "vllm_import_carries_pin"]
    spark = spark_for(load_site(world.site_file))
    try:
        finding, outputs = run_gates(
            spark, node="spark-build", tag=r28["tag"], gates=[gate], lock=lock
        )
    finally:
        spark.close()
    assert not finding.passed and outputs["vllm_import_carries_pin"]["stdout"] == built
    assert f"vllm_import_carries_pin: expected {wrong!r}, found {built!r}" in finding.description


def gate_errors(node: Path, tag: str) -> dict[str, str]:
    """The GB10 gates on an image: gate name -> the last stderr line of a failing one."""
    failed = {}
    for gate in (
        g for g in DEFAULT_BOOT_GATES if g.name in ("cuda_arch_sm121a", "sm12x_patch_set_applied")
    ):
        result = sh(
            node, "docker", "run", "--rm", "--network", "none", tag, "python", "-c", gate.code
        )
        if result.returncode != 0:
            failed[gate.name] = result.stderr.decode().strip().splitlines()[-1]
    return failed


def test_gb10_gates_catch_a_12_0_build_and_a_build_without_the_sm12x_patch_set(
    r28: dict, tmp_path: Path
) -> None:
    node = r28["node"]
    # the sandbox's own build: 12.1a kept, the set applied
    assert gate_errors(r28["node"], r28["tag"]) == {}
    as_theirs = shutil.copytree(r28["ctx"], tmp_path / "theirs")
    env = as_theirs / "versions.env"
    env.write_text(
        env.read_text().replace("TORCH_CUDA_ARCH_LIST=12.1a", "TORCH_CUDA_ARCH_LIST=12.0")
    )
    # no BUILD_DIR_CHECKSUM: a hand build
    out(build(node, as_theirs, "jovian-judgement:arch120", "r28"))
    assert gate_errors(node, "jovian-judgement:arch120") == {
        "cuda_arch_sm121a": "AssertionError: vllm kernels are compiled for sm_120, not sm_121a "
        "(TORCH_CUDA_ARCH_LIST=12.1a "
        "collapses to 12.0 without preserve_sm12x_target)"
    }
    labels = inspect(node, "jovian-judgement:arch120")["Config"]["Labels"]
    assert "sm121.checksum" not in labels
    assert label_finding("jovian-judgement:arch120", labels, "c0ffee").description.startswith(
        "STALE: unlabeled jovian-judgement:arch120: no sm121.checksum label"
    )

    unpatched = shutil.copytree(r28["ctx"], tmp_path / "unpatched")
    dockerfile = unpatched / "Dockerfile"
    dockerfile.write_text(
        "".join(
            line
            for line in dockerfile.read_text().splitlines(keepends=True)
            if "patch_cuda_sm12x" not in line
        )
    )
    result = build(node, unpatched, "jovian-judgement:unpatched", "r28")
    out(result)  # the build succeeds: only the gates can tell
    assert (
        "vllm/_C.abi3.so: TORCH_CUDA_ARCH_LIST=12.1a -> CUDA archs 12.0" in result.stderr.decode()
    )
    errors = gate_errors(node, "jovian-judgement:unpatched")
    assert errors["sm12x_patch_set_applied"] == (
        "AssertionError: the sm12x patch set did not run in full: no effect of "
        "spark_kv_cache_cleanup "
        "(vllm/config/cache.py), b12x_c128a_alignment "
        "(vllm/model_executor/layers/fused_moe/__init__.py), "
        "flashinfer_swigluoai (vllm/model_executor/layers/fused_moe/__init__.py), "
        "speculator_cudagraph_pool "
        "(vllm/config/__init__.py), routed_expert_weight_shape "
        "(vllm/model_executor/models/__init__.py)"
    )
    assert "vllm kernels are compiled for sm_120, not sm_121a" in errors["cuda_arch_sm121a"]


# -- bench -----------------------------------------------------------------------------------------


def test_lane_nodes_run_the_real_bench_tools_offline_or_die_like_a_dead_pipe_pump(
    world: Sandbox,
) -> None:
    lane = world.nodes / "spark-a"
    site = load_site(world.site_file)
    assert site.jovian is not None and site.jovian.lane is not None
    assert [site.jovian.lane.bench_quality[0], site.jovian.lane.bench_perf[0]] == [
        "tool-eval-bench",
        "llama-benchy",
    ]
    assert out(sh(lane, "tool-eval-bench", "--version")).strip() == "tool-eval-bench 3.0.0"
    assert "0.4.0" in out(sh(lane, "llama-benchy", "--version"))
    # llama-benchy reads a local tokenizer and its book cache from the node's home: no internet.
    assert (lane / "home" / "llama-benchy-tokenizer" / "tokenizer.json").is_file()
    assert list((lane / "home" / ".cache" / "llama-benchy").glob("*.txt"))
    try:
        set_bench_knobs(lane, fault="dead-pipe")
        dead = sh(lane, *site.jovian.lane.bench_quality)
        assert (dead.returncode, dead.stdout, dead.stderr) == (120, b"", b"")
    finally:
        set_bench_knobs(lane)
    assert not (lane / "home" / ".sandbox-bench.json").exists()
