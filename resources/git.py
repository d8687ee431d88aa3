"""GitRemotes: the git remotes lockstep reads and pushes
to, through GitPython with a timeout on every call.

One bare mirror per remote URL under a shared cache directory is reused across runs, so a fetch
only moves new objects. Pushes are fast-forward only: lockstep never force-pushes.

URLs, branches and tags reach this module from other people's files (a lab's lock, a vLLM tree's
cmake files, the site), so git gets them as data: each is checked (resources/names.py) before any
process starts, a `--` ends the options before every positional URL or path, and every git process
runs with GIT_ALLOW_PROTOCOL set to the site's schemes and `protocol.ext.allow=never`, which also
holds for submodules and redirects that lockstep never sees.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import functools
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from resources.deadline import limit
from resources.errors import LockstepError
from resources.model import Model
from resources.names import (
    DEFAULT_SCHEMES,
    KNOWN_SCHEMES,
    NameRefused,
    PathEscape,
    check_ref,
    check_url,
    under,
)
from resources.secrets import redact

if TYPE_CHECKING:
    import git

    from resources.site.schema import SiteConfig

SHA_RE = re.compile(r"^[0-9a-f]{40}\Z")

# Never wait for a password prompt or an unknown host
# key: fail and say so. (_env() adds the deadlines.)
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}


class GitError(LockstepError):
    """A git command failed; the message carries the redacted command and git's own words."""


class GitInputRefused(GitError):
    """A URL, ref or path handed to GitRemotes broke its rule; no git process was started."""


class RemoteUnreachable(GitError):
    """ls-remote or fetch could not reach the remote (or it is not a repository)."""


class NonFastForward(GitError):
    """A push would not be a fast-forward of the remote branch; nothing was pushed."""


class CommitInfo(Model):
    sha: str
    tree: str
    author: str
    committed_at: datetime
    summary: str
    parents: list[str] = Field(default_factory=list)


class NamedRefs(Model):
    """A name as a remote knows it: the tip of the
    branch of that name and the commit of the tag of that
    name, each None when the remote has none."""

    name: str
    branch: str | None = None
    tag: str | None = None


class Worktree(Model):
    """A temporary checkout of one branch; `base_sha` is the remote tip it was cloned at."""

    path: Path
    url: str
    branch: str
    base_sha: str


def _default_cache_dir() -> Path:
    if env := os.environ.get("LOCKSTEP_CACHE"):
        return Path(env) / "git"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lockstep" / "git"


