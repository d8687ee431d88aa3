"""Scanning everything lockstep wrote for secret canaries: files, SQLite rows and git objects.

A canary is a unique random value put into a secret env var before a flow runs; afterwards no place
lockstep wrote may hold it, raw or in a form a leak would take: base64 of the value at any offset
(inside a docker ``auths`` line or any larger base64 blob), base64 of ``user:value`` (HTTP basic
auth), URL-encoded, JSON-escaped. Gzip and zlib payloads (registry layers, Dagster's compressed
snapshots) are searched inflated too: a leak into an image layer or a snapshot must not hide behind
compression.

Where it looks, under each root given:
- every SQLite database (found by its header), row by row in every table: event logs hold metadata,
  run config and tags; the database file's bytes are not searched again;
- every git repository (a directory with ``HEAD`` and ``objects/``), object by object with ``git
  cat-file --batch-all-objects --batch``: every commit, tree and blob, unreachable ones included;
  the object files themselves are not searched again;
- every other file.

A place counts once per canary however many times or forms it holds it: a finding names the
place, so "0 found" and "exactly these 3 found" are both checkable.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import sqlite3
import subprocess
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

SQLITE_HEADER = b"SQLite format 3\x00"
_GZIP = b"\x1f\x8b"
_ZLIB_FIRST = {0x78}  # CMF of deflate with a 32 KiB window: every zlib stream Python or git writes
_MAX_INFLATE = 256 * 1024 * 1024  # a bound, so a hostile or huge blob cannot eat the machine


@dataclass(frozen=True)
class Canary:
    """A secret env var's stand-in value; `users` are
    the names it may be paired with in basic auth."""

    env: str
    value: str
    users: tuple[str, ...] = ()

    def forms(self) -> dict[str, bytes]:
        """Every byte string whose presence means the value leaked, by how it was encoded."""
        raw = self.value.encode()
        found: dict[str, bytes] = {"raw": raw}
        # base64 of any string holding the value: its characters depend on the offset modulo 3, and
        # all but the first and last 4-character groups of each alignment are the value's own.
        for pad in range(3):
            encoded = base64.b64encode(b"\0" * pad + raw)
            core = encoded[4 if pad else 0 : -4]
            if len(core) >= 8:
                found[f"base64 (offset {pad})"] = core
        for user in self.users:
            found[f"base64 of {user}:value"] = base64.b64encode(f"{user}:{self.value}".encode())
        found["url-encoded"] = quote(self.value, safe="").encode()
        found["json-escaped"] = json.dumps(self.value)[1:-1].encode()
        found["json-escaped (ascii)"] = json.dumps(self.value, ensure_ascii=True)[1:-1].encode()
        unique: dict[bytes, str] = {}
        for name, form in found.items():
            unique.setdefault(form, name)
        return {name: form for form, name in unique.items()}


@dataclass(frozen=True)
class Finding:
    canary: str  # the env var's NAME, never the value
    where: str  # "file PATH", "sqlite PATH table T rowid N", "git REPO object SHA (type)"
    forms: tuple[str, ...]


@dataclass
class ScanReport:
    files: int = 0
    sqlite_rows: int = 0
    git_objects: int = 0
    excluded: list[Path] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Every directory walked, and when the walk began: a test proves the scan covered a place (e.g.
    # a finished job's directory) and came after something
    # ended, so a scan cannot pass by not looking.
    walked: set[Path] = field(default_factory=set)
    started_ms: int = 0

    def by_canary(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for f in self.findings:
            out.setdefault(f.canary, []).append(f"{f.where} [{', '.join(f.forms)}]")
        return out


def _inflated(data: bytes) -> Iterator[bytes]:
    """`data`, and what it holds if it is a gzip or zlib stream (one level; a bounded size)."""
    yield data
    if len(data) < 2:
        return
    try:
        if data[:2] == _GZIP:
            with gzip.GzipFile(fileobj=_Bytes(data)) as fh:
                yield fh.read(_MAX_INFLATE)
        elif data[0] in _ZLIB_FIRST and (data[0] * 256 + data[1]) % 31 == 0:
            yield zlib.decompressobj().decompress(data, _MAX_INFLATE)
    except (OSError, EOFError, zlib.error):
        return


class _Bytes:
    """A minimal read-only file over bytes for GzipFile (io.BytesIO would copy them again)."""

    def __init__(self, data: bytes) -> None:
        self._view, self._pos = memoryview(data), 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        chunk = bytes(self._view[self._pos : end])
        self._pos = end
        return chunk

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = {0: pos, 1: self._pos + pos, 2: len(self._view) + pos}[whence]
        return self._pos

    def tell(self) -> int:
        return self._pos


class _Matcher:
    def __init__(self, canaries: Iterable[Canary]) -> None:
        self.forms = {c.env: c.forms() for c in canaries}

    def match(self, data: bytes, where: str, report: ScanReport) -> None:
        hits: dict[str, set[str]] = {}
        for payload in _inflated(data):
            for env, forms in self.forms.items():
                for name, form in forms.items():
                    if form in payload:
                        hits.setdefault(env, set()).add(name)
        for env, names in hits.items():
            report.findings.append(Finding(canary=env, where=where, forms=tuple(sorted(names))))


def _is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _cell_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return str(value).encode()


def _scan_sqlite(path: Path, matcher: _Matcher, report: ScanReport) -> None:
    # Read-only and immutable: the scan must not change (or wait on) a database a run may hold.
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    con.text_factory = bytes
    try:
        tables = [
            r[0].decode()
            for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            quoted = '"' + table.replace('"', '""') + '"'
            for number, row in enumerate(con.execute(f"SELECT * FROM {quoted}")):
                report.sqlite_rows += 1
                matcher.match(
                    b"\0".join(_cell_bytes(v) for v in row),
                    f"sqlite {path} table {table} row {number}",
                    report,
                )
    finally:
        con.close()


def _scan_git(repo: Path, matcher: _Matcher, report: ScanReport) -> None:
    proc = subprocess.Popen(
        [
            "git",
            "--git-dir",
            str(repo),
            "cat-file",
            "--batch-all-objects",
            "--batch",
            "--unordered",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    out = proc.stdout
    while header := out.readline():
        sha, kind, size = header.split()
        body = out.read(int(size))
        out.read(1)  # the newline after each object
        report.git_objects += 1
        matcher.match(body, f"git {repo} object {sha.decode()} ({kind.decode()})", report)
    err = proc.stderr.read() if proc.stderr else b""
    if proc.wait() != 0:
        raise RuntimeError(
            f"git cat-file --batch-all-objects in {repo} failed: {err.decode(errors='replace')}"
        )


def scan(
    canaries: Iterable[Canary],
    roots: Iterable[Path],
    exclude: Callable[[Path], bool] = lambda _p: False,
) -> ScanReport:
    """Search every file, SQLite row and git object under `roots` (directories or files) for every
    canary (module docstring).

    `exclude(path)` True leaves a file out (it is listed in `report.excluded`): for what lockstep
    did not write, such as a simulated cluster's own record of a job's output.
    """
    matcher = _Matcher(canaries)
    report = ScanReport(started_ms=int(time.time() * 1000))
    seen: set[Path] = set()
    for root in roots:
        root = Path(root).resolve()
        if root in seen or any(parent in seen for parent in root.parents):
            continue
        seen.add(root)
        if root.is_file():
            _scan_file(root, matcher, report, exclude)
        for top, dirs, files in os.walk(root):
            here = Path(top)
            report.walked.add(here)
            if _is_git_dir(here):
                _scan_git(here, matcher, report)
                # its objects were read whole, inflated
                dirs[:] = [d for d in dirs if d != "objects"]
            for name in files:
                _scan_file(here / name, matcher, report, exclude)
    return report


def _scan_file(
    path: Path, matcher: _Matcher, report: ScanReport, exclude: Callable[[Path], bool]
) -> None:
    if path.is_symlink() or not path.is_file():
        return
    if exclude(path):
        report.excluded.append(path)
    elif _is_sqlite(path):
        _scan_sqlite(path, matcher, report)
    else:
        report.files += 1
        matcher.match(path.read_bytes(), f"file {path}", report)


def attest_key_canary() -> str:
    """A fresh ECDSA P-256 private key (PKCS#8 PEM): an attestation key's canary must be a real key,
    since it signs."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
