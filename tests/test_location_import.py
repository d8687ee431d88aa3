"""Loading a code location does no work and pulls in
no heavy client library: each loads when first used.

A code server, `dagster dev` and every run worker import both locations before doing anything, so
what their modules import is paid on every start (bench/location_load_bench.py measures it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Third-party modules a location must not import when it loads (each is imported where it is used).
LAZY = (
    "paramiko",
    "invoke",
    "nacl",
    "bcrypt",  # SSH to the Spark nodes
    "git",
    "gitdb",  # GitPython
    "requests",
    "urllib3",
    "charset_normalizer",
    "idna",
    "certifi",  # the registry and the webhooks
    "cryptography",  # attestation keys
    "tomlkit",  # the runtime pin's uv.lock edits
    "cronsim",  # freeze windows
    "zstandard",
    "tarfile",
    "gzip",  # image layers
    # GB10 pins (dagster itself imports packaging.version)
    "packaging.requirements",
    "packaging.utils",
    "kubernetes",
    "jsonschema",
    "securesystemslib",  # never needed to load
    # lockstep's own, loaded by the first call that needs them: the registry backends (chosen by the
    # site file), the layer walker, and the domain code only a run of its assets uses (the build,
    # the inspection, attestation and changelogs, the cmake
    # parser, the GB10 rules, the lane, the bench tools)
    "resources.registry.http",
    "resources.registry.layout",
    "resources.registry.transport",
    "resources.registry.layers",
    "resources.registry.referrers",
    "resources.spark.host_keys",
    "resources.changelog",
    "resources.kaniko",
    "resources.attest",
    "tpu_assets.build",
    "tpu_assets.build_script",
    "tpu_assets.inspection",
    "tpu_assets.verify",
    "tpu_assets.attestation",
    "tpu_assets.provenance",
    "tpu_assets.changelog",
    "jovian_assets.dep_table",
    "jovian_assets.cmake_syntax",
    "jovian_assets.gb10",
    "jovian_assets.lane",
    "jovian_assets.dep_trees",
    "jovian_assets.profile",
    "jovian_assets.bench_tools",
)

# dagster's own import runs `file -b python` (its vendored croniter asks platform.architecture()):
# the hook goes in after it, so it sees what lockstep's modules do.
_CHILD = """
import json, os, sys
import dagster
roots = tuple(sys.argv[1:])
seen = {"opened": [], "started": [], "connected": []}

def under_roots(path):
    try:
        path = os.path.abspath(os.fsdecode(path))
    except TypeError:
        return False
    return path.startswith(roots)

def hook(event, args):
    if event == "open" and under_roots(args[0]):
        seen["opened"].append(os.fsdecode(args[0]))
    elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.system", "os.fork"):
        seen["started"].append(event)
    elif event == "socket.connect":
        seen["connected"].append(repr(args[1]))

sys.addaudithook(hook)
import tpu_assets.definitions as tpu
import jovian_assets.definitions as jovian
for defs in (tpu.defs, jovian.defs):
    defs.get_repository_def()  # what a code server and a run worker do with the module's defs
seen["loaded"] = sorted(sys.modules)
print(json.dumps(seen))
"""


def load_both_locations(tmp_path: Path) -> dict[str, list[str]]:
    """Both locations loaded in a fresh interpreter with
    no site file, from an empty working directory."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "DAGSTER_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        HOME=str(home),
        DAGSTER_HOME=str(home / "dagster"),
        LOCKSTEP_CACHE=str(home / "cache"),
    )
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(cwd), str(home)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_loading_both_locations_imports_no_client_library_and_does_no_work(tmp_path: Path) -> None:
    seen = load_both_locations(tmp_path)
    loaded = set(seen["loaded"])
    assert {"tpu_assets.definitions", "jovian_assets.definitions", "dagster", "pydantic"} <= loaded
    assert sorted(name for name in LAZY if name in loaded) == []
    # No site file, no sandbox, no cache: nothing read or written under the working directory or
    # HOME, no process started, no connection made.
    assert seen["opened"] == [] and seen["started"] == [] and seen["connected"] == []
    assert list((tmp_path / "cwd").iterdir()) == [] and list((tmp_path / "home").iterdir()) == []


def test_every_name_the_registry_package_exports_loads_from_its_module() -> None:
    from resources import registry

    assert set(registry._MODULE_OF) == set(registry.__all__)
    for name in registry.__all__:
        getattr(registry, name)  # an AttributeError names a name whose module moved
