"""The build half of the sandbox's kaniko: a real Docker
engine (BuildKit) builds the consumer's Dockerfile.

sandbox/fake_kaniko.py reads kaniko's command line; this does the work with the sandbox's TPU build
engine (``<sandbox>/iris/engine``, sandbox/engines.py), as kaniko would in its pod:

- build the context's own Dockerfile with BuildKit
  (``docker build --network=host``: the build reaches the
  sandbox's git daemon on 127.0.0.1 as a real one reaches github.com). The engine's layer cache is
  the cache: ``--cache=true`` reuses a layer whose instruction and inputs did not change, exactly
  the runbook's stale-wheel trap; ``--cache=false`` builds with ``--no-cache``;
- ``--single-snapshot``: the built filesystem as ONE
  layer (``docker export | docker import``, keeping
  the image's Env, WorkingDir, Cmd, Entrypoint and Labels), as kaniko takes one snapshot at the end;
- push to an HTTP registry with ``docker push`` from
  the engine (127.0.0.0/8 is an insecure registry by
  default in dockerd), logged in with a per-build ``DOCKER_CONFIG`` that holds only that registry's
  entry; to the image-layout registry with ``skopeo copy docker-daemon:IMG oci:DIR:TAG`` into a
  per-build layout, whose blobs and manifest (byte for byte, so the digest is the same) are then
  written through lockstep's LayoutRegistry, which
  takes the layout's lock as every other writer does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from resources.registry import ImageRef, LayoutRegistry, RegistryError
from sandbox.engines import DOCKER, Engine

ENGINE_STATE = Path("iris") / "engine"  # under the sandbox root: stop_engines(root) finds it
# what the consumer's Dockerfile starts FROM (sandbox/consumer_source.py BASE_IMAGE)
BASES = ["python"]
SKOPEO = Path("/usr/bin/skopeo")
BUILD_TIMEOUT_S = 1800
PUSH_TIMEOUT_S = 600
_PUSHED = re.compile(r"^\S+: digest: (sha256:[0-9a-f]{64}) size: \d+$", re.MULTILINE)


class BuildError(RuntimeError):
    """The build or the push failed; the message is what kaniko would print (no secret in it)."""


def engine_for(sandbox_root: Path) -> Engine:
    return Engine(sandbox_root / ENGINE_STATE)


def _docker(
    engine: Engine,
    *args: str,
    timeout: int = 120,
    env: dict[str, str] | None = None,
    stdin: IO[bytes] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """The engine's own client (argv, never a shell), its output captured."""
    return subprocess.run(
        [str(DOCKER), *args],
        env=env or engine.env(),
        capture_output=True,
        timeout=timeout,
        check=False,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
    )


def _fail(what: str, proc: subprocess.CompletedProcess[bytes]) -> BuildError:
    return BuildError(
        f"{what}: "
        f"{proc.stderr.decode(errors='replace').strip() or proc.stdout.decode(errors='replace').strip()}"  # noqa: E501
    )