def mirror_name(url: str) -> str:
    """A readable, collision-free directory name for a remote's mirror."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", redact(url).rstrip("/").rsplit("/", 2)[-1])[-40:]
    return f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"


class GitRemotes(dg.ConfigurableResource):
    """ls-remote, a shared mirror cache, fetch by sha, ancestry, commit info, fast-forward push."""

    cache_dir: str = Field(
        default="", description="Mirror cache; empty: $LOCKSTEP_CACHE/git or ~/.cache/lockstep/git."
    )
    timeout_s: float = Field(
        default=300.0, gt=0, description="Every git call is killed after this."
    )
    # The network deadlines ([timeouts] in the site, see resources/site/timeouts.py): git's own
    # timeouts do not bound a remote that accepts the connection and never answers, so the
    # process is killed.
    connect_timeout_s: float = Field(
        default=15.0, gt=0, description="ssh ConnectTimeout (connect + handshake) and keepalive."
    )
    refs_timeout_s: float = Field(
        default=30.0, gt=0, description="One ls-remote, the whole process group."
    )
    transfer_timeout_s: float = Field(
        default=600.0, gt=0, description="One fetch or push, the whole process group."
    )
    low_speed_bps: int = Field(
        default=1000, gt=0, description="http(s): slower than this for low_speed_s aborts."
    )
    low_speed_s: int = Field(
        default=30, gt=0, description="http(s): how long a transfer may stay below low_speed_bps."
    )
    url_schemes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SCHEMES),
        description=(
            "Transports git may use ([site] url_schemes): every URL is checked, and "
            "GIT_ALLOW_PROTOCOL set."
        ),
    )

    # -- what goes in ---------------------------------------------------------------------------

    def _url(self, url: str) -> str:
        schemes = [s for s in self.url_schemes if s in KNOWN_SCHEMES]
        try:
            return check_url("repository URL", url, schemes)
        except NameRefused as exc:
            raise GitInputRefused(redact(f"{exc}: no git command was run")) from None

    # -- plumbing -------------------------------------------------------------------------------

    def _cache(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else _default_cache_dir()

    def trees_dir(self) -> Path:
        """Where persistent checkouts (e.g. a rev's
        dependency trees) live: beside the mirror cache."""
        return self._cache().parent / "trees"

    def _git(self, args: Sequence[str], cwd: Path | None = None, *, url: str | None = None) -> str:
        import git

        cmd = git.cmd.Git(str(cwd) if cwd else None)
        try:
            return cmd.execute(
                ["git", "-c", "protocol.ext.allow=never", *args],
                kill_after_timeout=self.timeout_s,
                env=self._env(),
                strip_newline_in_stdout=True,
            )
        except git.GitCommandError as exc:
            raise _failed(args, exc.status, str(exc.stderr or ""), url) from None

    def _env(self) -> dict[str, str]:
        """git's environment: no prompts or user config, only the transports the site allows, and
        transport-level liveness: ssh gives up on a silent server after connect_timeout_s (OpenSSH's
        ConnectTimeout covers the banner exchange too) and on a dead connection after two missed
        keepalives; curl aborts an https transfer that stays below low_speed_bps for low_speed_s.
        git:// has no such knob: only the process deadline in _network ends a silent one."""
        allowed = ":".join(s for s in self.url_schemes if s in KNOWN_SCHEMES)
        connect = max(1, math.ceil(self.connect_timeout_s))  # ssh takes whole seconds
        # Appended: OpenSSH keeps the first value of an
        # option, so one a deployment's own command sets wins.
        ssh = (
            f"{_GIT_ENV['GIT_SSH_COMMAND']} -o ConnectTimeout={connect} "
            f"-o ServerAliveInterval={connect} -o ServerAliveCountMax=2"
        )
        return {
            **os.environ,
            **_GIT_ENV,
            "GIT_ALLOW_PROTOCOL": allowed,
            "GIT_SSH_COMMAND": ssh,
            "GIT_HTTP_LOW_SPEED_LIMIT": str(self.low_speed_bps),
            "GIT_HTTP_LOW_SPEED_TIME": str(self.low_speed_s),
        }

    def _ls_remote(self, args: Sequence[str], url: str) -> str:
        """``git ls-remote <args>``: what every sensor tick runs."""
        return self._network(
            ["ls-remote", *args],
            url,
            deadline_s=self.refs_timeout_s,
            deadline_key="[timeouts] git_refs_s",
        )

    def _network(
        self,
        args: Sequence[str],
        url: str,
        *,
        deadline_s: float,
        deadline_key: str,
        cwd: Path | None = None,
    ) -> str:
        """One git command that talks to `url` (ls-remote, fetch, push), killed with everything it
        started when it outlives its deadline: the smallest of `deadline_s`, timeout_s and what is
        left of the current budget (a sensor tick's, resources/deadline.py).

        A plain subprocess, not GitPython (whose timeout is a watchdog thread started per call and
        kills git alone), with the same environment and errors as _git. Its own process group, so
        the kill takes the transport git started (ssh) along with git. Not its own session: with the
        kernel's autogroup scheduling on, each new session is a
        new group to schedule, and that cost a tick ~6 ms
        here, as much as the ls-remote itself."""
        own, key = (
            (deadline_s, deadline_key)
            if deadline_s <= self.timeout_s
            else (self.timeout_s, "timeout_s")
        )
        seconds, key = limit(own, key)
        proc = subprocess.Popen(
            [_git_binary(), "-c", "protocol.ext.allow=never", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            env=self._env(),
        )
        try:
            out, err = proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RemoteUnreachable(
                f"cannot reach {redact(url)}: timeout: git {args[0]} did not complete in "
                f"{seconds:g} secs "
                f"({key}); git and its transport were killed. Check the remote is up and answers "
                "from this "
                f"machine (git ls-remote -- {redact(url)}), or raise {key}"
            ) from None
        if proc.returncode:
            error = _failed(args, proc.returncode, err.decode(errors="replace"), url)
            if isinstance(error, RemoteUnreachable) and "timed out" in str(error).lower():
                # ssh's ConnectTimeout (or keepalive) ended it: say which setting that was.
                raise RemoteUnreachable(
                    f"{error} (ssh gave up after [timeouts] git_connect_s = "
                    f"{self.connect_timeout_s:g} s: check the "
                    "remote is up and answers from this machine, or raise [timeouts] git_connect_s)"
                )
            raise error
        return out.decode(errors="surrogateescape")

    @contextlib.contextmanager
    def _locked_mirror(self, url: str) -> Iterator[git.Repo]:
        """The mirror for `url`, created on first use, held under an exclusive file lock."""
        import git

        cache = self._cache()
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / mirror_name(url)
        with open(str(path) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / "HEAD").exists():
                git.Repo.init(path, bare=True)
            yield git.Repo(path)

    # -- operations -----------------------------------------------------------------------------

    def ls_remote(self, *, url: str, branch: str) -> str | None:
        """The sha at the tip of `branch` on `url`, or None when the branch does not exist."""
        url, branch = self._url(url), _ref("branch", branch)
        out = self._ls_remote(["--heads", "--", url, f"refs/heads/{branch}"], url)
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            if ref == f"refs/heads/{branch}":
                return sha
        return None

    def named_refs(self, *, url: str, name: str) -> NamedRefs:
        """What `name` is on `url`, in one ls-remote: the
        tip of branch `name` and the commit of tag `name`
        (annotated tags peeled), each None when absent. A
        PEP 508 `@ref` can be either, so a re-lock asks."""
        url, name = self._url(url), _ref("branch", name)
        wanted = (f"refs/heads/{name}", f"refs/tags/{name}", f"refs/tags/{name}^{{}}")
        out = self._ls_remote(["--", url, *wanted], url)
        found = {
            ref: sha
            for sha, _, ref in (line.partition("\t") for line in out.splitlines())
            if ref in wanted
        }
        return NamedRefs(
            name=name, branch=found.get(wanted[0]), tag=found.get(wanted[2]) or found.get(wanted[1])
        )

    def ls_remote_heads(self, *, url: str, pattern: str = "*") -> dict[str, str]:
        """Branch name -> tip sha for every branch of
        `url` whose name matches the glob `pattern`."""
        url = self._url(url)
        out = self._ls_remote(["--heads", "--", url], url)
        heads = {}
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            name = ref.removeprefix("refs/heads/")
            if fnmatch.fnmatchcase(name, pattern):
                heads[name] = sha
        return heads

    def ls_remote_tag(self, *, url: str, tag: str) -> str | None:
        """The commit a tag names on `url` (annotated tags peeled), or None."""
        url, tag = self._url(url), _ref("tag", tag)
        out = self._ls_remote(
            ["--tags", "--", url, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}"], url
        )
        found: dict[str, str] = {}
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            found[ref] = sha
        return found.get(f"refs/tags/{tag}^{{}}") or found.get(f"refs/tags/{tag}")

    def fetch(
        self,
        *,
        url: str,
        shas: Sequence[str] = (),
        branches: Sequence[str] = (),
        depth: int | None = None,
    ) -> Path:
        """Bring commits into the shared mirror and return its path.

        `shas` are fetched exactly (shallow when `depth` is given) and kept under
        ``refs/lockstep/keep/<sha>``; `branches` land under ``refs/lockstep/heads/<branch>``.
        """
        url = self._url(url)
        for sha in shas:
            _sha(sha)
        for branch in branches:
            _ref("branch", branch)
        with self._locked_mirror(url) as repo:
            mirror = Path(repo.git_dir)
            missing = [
                s for s in shas if not _has_commit(repo, s) or (depth is None and _is_shallow(repo))
            ]
            refspecs = [f"{s}:refs/lockstep/keep/{s}" for s in missing]
            refspecs += [f"+refs/heads/{b}:refs/lockstep/heads/{b}" for b in branches]
            if not refspecs:
                return mirror
            # --no-write-fetch-head: FETCH_HEAD would record the URL, credentials and all.
            args = ["fetch", "--no-tags", "--quiet", "--no-write-fetch-head"]
            if depth is not None:
                args.append(f"--depth={depth}")
            elif _is_shallow(repo):
                args.append("--unshallow")
            self._network(
                [*args, "--", url, *refspecs],
                url,
                cwd=mirror,
                deadline_s=self.transfer_timeout_s,
                deadline_key="[timeouts] git_transfer_s",
            )
            return mirror

    def is_ancestor(self, *, url: str, ancestor: str, descendant: str) -> bool:
        """True when `ancestor` is reachable from
        `descendant` (full history is fetched if needed)."""
        mirror = self.fetch(url=url, shas=[ancestor, descendant])
        try:
            self._git(["merge-base", "--is-ancestor", ancestor, descendant], mirror)
        except GitError as exc:
            if "exit 1)" in str(exc):
                return False
            raise
        return True

    def tree_of(self, *, url: str, sha: str) -> str:
        """``git rev-parse <sha>^{tree}``: the tree a commit records (what a source lock pins)."""
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        return self._git(["rev-parse", f"{sha}^{{tree}}"], mirror)

    def ahead_behind(self, *, url: str, base: str, tip: str) -> tuple[int, int]:
        """(commits on `tip` not on `base`, commits on `base`
        not on `tip`), full history fetched as needed."""
        mirror = self.fetch(url=url, shas=[base, tip])
        left, right = self._git(
            ["rev-list", "--left-right", "--count", f"{base}...{tip}"], mirror
        ).split()
        return int(right), int(left)

    def commits_after(
        self, *, url: str, base: str, tip: str, until: datetime | None = None, limit: int = 500
    ) -> list[CommitInfo]:
        """The commits on `tip` that `base` does not have
        (`base..tip`), committed no later than `until`,
        newest first, at most `limit`."""
        mirror = self.fetch(url=url, shas=[_sha(base), _sha(tip)])
        fmt = "%H%x00%T%x00%an <%ae>%x00%ct%x00%s%x00%P"
        args = ["log", f"--max-count={int(limit)}", f"--format={fmt}"]
        if until is not None:
            args.append(f"--until={until.astimezone(UTC).isoformat()}")
        out = self._git([*args, f"{base}..{tip}", "--"], mirror)
        commits = []
        for line in out.splitlines():
            h, tree, author, ct, summary, parents = line.split("\x00")
            commits.append(
                CommitInfo(
                    sha=h,
                    tree=tree,
                    author=author,
                    summary=summary,
                    parents=parents.split(),
                    committed_at=datetime.fromtimestamp(int(ct), tz=UTC),
                )
            )
        return commits

    def list_files(self, *, url: str, sha: str, pattern: str) -> dict[str, str]:
        """Path -> blob sha for every file at `sha`
        matching the glob (``**`` crosses directories)."""
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        out = self._git(["ls-tree", "-r", "--full-tree", sha], mirror)
        files = {}
        for line in out.splitlines():
            meta, _, path = line.partition("\t")
            _mode, kind, blob = meta.split()
            if kind == "blob" and glob_match(pattern, path):
                files[path] = blob
        return files

    def gitlinks(self, *, url: str, sha: str) -> dict[str, str]:
        """Path -> commit of every gitlink (submodule entry, mode 160000) in the tree of `sha`."""
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        out = self._git(["ls-tree", "-r", "--full-tree", sha], mirror)
        links = {}
        for line in out.splitlines():
            meta, _, path = line.partition("\t")
            _mode, kind, target = meta.split()
            if kind == "commit":
                links[path] = target
        return links

    def mirror_bytes(self, *, url: str) -> int:
        """Bytes the mirror of `url` holds on disk (objects
        and packs): to tell fetched from re-used."""
        path = self._cache() / mirror_name(url) / "objects"
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0

    def materialize(self, *, url: str, sha: str, dest: Path) -> Path:
        """A persistent detached checkout of `sha` at `dest` (replacing what was there), sharing the
        mirror's objects. Its `.git` is a file pointing into the mirror, as for any worktree."""
        dest = self._in_trees(dest)  # before anything is fetched, let alone removed
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        if dest.exists():
            shutil.rmtree(dest)
        self._git(["worktree", "prune"], mirror)  # forget a checkout that was there before
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._git(
            ["worktree", "add", "--quiet", "--detach", "--force", "--", str(dest), sha], mirror
        )
        return dest

    def _in_trees(self, dest: Path) -> Path:
        """`dest` resolved, refused unless strictly inside
        trees_dir(): materialize removes what is there."""
        root = self.trees_dir()
        try:
            relative = Path(os.path.abspath(dest)).relative_to(os.path.abspath(root))
        except ValueError:
            raise GitInputRefused(
                f"checkout {str(dest)!r} is not under {root}: refused, nothing removed"
            ) from None
        try:
            return under(root, *relative.parts)
        except PathEscape as exc:
            raise GitInputRefused(f"checkout {str(dest)!r}: {exc}") from None

    def resolve_commit(self, *, url: str, rev: str, branch: str) -> str:
        """The full sha of `rev` (a short sha, say) among the commits of `branch` on `url`."""
        _ref("revision", rev)
        mirror = self.fetch(url=url, branches=[branch])
        try:
            return self._git(
                ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
                mirror,
            )
        except GitError:
            raise GitError(f"{rev!r} is not a commit of {branch} on {redact(url)}") from None

    def commit_info(self, *, url: str, sha: str) -> CommitInfo:
        """Tree, author, time and summary of one commit."""
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        fmt = "%H%x00%T%x00%an <%ae>%x00%ct%x00%s%x00%P"
        out = self._git(["show", "-s", f"--format={fmt}", sha], mirror)
        h, tree, author, ct, summary, parents = out.split("\x00")
        return CommitInfo(
            sha=h,
            tree=tree,
            author=author,
            committed_at=datetime.fromtimestamp(int(ct), tz=UTC),
            summary=summary,
            parents=parents.split(),
        )

    def short_sha(self, *, url: str, sha: str, branch: str) -> str:
        """``git rev-parse --short <sha>`` with `branch`'s full history in the mirror: git's own
        length rule (7 or more hex, longer as the repository
        grows or where 7 would be ambiguous), as a
        person's clone prints it (the runbook's GITSHA)."""
        mirror = self.fetch(url=url, shas=[_sha(sha)], branches=[branch])
        return self._git(["rev-parse", "--short", sha], mirror)

    def show_file(self, *, url: str, sha: str, path: str) -> str | None:
        """The text of `path` at commit `sha`, or None when the commit has no such file."""
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        try:
            return self._git(["show", f"{sha}:{path}"], mirror)
        except GitError as exc:
            if "does not exist" in str(exc) or "exists on disk, but not in" in str(exc):
                return None
            raise

    def read_blobs(self, *, url: str, sha: str, blobs: Sequence[str]) -> dict[str, str]:
        """Blob sha -> text (undecodable bytes kept as
        surrogate escapes) for blobs of commit `sha`, e.g.
        what `list_files` found: one `git cat-file --batch`
        for all of them, not a process per file."""
        for blob in blobs:
            _sha(blob)
        mirror = self.fetch(url=url, shas=[sha], depth=1)
        if not blobs:
            return {}
        try:
            done = subprocess.run(
                [_git_binary(), "cat-file", "--batch"],
                cwd=mirror,
                input="".join(f"{b}\n" for b in blobs).encode(),
                capture_output=True,
                timeout=self.timeout_s,
                env={**os.environ, **_GIT_ENV},
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise GitError(
                f"git cat-file --batch of {len(blobs)} blobs did not complete in "
                f"{self.timeout_s:g} secs"
            ) from None
        if done.returncode:
            raise GitError(
                f"git cat-file --batch failed (exit {done.returncode}): "
                f"{redact(done.stderr.decode(errors='replace').strip())}"
            )
        out, at, texts = done.stdout, 0, {}
        for blob in blobs:
            end = out.index(b"\n", at)
            header = out[at:end].decode().split()
            if header[1:2] != ["blob"]:
                raise GitError(
                    f"{blob} is not a blob of {sha[:12]} on {redact(url)} (git says "
                    f"{' '.join(header[1:])})"
                )
            size = int(header[2])
            texts[blob] = out[end + 1 : end + 1 + size].decode(errors="surrogateescape")
            at = end + 1 + size + 1
        return texts

    @contextlib.contextmanager
    def checkout(
        self, *, url: str, branch: str | None = None, sha: str | None = None
    ) -> Iterator[Worktree]:
        """A temporary worktree of `branch` (at its current
        tip) or of an exact `sha`, removed after use."""
        if (branch is None) == (sha is None):
            raise ValueError("checkout needs exactly one of branch= or sha=")
        url = self._url(url)
        if branch is not None:
            tip = self.ls_remote(url=url, branch=branch)
            if tip is None:
                raise GitError(f"branch {branch!r} does not exist on {redact(url)}")
            mirror = self.fetch(url=url, branches=[branch])
            base = self._git(["rev-parse", f"refs/lockstep/heads/{branch}"], mirror)
        else:
            assert sha is not None
            mirror = self.fetch(url=url, shas=[sha], depth=1)
            base = sha
        with tempfile.TemporaryDirectory(prefix="lockstep-wt-") as tmp:
            path = Path(tmp) / "checkout"
            # A detached worktree of the mirror shares its object store (shallow or not): a checkout
            # costs only its files, and concurrent runs never fight over a branch ref.
            self._git(["worktree", "add", "--quiet", "--detach", "--", str(path), base], mirror)
            try:
                yield Worktree(path=path, url=url, branch=branch or "", base_sha=base)
            finally:
                self._git(["worktree", "remove", "--force", "--", str(path)], mirror)

    def commit_all(
        self, *, worktree: Worktree, message: str, author: str, paths: Sequence[str]
    ) -> str:
        """Commit the given paths in `worktree` as
        `author` ("Name <email>"); returns the new sha."""
        name, _, email = author.partition(" <")
        ident = ["-c", f"user.name={name}", "-c", f"user.email={email.rstrip('>')}"]
        self._git(["add", "--", *paths], worktree.path)
        self._git([*ident, "commit", "--quiet", "--no-verify", "-m", message], worktree.path)
        return self._git(["rev-parse", "HEAD"], worktree.path)

    def push_fast_forward(self, *, worktree: Worktree) -> str:
        """Push the worktree's HEAD to its branch, only
        as a fast-forward of the tip it was cloned at.

        Fetch-check-push: the remote tip is read again first; if it moved since the clone, nothing
        is pushed and NonFastForward says so. The push itself is a plain (non-force) push, so the
        remote refuses anything else too. Returns the pushed sha, confirmed by a second ls-remote.
        """
        url, branch = self._url(worktree.url), _ref("branch", worktree.branch)
        _sha(worktree.base_sha)
        head = self._git(["rev-parse", "HEAD"], worktree.path)
        try:
            self._git(["merge-base", "--is-ancestor", worktree.base_sha, head], worktree.path)
        except GitError:
            raise NonFastForward(
                f"{head[:8]} does not descend from {worktree.base_sha[:8]}, the tip of "
                f"{worktree.branch}: nothing was pushed"
            ) from None
        now = self.ls_remote(url=worktree.url, branch=worktree.branch)
        if now != worktree.base_sha:
            raise NonFastForward(
                f"branch {worktree.branch} on {redact(worktree.url)} moved from "
                f"{worktree.base_sha[:8]} to {(now or 'nothing')[:8]} while lockstep worked on it: "
                "nothing was pushed; run again to redo the work on the new tip"
            )
        try:
            self._network(
                ["push", "--quiet", "--porcelain", "--", url, f"HEAD:refs/heads/{branch}"],
                url,
                cwd=worktree.path,
                deadline_s=self.transfer_timeout_s,
                deadline_key="[timeouts] git_transfer_s",
            )
        except RemoteUnreachable:
            raise
        except GitError as exc:
            raise NonFastForward(
                f"the remote refused the push to {worktree.branch}: {exc}"
            ) from None
        after = self.ls_remote(url=worktree.url, branch=worktree.branch)
        if after != head:
            raise GitError(
                f"pushed {head[:8]} to {worktree.branch} but the remote now says "
                f"{(after or 'nothing')[:8]}"
            )
        return head


def _failed(args: Sequence[str], status: object, stderr: str, url: str | None) -> GitError:
    """The error for a git command that failed:
    RemoteUnreachable when it was the remote (`url`) that
    could not be reached, else GitError naming the command; both redacted."""
    stderr = redact(stderr.strip())
    if url is not None and _looks_unreachable(stderr):
        return RemoteUnreachable(f"cannot reach {redact(url)}: {stderr}")
    return GitError(f"git {redact(' '.join(args))} failed (exit {status}): {stderr}")


@functools.cache
def _git_binary() -> str:
    """git's path, looked up once per process rather than on every exec (one PATH walk per tick)."""
    return shutil.which("git") or "git"


def _ref(kind: str, name: str) -> str:
    try:
        return check_ref(kind, name)
    except NameRefused as exc:
        raise GitInputRefused(f"{exc}: no git command was run") from None


def _sha(sha: str) -> str:
    if not isinstance(sha, str) or not SHA_RE.match(sha):
        raise GitInputRefused(f"{sha!r} is not a full 40-hex commit sha: no git command was run")
    return sha


def git_for(site: SiteConfig | None, **fields: object) -> GitRemotes:
    """The git resource of a code location: the site's URL
    schemes and [timeouts] (the defaults without a site)."""
    if site is None:
        return GitRemotes(url_schemes=list(DEFAULT_SCHEMES), **fields)  # type: ignore[arg-type]
    t = site.timeouts
    site_fields: dict[str, object] = {
        "url_schemes": list(site.site.url_schemes),
        "connect_timeout_s": t.git_connect_s,
        "refs_timeout_s": t.git_refs_s,
        "transfer_timeout_s": t.git_transfer_s,
        "low_speed_bps": t.git_low_speed_bps,
        "low_speed_s": t.git_low_speed_s,
    }
    return GitRemotes(**{**site_fields, **fields})  # type: ignore[arg-type]


def glob_match(pattern: str, path: str) -> bool:
    """fnmatch where ``*`` stays within one directory and ``**/`` spans any number of them."""
    regex = (
        re.escape(pattern)
        .replace(r"\*\*/", "(?:.*/)?")
        .replace(r"\*\*", ".*")
        .replace(r"\*", "[^/]*")
        .replace(r"\?", "[^/]")
    )
    return re.fullmatch(regex, path) is not None


def _has_commit(repo: git.Repo, sha: str) -> bool:
    import git

    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
        return True
    except git.GitCommandError:
        return False


def _is_shallow(repo: git.Repo) -> bool:
    return (Path(repo.git_dir) / "shallow").exists()


_UNREACHABLE = (
    "does not appear to be a git repository",
    "could not read from remote repository",
    "could not resolve host",
    "connection refused",
    "connection timed out",
    "repository not found",
    "unable to access",
    "timeout:",
    "no such file or directory",
)


def _looks_unreachable(stderr: str) -> bool:
    low = stderr.lower()
    return any(marker in low for marker in _UNREACHABLE)
