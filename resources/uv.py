"""uv: the CLI lockstep runs (its own pinned copy,
from the `uv` package) and a model of `uv.lock`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import dagster as dg
from pydantic import ConfigDict, Field, ValidationError

from resources.errors import FileFormatError, LockstepError, decode_utf8
from resources.model import Model
from resources.names import KNOWN_SCHEMES, NameRefused, check_url
from resources.reader import read_bytes
from resources.secrets import redact
from resources.tomlfile import key_line, load_toml

_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")


class UvError(LockstepError):
    """uv exited non-zero or did not finish in time."""


class UvResult(Model):
    ok: bool
    exit_code: int
    output: str


class GitSource(Model):
    """A git source as uv.lock records it: ``git = "<url>?branch=<b>#<commit>"``."""

    url: str
    branch: str | None = None
    rev: str | None = None
    tag: str | None = None
    commit: str

    @classmethod
    def parse(cls, value: str) -> GitSource:
        """Read a git source; a ValueError (showing the
        value) when it pins no full commit or names no URL.

        uv always writes the resolved commit after '#': without it, or with a short one, the lock
        does not say which harbor an image gets.
        """
        base, hash_sign, commit = value.partition("#")
        if not hash_sign or not _COMMIT.match(commit):
            got = f"{commit!r}" if hash_sign else "no '#<commit>'"
            raise ValueError(
                f"git source {redact(value)!r} must end in '#<40-hex commit>' (got {got})"
            )
        parts = urlsplit(base)
        query = {k: unquote(v[0]) for k, v in parse_qs(parts.query).items()}
        url = parts._replace(query="").geturl()
        try:
            check_url("git source URL", url, KNOWN_SCHEMES)
        except NameRefused as exc:
            raise ValueError(redact(str(exc))) from None
        return cls(
            url=url,
            branch=query.get("branch"),
            rev=query.get("rev"),
            tag=query.get("tag"),
            commit=commit,
        )

    @property
    def pinned_by(self) -> str:
        """How the source is pinned in pyproject: 'branch', 'rev', 'tag' or 'default branch'."""
        for kind in ("branch", "rev", "tag"):
            if getattr(self, kind):
                return kind
        return "default branch"


class LockedPackage(Model):
    model_config = ConfigDict(extra="allow")

    name: str
    version: str | None = None
    source: dict[str, str] = Field(default_factory=dict)

    @property
    def git(self) -> GitSource | None:
        return GitSource.parse(self.source["git"]) if "git" in self.source else None


class UvLock(Model):
    """The parts of ``uv.lock`` lockstep reads; every other key is kept as-is."""

    model_config = ConfigDict(extra="allow")

    version: int
    package: list[LockedPackage] = Field(default_factory=list)
    path: Path = Field(default=Path("uv.lock"), exclude=True)
    text: str = Field(default="", exclude=True, repr=False)

    @classmethod
    def read(cls, path: Path, text: str | bytes | None = None) -> UvLock:
        """Parse a uv.lock (its bytes or text; read from `path` when not given). Every git source is
        checked here, so a bad one is refused with its line before anything relies on it."""
        raw = read_bytes(path) if text is None else text
        text = decode_utf8(raw, path) if isinstance(raw, bytes) else raw
        data = load_toml(path, text)
        if "version" not in data:
            raise FileFormatError(path, 1, "not a uv.lock (no top-level `version`)")
        try:
            lock = cls.model_validate({**data, "path": path, "text": text})
        except ValidationError as exc:
            raise _explain(exc, path, text) from None
        for i, pkg in enumerate(lock.package):
            if "git" in pkg.source:
                try:
                    GitSource.parse(pkg.source["git"])
                except ValueError as exc:
                    line = key_line(text, ("package", str(i)), "source")
                    raise FileFormatError(path, line, f"[[package]] {pkg.name}: {exc}") from None
        return lock

    def find(self, name: str) -> LockedPackage | None:
        wanted = _normalize(name)
        return next((p for p in self.package if _normalize(p.name) == wanted), None)

    def line_of(self, name: str) -> int | None:
        """The line of ``name = "<name>"`` in the file, for error messages."""
        pattern = re.compile(rf'^name\s*=\s*"{re.escape(name)}"\s*$', re.IGNORECASE)
        return next(
            (n for n, line in enumerate(self.text.splitlines(), 1) if pattern.match(line)), None
        )

    def git_package(self, name: str) -> tuple[LockedPackage, GitSource]:
        """The named package and its git source, or a FileFormatError saying what is missing."""
        pkg = self.find(name)
        if pkg is None:
            raise FileFormatError(
                self.path,
                None,
                f"no [[package]] named {name!r}: is it a dependency of this project?",
            )
        src = pkg.git
        if src is None:
            kind = next(iter(pkg.source), "none")
            raise FileFormatError(
                self.path,
                self.line_of(pkg.name),
                f"{name} comes from a {kind} source, not git: declare it as a git dependency "
                "that follows a branch "
                f'("{name} @ git+<repo>@<branch>" in [project].dependencies, or '
                "[tool.uv.sources] with branch =)",
            )
        return pkg, src


def _explain(exc: ValidationError, path: Path, text: str) -> FileFormatError:
    """A type error in the lock as `uv.lock:LINE: [[package]] #N key: what (got value)`."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    if len(loc) > 2 and loc[0] == "package" and loc[2] == "source":
        loc = loc[:3]  # a value inside the inline table: its line is the `source = {...}` line
    line = next(
        (
            n
            for i in range(len(loc), 0, -1)
            if (n := key_line(text, tuple(loc[: i - 1]), loc[i - 1]))
        ),
        1,
    )
    where = (
        f"[[package]] #{int(loc[1]) + 1} {'.'.join(loc[2:])}"
        if len(loc) > 2 and loc[0] == "package"
        else ".".join(loc)
    )
    msg = err["msg"].removeprefix("Value error, ")
    return FileFormatError(path, line, f"{where}: {msg} (got {redact(repr(err.get('input')))})")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uv_binary() -> str:
    """The uv that ships with lockstep's own environment (never whatever is on PATH)."""
    from uv import find_uv_bin

    return find_uv_bin()