def build(engine: Engine, *, context: Path, dockerfile: Path, tag: str, cache: bool) -> str:
    """`docker build` the context with BuildKit, streaming
    its plain progress to stdout; returns the image ID."""
    argv = [
        str(DOCKER),
        "build",
        "--network=host",
        "--progress=plain",
        "-f",
        str(dockerfile),
        "-t",
        tag,
    ]
    if not cache:
        argv.append("--no-cache")
    argv.append(str(context))
    proc = subprocess.Popen(
        argv,
        env=engine.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line.decode(errors="replace"), end="", flush=True)
    try:
        code = proc.wait(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BuildError(f"the build did not finish in {BUILD_TIMEOUT_S} s") from None
    if code != 0:
        raise BuildError(f"error building image: docker build exited {code} (its output is above)")
    inspect = _docker(engine, "image", "inspect", "--format", "{{.Id}}", tag)
    if inspect.returncode != 0:
        raise _fail(f"inspecting {tag}", inspect)
    return inspect.stdout.decode().strip()


def _changes(config: dict) -> list[str]:
    """`docker import --change` lines that give an
    imported filesystem the built image's config back."""
    changes = [
        f"ENV {env.split('=', 1)[0]}={json.dumps(env.split('=', 1)[1])}"
        for env in config.get("Env") or []
    ]
    if config.get("WorkingDir"):
        changes.append(f"WORKDIR {config['WorkingDir']}")
    for key, instruction in (("Entrypoint", "ENTRYPOINT"), ("Cmd", "CMD")):
        if config.get(key):
            changes.append(f"{instruction} {json.dumps(config[key])}")
    changes += [
        f"LABEL {json.dumps(k)}={json.dumps(v)}"
        for k, v in sorted((config.get("Labels") or {}).items())
    ]
    return changes


def single_snapshot(engine: Engine, *, image: str, tag: str) -> str:
    """The image's whole filesystem as one layer (kaniko
    --single-snapshot), config kept; returns the new ID."""
    inspect = _docker(engine, "image", "inspect", "--format", "{{json .Config}}", image)
    if inspect.returncode != 0:
        raise _fail(f"inspecting {image}", inspect)
    config = json.loads(inspect.stdout)
    created = _docker(engine, "create", "--network=none", image)
    if created.returncode != 0:
        raise _fail(f"creating a container of {image} to snapshot", created)
    container = created.stdout.decode().strip()
    try:
        export = subprocess.Popen(
            [str(DOCKER), "export", container],
            env=engine.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        argv = ["import"]
        for change in _changes(config):
            argv += ["--change", change]
        try:
            imported = _docker(
                engine, *argv, "-", tag, stdin=export.stdout, timeout=BUILD_TIMEOUT_S
            )
        finally:
            assert export.stdout is not None
            # a failed import leaves the export without a reader: it ends on EPIPE
            export.stdout.close()
            try:
                export.wait(timeout=60)
            except subprocess.TimeoutExpired:
                export.kill()
                export.wait()
        if export.returncode != 0 or imported.returncode != 0:
            raise _fail("taking the single snapshot (docker export | docker import)", imported)
        return imported.stdout.decode().strip()
    finally:
        _docker(engine, "rm", "-f", container)


@contextmanager
def _docker_config(host: str, auth: str) -> Iterator[Path]:
    """A per-build DOCKER_CONFIG holding only `host`'s entry (0700, removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="lockstep-kaniko-auth-") as tmp:
        path = Path(tmp) / "config.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"auths": {host: {"auth": auth}}}, out)
        yield Path(tmp)


def push_http(engine: Engine, *, image: str, destination: ImageRef, auth: str) -> str:
    """`docker push` the image as `destination` with `auth`
    (config.json's base64 user:password); returns the digest."""
    target = str(destination)
    tagged = _docker(engine, "tag", image, target)
    if tagged.returncode != 0:
        raise _fail(f"tagging {target}", tagged)
    try:
        with _docker_config(destination.registry, auth) as config:
            env = {**engine.env(), "DOCKER_CONFIG": str(config)}
            pushed = _docker(engine, "push", target, env=env, timeout=PUSH_TIMEOUT_S)
    finally:
        # the engine keeps the image, not the destination's name
        _docker(engine, "rmi", "--no-prune", target)
    out = pushed.stdout.decode(errors="replace")
    if pushed.returncode != 0:
        raise _fail(f"pushing to {target}", pushed)
    found = _PUSHED.search(out)
    if found is None:
        raise BuildError(f"pushing to {target}: docker push printed no digest")
    return found.group(1)


def push_layout(
    engine: Engine, *, image: str, destination: ImageRef, registry: LayoutRegistry
) -> str:
    """`skopeo copy docker-daemon:IMAGE oci:DIR:TAG`, then
    DIR's manifest and blobs into the layout registry."""
    if not SKOPEO.is_file():
        raise BuildError(f"{SKOPEO} not found: install skopeo (./dev setup does)")
    tag = destination.tag or "latest"
    with tempfile.TemporaryDirectory(prefix="lockstep-kaniko-oci-") as tmp:
        layout = Path(tmp) / "oci"
        proc = subprocess.run(
            [
                str(SKOPEO),
                "copy",
                "--quiet",
                "--dest-compress",
                "--src-daemon-host",
                engine.host,
                f"docker-daemon:{image}",
                f"oci:{layout}:{tag}",
            ],
            capture_output=True,
            timeout=PUSH_TIMEOUT_S,
            check=False,
            env={"PATH": os.defpath, "HOME": tmp},
        )
        if proc.returncode != 0:
            raise _fail(f"skopeo copy of {image} into an image layout", proc)
        index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
        entry = index["manifests"][0]
        raw = _blob(layout, entry["digest"]).read_bytes()
        manifest = json.loads(raw)
        for desc in [manifest["config"], *manifest["layers"]]:
            registry.push_blob_file(
                repository=destination.repository,
                path=_blob(layout, desc["digest"]),
                media_type=desc["mediaType"],
            )
        return registry.push_manifest(
            repository=destination.repository,
            raw=raw,
            media_type=entry["mediaType"],
            tag=destination.tag,
        )


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexpart = digest.partition(":")
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexpart):
        raise RegistryError(f"skopeo wrote a descriptor with digest {digest!r}")
    return layout / "blobs" / algorithm / hexpart


def remove_image(engine: Engine, tag: str) -> None:
    """Drop a build's local name; its layers stay in the engine as the next build's cache."""
    _docker(engine, "rmi", "--no-prune", tag)


def prepare(sandbox_root: Path) -> Engine:
    """The TPU build engine, running, with its base loaded."""
    engine = engine_for(sandbox_root)
    engine.start()
    engine.ensure_bases(BASES)
    return engine
