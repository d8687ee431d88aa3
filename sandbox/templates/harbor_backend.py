"""harbor's in-tree PEP 517 build backend (lockstep sandbox): a pure-python wheel, stdlib only.

The sandbox's harbor is installed by uv from git, inside a build container with no package index;
with ``[build-system] requires = []`` and this backend (``backend-path = ["."]``) nothing has to be
fetched to build it. It writes a PEP 427 wheel of the ``harbor`` package (PEP 517 ``build_wheel``)
and a ``.pth`` editable wheel (PEP 660 ``build_editable``, which ``uv pip install -e`` asks for).
"""

import base64
import hashlib
import os
import tomllib
import zipfile
from pathlib import Path

TAG = "py3-none-any"
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip timestamps: the same commit builds the same wheel


def _project():
    project = tomllib.loads(Path("pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["name"], project["version"], sorted(project.get("optional-dependencies", {}))


def _wheel(directory, files):
    name, version, extras = _project()
    dist_info = f"{name}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Provides-Extra: {extra}" for extra in extras]
    files = {
        **files,
        f"{dist_info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: backend\nRoot-Is-Purelib: true\nTag: {TAG}\n"
        ).encode(),
    }
    filename = f"{name}-{version}-{TAG}.whl"
    record = []
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as wheel:
        for arcname in sorted(files):
            wheel.writestr(zipfile.ZipInfo(arcname, EPOCH), files[arcname])
            digest = (
                base64.urlsafe_b64encode(hashlib.sha256(files[arcname]).digest())
                .rstrip(b"=")
                .decode()
            )
            record.append(f"{arcname},sha256={digest},{len(files[arcname])}")
        record.append(f"{dist_info}/RECORD,,")
        wheel.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", EPOCH), "\n".join(record) + "\n")
    return filename


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(
        wheel_directory,
        {p.as_posix(): p.read_bytes() for p in sorted(Path("harbor").rglob("*.py"))},
    )


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"_harbor_editable.pth": (str(Path.cwd()) + "\n").encode()})
