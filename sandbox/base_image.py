"""Base images for the sandbox's Docker engines, made offline from this machine's own files.

No registry is reachable from the sandbox, so nothing can be pulled; a base is a root filesystem
copied from the host: Debian's ``/usr/bin/python3.11`` with its stdlib and every shared library
``ldd`` names for it and its extension modules, busybox (``busybox-static``) for ``sh`` and the
coreutils, bash, git (with ``git-core``) and uv. A caller adds its own files (the GPU toolchain
stand-ins of the Jovian base). The result is a ``docker load`` archive built byte-for-byte
deterministically (sorted entries, owner 0, mtime 0, fixed config), so the same inputs give the same
image ID in every engine, and it is cached under ``.tools/base-images/`` keyed by its
inputs: made once per machine, loaded per engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = PROJECT_ROOT / ".tools" / "base-images"
FORMAT = "lockstep-base/4"  # bump when what goes into a base changes

PYTHON = Path("/usr/bin/python3.11")
PYTHON_LIB = Path("/usr/lib/python3.11")
BUSYBOX = Path("/bin/busybox")
BASH = Path("/bin/bash")
GIT = Path("/usr/bin/git")
GIT_CORE = Path("/usr/lib/git-core")
GIT_TEMPLATES = Path("/usr/share/git-core/templates")
# Parts of the stdlib no build or gate uses; left out to keep the base small.
PYTHON_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "EXTERNALLY-MANAGED",
}
IMAGE_PATH = (
    "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/"
    "bin:/sbin:/bin"
)


class BaseImageError(RuntimeError):
    """The host lacks a file a base image is made from; the message names the package to install."""


@dataclass(frozen=True)
class ExtraFile:
    data: bytes
    mode: int = 0o755


@dataclass(frozen=True)
class BaseSpec:
    """What one base holds beyond the common rootfs: its tags and the caller's own files."""

    tags: tuple[str, ...]
    extra: Mapping[str, ExtraFile] = field(default_factory=dict)
    env: tuple[str, ...] = ()
    # More host files or directory trees, copied at their
    # own paths with every library their ELF files need.
    host_paths: tuple[Path, ...] = ()
    # Lines appended to /etc/passwd and /etc/group (a
    # service that refuses to run as root needs a user).
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ("/bin/sh",)