class UvCli(dg.ConfigurableResource):
    """Runs uv in a checkout with a timeout. Lock-only: nothing is installed into the checkout."""

    timeout_s: float = Field(default=900.0, gt=0)
    offline: bool = Field(default=False, description="Pass --offline (the sandbox needs no index).")

    def _run(self, project_dir: Path, args: list[str]) -> UvResult:
        argv = [uv_binary(), *args, "--no-progress", *(["--offline"] if self.offline else [])]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
        }
        env.setdefault("UV_PYTHON_DOWNLOADS", "never")
        try:
            proc = subprocess.run(
                argv,
                cwd=project_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise UvError(
                f"uv {' '.join(args)} did not finish in {self.timeout_s:g}s in {project_dir}"
            ) from None
        return UvResult(
            ok=proc.returncode == 0,
            exit_code=proc.returncode,
            output=redact((proc.stdout + proc.stderr).strip()),
        )

    def lock_upgrade(self, *, project_dir: Path, package: str) -> UvResult:
        """``uv lock --upgrade-package PACKAGE``: re-resolve one package, keep every other pin."""
        result = self._run(project_dir, ["lock", "--upgrade-package", package])
        if not result.ok:
            raise UvError(
                f"uv lock --upgrade-package {package} failed (exit "
                f"{result.exit_code}):\n{result.output}"
            )
        return result

    def lock_check(self, *, project_dir: Path) -> UvResult:
        """``uv lock --check``: does the lock still match
        pyproject.toml? Never raises on a mismatch."""
        return self._run(project_dir, ["lock", "--check"])

    def lock(self, *, project_dir: Path) -> UvResult:
        """``uv lock``: create or refresh the lock."""
        result = self._run(project_dir, ["lock"])
        if not result.ok:
            raise UvError(f"uv lock failed (exit {result.exit_code}):\n{result.output}")
        return result
