"""A write that fails (full disk, quota, file-size limit) is a clear error naming the path, and
leaves the old file or none: never half a file, never a temp file.

The disk is "full" by RLIMIT_FSIZE in a child process (SIGXFSZ ignored, so a write past the limit
raises EFBIG instead of killing it): every file that child writes stops at LIMIT bytes, as on a
disk that fills up mid-write. The parent inspects what is left on disk after the child exits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 * 1024
# more than LIMIT: the write fails part way, after LIMIT bytes reached the temp file
BIG = 200 * 1024

_CHILD = """
import hashlib, io, json, resource, signal, sys
from pathlib import Path

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit, big, root = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

from resources.atomic import write_atomic
from resources.registry import LayoutRegistry
from resources.registry.cache import BlobCache

def attempt(case, call):
    try:
        out = {"returned": repr(call())}
    except BaseException as exc:
        out = {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    print(json.dumps({"case": case, **out}), flush=True)

attempt("replace", lambda: write_atomic(root / "replace" / "profile.env", "x" * big))
attempt("new", lambda: write_atomic(root / "new" / "report.md", b"x" * big))
attempt("small", lambda: write_atomic(root / "small" / "uv.lock", "new lock\\n"))
layout = LayoutRegistry(root=str(root / "layout"))
attempt("blob", lambda: layout.push_blob(repository="team/img", data=b"y" * big, media_type="application/octet-stream"))

data = b"z" * big
digest = "sha256:" + hashlib.sha256(data).hexdigest()
cache = BlobCache(root / "cache", 1 << 30)
def through_cache():
    fill = cache.filling(digest, io.BytesIO(data))
    read = fill.read()
    fill.commit()
    fill.close()
    return len(read)
attempt("cache", through_cache)
"""  # noqa: E501


def _run_full_disk(tmp_path: Path) -> dict[str, dict]:
    for name in ("replace", "new", "small", "layout", "cache"):
        (tmp_path / name).mkdir()
    (tmp_path / "replace" / "profile.env").write_text("OLD=1\n")
    (tmp_path / "small" / "uv.lock").write_text("old lock\n")
    (tmp_path / "small" / "uv.lock").chmod(0o640)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(LIMIT), str(BIG), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {line["case"]: line for line in map(json.loads, done.stdout.splitlines())}


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _assert_write_failed(got: dict, path: Path) -> None:
    assert got.get("type") == "WriteFailed" and "LockstepError" in got["mro"], got
    assert f"cannot write {path}: " in got["message"] and "EFBIG" in got["message"], got["message"]
    assert "free space on that disk" in got["message"]


def test_a_full_disk_is_an_error_naming_the_path_and_leaves_the_old_file_or_none(
    tmp_path: Path,
) -> None:
    got = _run_full_disk(tmp_path)

    # Replacing a file: the old content stays, whole; no temp file beside it.
    _assert_write_failed(got["replace"], tmp_path / "replace" / "profile.env")
    assert _files(tmp_path / "replace") == ["profile.env"]
    assert (tmp_path / "replace" / "profile.env").read_text() == "OLD=1\n"

    # A new file: still absent, nothing else there.
    _assert_write_failed(got["new"], tmp_path / "new" / "report.md")
    assert _files(tmp_path / "new") == []

    # A write that fits replaces the file whole and keeps its mode.
    assert got["small"] == {"case": "small", "returned": "None"}
    assert _files(tmp_path / "small") == ["uv.lock"]
    assert (tmp_path / "small" / "uv.lock").read_text() == "new lock\n"
    assert (tmp_path / "small" / "uv.lock").stat().st_mode & 0o777 == 0o640

    # The layout registry's blob upload: the error names the blob's path; no blob, no temp file.
    blob = got["blob"]
    assert blob.get("type") == "WriteFailed", blob
    named = re.search(r"cannot write (\S+): ", blob["message"])
    assert named and named.group(1).startswith(
        str(tmp_path / "layout" / "team" / "img" / "blobs" / "sha256")
    ), blob
    assert [
        f for f in _files(tmp_path / "layout") if "/blobs/" in f or f.startswith("blobs/")
    ] == []

    # The blob cache: a full disk costs the cache, never the read; nothing half-cached is left.
    assert got["cache"] == {"case": "cache", "returned": str(200 * 1024)}
    assert [f for f in _files(tmp_path / "cache") if f != ".lock"] == []


# Lock files opened for flock only (never written to), and the sandbox demo's setup copy.
_ALLOWED = {
    "resources/git.py": 'open(str(path) + ".lock", "w")',
    "resources/registry/layout.py": 'open(repo / "index.json.lock", "a")',
    "resources/registry/cache.py": 'open(self.root / ".lock", "a")',
    "tpu_assets/tag_lock.py": 'open(path, "a+")',
}
_WRITE = re.compile(
    r"\.write_(text|bytes)\(|\bopen\([^)]*['\"](w|a|x)b?\+?['\"]|os\.fdopen\(|mkstemp\("
)


def test_every_file_lockstep_writes_goes_through_the_atomic_helper() -> None:
    found = []
    for package in ("resources", "tpu_assets", "jovian_assets", "lockstep"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in ("resources/atomic.py", "resources/registry/cache.py") or rel.startswith(
                "lockstep/cli.py"
            ):
                # the helper itself; the cache's tee (tested above); the CLI's sandbox set-up
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _WRITE.search(line) and _ALLOWED.get(rel) not in line:
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], (
        "write these with resources.atomic.write_atomic / atomic_output:\n" + "\n".join(found)
    )
