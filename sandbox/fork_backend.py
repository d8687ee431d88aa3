"""The in-tree PEP 517 build backend the sandbox's forks
(vLLM, b12x, LMCache) carry as ``_build/backend.py``.

The real forks build with setuptools, CMake and torch, none of which a build here can download (no
index is reachable). So each sandbox fork carries this stdlib-only backend (``requires = []``,
``backend-path = ["_build"]``), and ``uv build --wheel`` runs it inside the real BuildKit build like
any PEP 517 backend: hooks as PEP 517 names them, a wheel as the binary distribution format (PEP
427, ``RECORD`` with sha256 digests) with ``entry_points.txt`` so installers write console scripts.

What it takes from the fork's ``pyproject.toml``: ``[project] name`` and ``[tool.sandbox-build]``:
``packages`` (directories copied into the wheel), ``scripts`` (console scripts), ``extensions``
(each ``{name, sources, archs}``: the sources compiled with ``nvcc`` into ``name``). The version is
``SETUPTOOLS_SCM_PRETEND_VERSION``, as setuptools-scm reads it, written to ``<pkg>/_version.py``.

``archs = "cmake"`` is vLLM's arch selection (vllm-project/vllm ``cmake/utils.cmake``
``cuda_archs_loose_intersection`` at dae1891696cd2a04780509cf17ac7ab64e840981, simplified):
each TORCH_CUDA_ARCH_LIST entry is kept when ``CUDA_SUPPORTED_ARCHS`` in CMakeLists.txt lists it,
else mapped onto the supported arch of its family (12.1a -> 12.0: the GB10 trap
``preserve_sm12x_target`` fixes), else dropped. ``archs = "torch"`` compiles
exactly TORCH_CUDA_ARCH_LIST (torch.utils.cpp_extension).
"""

from __future__ import annotations

BACKEND = r'''"""PEP 517 backend of this sandbox fork (stdlib only: builds offline). See lockstep sandbox/fork_backend.py."""
import base64, glob, hashlib, io, os, re, subprocess, tempfile, tomllib, zipfile

_TAG = "py3-none-any"


def _project():
    with open("pyproject.toml", "rb") as f:
        data = tomllib.load(f)
    return data["project"]["name"], data.get("tool", {}).get("sandbox-build", {})


def _version():
    """SETUPTOOLS_SCM_PRETEND_VERSION, else what setuptools-scm says of an untagged checkout."""
    if pretend := os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION"):
        return pretend
    git = ["git", "-c", "safe.directory=*"]
    try:
        sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        count = subprocess.run([*git, "rev-list", "--count", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "0.0.0"
    return f"0.1.dev{count}+g{sha[:7]}"


def _arch_list():
    raw = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()
    if not raw:
        raise SystemExit("build: TORCH_CUDA_ARCH_LIST is not set: the kernels would be built for no GPU")
    return raw


def _cmake_supported():
    text = open("CMakeLists.txt", encoding="utf-8").read()
    m = re.search(r'^set\(CUDA_SUPPORTED_ARCHS "([^"]*)"\)', text, re.M)
    if not m:
        raise SystemExit("build: CMakeLists.txt sets no CUDA_SUPPORTED_ARCHS")
    return m.group(1).split(";")


def _loose_intersection(wanted, supported):
    out = []
    for arch in wanted:
        if arch in supported:
            out.append(arch)
            continue
        family = [s for s in supported if s.split(".")[0] == arch.split(".")[0] and s.rstrip("af") <= arch.rstrip("af")]
        if family:
            out.append(max(family))
    return list(dict.fromkeys(out))


def _sm(arch):
    return "sm_" + arch.replace(".", "")


def _compile(ext, workdir):
    wanted = _arch_list()
    archs = _loose_intersection(wanted, _cmake_supported()) if ext.get("archs") == "cmake" else wanted
    print(f"build: {ext['name']}: TORCH_CUDA_ARCH_LIST={' '.join(wanted)} -> CUDA archs {' '.join(archs) or 'none'}", flush=True)
    sources = sorted(glob.glob(ext["sources"]))
    if not sources or not archs:
        raise SystemExit(f"build: {ext['name']}: nothing to compile (sources {ext['sources']}, archs {archs})")
    out = os.path.join(workdir, os.path.basename(ext["name"]))
    gencode = [f"-gencode=arch=compute_{a.replace('.', '')},code={_sm(a)}" for a in archs]
    subprocess.run(["nvcc", *gencode, "-shared", "-o", out, *sources], check=True)
    return out


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name, cfg = _project()
    version = _version()
    dist = f"{name.replace('-', '_')}-{version}"
    files = {}
    for pkg in cfg.get("packages", [name]):
        for path in sorted(glob.glob(f"{pkg}/**/*", recursive=True)):
            if os.path.isfile(path) and "__pycache__" not in path:
                files[path] = open(path, "rb").read()
        files[f"{pkg}/_version.py"] = f'__version__ = version = "{version}"\n'.encode()
    with tempfile.TemporaryDirectory() as tmp:
        for ext in cfg.get("extensions", []):
            files[ext["name"]] = open(_compile(ext, tmp), "rb").read()
    info = f"{dist}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: sandbox-fork-backend\nRoot-Is-Purelib: true\nTag: {_TAG}\n".encode()
    if scripts := cfg.get("scripts"):
        body = "".join(f"{k} = {v}\n" for k, v in scripts.items())
        files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{body}".encode()
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = f"{dist}-{_TAG}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            zf.writestr(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), d)
    print(f"build: {wheel}", flush=True)
    return wheel
'''  # noqa: E501


def pyproject(
    name: str,
    *,
    packages: list[str],
    extensions: list[dict[str, str]] | None = None,
    scripts: dict[str, str] | None = None,
) -> str:
    """A fork's pyproject.toml for the in-tree backend."""
    lines = [
        "[build-system]",
        (
            "# Sandbox fork: an in-tree stdlib backend (_build/backend.py) so the build needs "
            "no index. The real"
        ),
        "# fork builds with setuptools + CMake + torch.",
        "requires = []",
        'build-backend = "backend"',
        'backend-path = ["_build"]',
        "",
        "[project]",
        f'name = "{name}"',
        'dynamic = ["version"]',
        'requires-python = ">=3.10"',
        "",
        "[tool.sandbox-build]",
        f"packages = {packages!r}".replace("'", '"'),
    ]
    if scripts:
        lines.append("scripts = { " + ", ".join(f'{k} = "{v}"' for k, v in scripts.items()) + " }")
    for ext in extensions or []:
        lines += [
            "",
            "[[tool.sandbox-build.extensions]]",
            *(f'{k} = "{v}"' for k, v in ext.items()),
        ]
    return "\n".join(lines) + "\n"