def _uv_binary() -> Path:
    for candidate in (PROJECT_ROOT / ".tools" / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    raise BaseImageError("uv is not installed: run ./dev setup (it installs uv into .tools/)")


def _require(path: Path, package: str) -> Path:
    if not path.exists():
        raise BaseImageError(
            f"{path} is missing: the sandbox's base images copy it from this machine; "
            f"install Debian's {package} (apt-get install {package})"
        )
    return path


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def _libraries(binaries: list[Path]) -> set[Path]:
    """Every shared library the dynamic loader resolves
    for `binaries` (ldd), the loader included."""
    libs: set[Path] = set()
    for chunk in range(0, len(binaries), 200):
        proc = subprocess.run(
            ["ldd", *map(str, binaries[chunk : chunk + 200])],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        for line in proc.stdout.splitlines():
            m = _LDD_LINE.search(line)
            if m:
                libs.add(Path(m.group(1)))
    return libs


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _walk(root: Path, skip: set[str] = frozenset()) -> Iterator[Path]:  # type: ignore[assignment]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) == root and d in skip))
        for name in sorted(filenames):
            if Path(dirpath) == root and name in skip:
                continue
            yield Path(dirpath) / name


def host_files(uv: Path, extra: tuple[Path, ...] = ()) -> list[Path]:
    """The host files a base copies, in a stable order
    (their paths stay the same inside the image)."""
    _require(PYTHON, "python3.11")
    _require(BUSYBOX, "busybox-static")
    _require(GIT, "git")
    files = [
        PYTHON,
        BASH,
        GIT,
        *_walk(PYTHON_LIB, PYTHON_SKIP),
        *_walk(GIT_CORE),
        *_walk(GIT_TEMPLATES),
    ]
    for path in extra:
        files += list(_walk(path)) if path.is_dir() else [path]
    elves = [p for p in files if not p.is_symlink() and _is_elf(p)]
    files += sorted(_libraries([*elves, uv]) - set(files))
    # A symlink (the loader, most sonames) is copied as a link: its target must come along too.
    targets = {Path(os.path.realpath(p)) for p in files if p.is_symlink()} - set(files)
    return files + sorted(t for t in targets if t.is_file())


def _key(spec: BaseSpec, files: list[Path], uv: Path) -> str:
    h = hashlib.sha256(FORMAT.encode())
    for p in [*files, BUSYBOX, uv]:
        st = p.lstat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for name in sorted(spec.extra):
        h.update(
            f"{name}\0{spec.extra[name].mode}\0".encode()
            + hashlib.sha256(spec.extra[name].data).digest()
        )
    h.update(
        "\0".join(
            (*spec.tags, "|", *spec.env, "|", *spec.users, "|", *spec.groups, "|", *spec.cmd)
        ).encode()
    )
    return h.hexdigest()[:24]


class _Layer:
    """A deterministic layer tar: directories made on demand, entries owned by root with mtime 0."""

    def __init__(self, fileobj: io.BufferedIOBase) -> None:
        self.tar = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self.seen: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = (
            kind,
            mode,
            0,
            0,
            0,
            "root",
            "root",
        )
        return info

    def dirs(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in self.seen:
                self.seen.add(d)
                self.tar.addfile(
                    self._info(d, tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp") else 0o755)
                )

    def add(self, name: str, data: bytes, mode: int = 0o644) -> None:
        name = name.lstrip("/")
        if name in self.seen:
            return
        self.dirs(name)
        self.seen.add(name)
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def link(self, name: str, target: str) -> None:
        name = name.lstrip("/")
        if name in self.seen:
            return
        self.dirs(name)
        self.seen.add(name)
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def host(self, path: Path) -> None:
        # Debian merges /bin and /lib into /usr: the image keeps the merged layout (bin -> usr/bin).
        name = str(path).lstrip("/")
        for merged in ("bin/", "lib/", "lib64/", "sbin/"):
            if name.startswith(merged):
                name = "usr/" + name
        if path.is_symlink():
            self.link(name, os.readlink(path))
        else:
            self.add(name, path.read_bytes(), path.stat().st_mode & 0o777)


def _layer_bytes(spec: BaseSpec, files: list[Path], uv: Path) -> bytes:
    buf = io.BytesIO()
    layer = _Layer(buf)
    for merged in ("bin", "lib", "lib64", "sbin"):
        layer.link(merged, f"usr/{merged}")
    layer.dirs("tmp/x")
    layer.dirs("var/tmp/x")  # skopeo's (and Debian's) spool for large temporary files
    layer.dirs("root/x")
    layer.add(
        "etc/passwd",
        "".join(f"{u}\n" for u in ("root:x:0:0:root:/root:/bin/sh", *spec.users)).encode(),
    )
    layer.add("etc/group", "".join(f"{g}\n" for g in ("root:x:0:", *spec.groups)).encode())
    layer.add("etc/hosts", b"127.0.0.1 localhost\n")
    for name, extra in sorted(spec.extra.items()):
        layer.add(name, extra.data, extra.mode)
    for p in files:
        layer.host(p)
    layer.add("usr/bin/busybox", BUSYBOX.read_bytes(), 0o755)
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in sorted(applets):
        if applet not in ("busybox", "bash", "git", "python", "python3"):
            layer.link(f"usr/bin/{applet}", "busybox")
    layer.link("usr/bin/python3", "python3.11")
    layer.link("usr/bin/python", "python3.11")
    layer.add("usr/local/bin/uv", uv.read_bytes(), 0o755)
    layer.tar.close()
    return buf.getvalue()


def _archive(spec: BaseSpec, layer: bytes) -> bytes:
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Env": [f"PATH={IMAGE_PATH}", "LANG=C.UTF-8", *spec.env],
                "Cmd": list(spec.cmd),
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [
                {
                    "created": "1970-01-01T00:00:00Z",
                    "created_by": "lockstep sandbox base (host files)",
                }
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": list(spec.tags), "Layers": ["layer/layer.tar"]}]
    ).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (
            (config_name, config),
            ("layer/layer.tar", layer),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def image_id(archive: Path) -> str:
    """The image ID (`sha256:` + the config's digest) a base archive loads as."""
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    return "sha256:" + manifest[0]["Config"].removesuffix(".json")


def base_archive(spec: BaseSpec) -> Path:
    """The `docker load` archive for `spec`, made once per machine (content-keyed under .tools/)."""
    uv = _uv_binary()
    files = host_files(uv, spec.host_paths)
    target = CACHE_DIR / f"{_key(spec, files, uv)}.tar"
    if target.is_file():
        return target
    with _locked(CACHE_DIR / ".lock"):
        if target.is_file():
            return target
        data = _archive(spec, _layer_bytes(spec, files, uv))
        fd, tmp = tempfile.mkstemp(dir=CACHE_DIR, prefix=".base-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    return target
