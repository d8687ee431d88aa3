"""Re-lock harbor in the consumer repo: ``uv lock --upgrade-package harbor`` and the Dockerfile pin, together.

Everything is checked on a temporary checkout before anything is pushed; a failure at any step
leaves the remote branch exactly where it was.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from resources.errors import FileFormatError, LockstepError, decode_utf8
from resources.git import GitRemotes, Worktree
from resources.names import PathEscape, under
from resources.secrets import redact
from resources.site import TpuSection
from resources.uv import GitSource, UvCli, UvLock
from tpu_assets.dockerfile import find_pin, pin_variable, set_pin
from tpu_assets.models import HarborLock, HarborPin


class RelockRefused(LockstepError):
    """The consumer repo is not in a shape a re-lock can safely follow; nothing was pushed."""


def _same_repo(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        return re.sub(r"(\.git)?/*$", "", u.strip()).lower()

    return norm(a) == norm(b)


def check_follows_branch(source: GitSource, lock: UvLock, tpu: TpuSection) -> None:
    """The lock must follow the site's harbor branch on the site's harbor repo, or a re-lock is meaningless."""
    name = tpu.harbor_package
    line = lock.line_of(name)
    if source.branch is None:
        how = f"{source.pinned_by}={source.rev or source.tag}" if source.rev or source.tag else "the default branch"
        raise FileFormatError(
            lock.path, line,
            f"{name} is pinned by {how} in [tool.uv.sources], not by a branch: a re-lock follows a "
            f"branch, and there is none to follow. "
            f'Pin it with branch = "{tpu.harbor_branch}" in pyproject.toml',
        )
    if source.branch != tpu.harbor_branch:
        raise FileFormatError(
            lock.path, line,
            f"{name} follows branch {source.branch!r}, but the site watches [tpu].harbor_branch = "
            f"{tpu.harbor_branch!r}: make them the same",
        )
    if not _same_repo(source.url, tpu.harbor_repo):
        raise FileFormatError(
            lock.path, line,
            f"{name} comes from {redact(source.url)}, but the site watches [tpu].harbor_repo = "
            f"{redact(tpu.harbor_repo)}: make them the same",
        )


def lock_diff(before: str, after: str, *, max_lines: int = 80) -> str:
    """A unified diff of two uv.lock texts, cut to `max_lines` (locks can be huge)."""
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), "uv.lock (before)", "uv.lock (after)", lineterm="", n=2))
    if len(diff) > max_lines:
        diff = [*diff[:max_lines], f"... ({len(diff) - max_lines} more diff lines)"]
    return "\n".join(diff)


def commit_message(package: str, pin: HarborPin) -> str:
    return f"chore(deps): re-lock {package} -> {pin.version or 'unversioned'} ({pin.commit[:8]})"


def in_checkout(wt: Path, relative: str) -> Path:
    """`wt/relative`, refused when it resolves outside the checkout (a symlink the consumer repo commits)."""
    try:
        return under(wt, *Path(relative).parts)
    except PathEscape as exc:
        raise FileFormatError(relative, None, f"{exc}: a re-lock reads and writes only inside the checkout") from None


def _text(path: Path, shown: str) -> str:
    return decode_utf8(path.read_bytes(), shown)


def read_state(wt: Path, tpu: TpuSection) -> tuple[UvLock, GitSource, HarborPin, str, int]:
    """Lock, its harbor source, the locked pin, the Dockerfile text and its pin line, from a checkout."""
    lock_path = in_checkout(wt, "uv.lock")
    if not lock_path.exists():
        raise FileFormatError("uv.lock", None, "the consumer repo has no uv.lock: run `uv lock` there once and commit it")
    lock = UvLock.read(Path("uv.lock"), lock_path.read_bytes())
    pkg, src = lock.git_package(tpu.harbor_package)
    docker_path = in_checkout(wt, tpu.dockerfile)
    if not docker_path.is_file():
        raise FileFormatError(tpu.dockerfile, None, "no such file in the consumer repo (site [tpu].dockerfile)")
    docker_text = _text(docker_path, tpu.dockerfile)
    pin = find_pin(docker_text, tpu.dockerfile, pin_variable(tpu.harbor_package))
    return lock, src, HarborPin(commit=src.commit, version=pkg.version), docker_text, pin.line


def relock_harbor(*, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str) -> HarborLock:
    """Bring the consumer's uv.lock and Dockerfile pin to the harbor branch tip; push one commit or none."""
    harbor_tip = git.ls_remote(url=tpu.harbor_repo, branch=tpu.harbor_branch)
    if harbor_tip is None:
        raise RelockRefused(
            f"branch {tpu.harbor_branch!r} does not exist on {redact(tpu.harbor_repo)} (site [tpu].harbor_branch)"
        )
    with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
        try:
            return _relock_in(wt, tpu=tpu, git=git, uv=uv, author=author, harbor_tip=harbor_tip)
        except FileFormatError as exc:
            raise RelockRefused(
                f"consumer repo {redact(tpu.consumer_repo)} ({tpu.consumer_branch} @ {wt.base_sha[:8]}): "
                f"{exc}. Nothing was pushed."
            ) from None


def _relock_in(wt: Worktree, *, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str, harbor_tip: str) -> HarborLock:
    variable = pin_variable(tpu.harbor_package)
    lock, src, before, docker_text, docker_line = read_state(wt.path, tpu)
    check_follows_branch(src, lock, tpu)
    docker_pin = find_pin(docker_text, tpu.dockerfile, variable).commit

    if before.commit == harbor_tip and docker_pin == harbor_tip:
        return _result(tpu, wt, wt.base_sha, False, harbor_tip, before, before, docker_line, "")

    uv.lock_upgrade(project_dir=wt.path, package=tpu.harbor_package)
    new_lock, new_src, after, _, _ = read_state(wt.path, tpu)
    check_follows_branch(new_src, new_lock, tpu)
    if after.commit == before.commit and docker_pin == after.commit:
        # uv found nothing newer than the lock (the branch tip is not ahead of the locked commit).
        return _result(tpu, wt, wt.base_sha, False, harbor_tip, before, after, docker_line, "")
    in_checkout(wt.path, tpu.dockerfile).write_text(set_pin(docker_text, tpu.dockerfile, variable, after.commit), encoding="utf-8")

    # Re-read what will be committed: the two pins must agree before anything leaves this machine.
    _, _, committed, new_docker, _ = read_state(wt.path, tpu)
    if find_pin(new_docker, tpu.dockerfile, variable).commit != committed.commit:
        raise RelockRefused(f"{tpu.dockerfile} and uv.lock disagree after the re-lock: nothing was pushed")
    check = uv.lock_check(project_dir=wt.path)
    if not check.ok:
        raise RelockRefused(f"`uv lock --check` fails on the re-locked tree, nothing was pushed:\n{check.output}")

    git.commit_all(worktree=wt, message=commit_message(tpu.harbor_package, after), author=author,
                   paths=["uv.lock", tpu.dockerfile])
    pushed = git.push_fast_forward(worktree=wt)
    return _result(tpu, wt, pushed, True, harbor_tip, before, after, docker_line, lock_diff(lock.text, new_lock.text))


def _result(
    tpu: TpuSection, wt: Worktree, commit: str, pushed: bool, tip: str,
    before: HarborPin, after: HarborPin, docker_line: int, diff: str,
) -> HarborLock:
    return HarborLock(
        consumer_repo=redact(tpu.consumer_repo), consumer_branch=tpu.consumer_branch,
        consumer_base=wt.base_sha, consumer_commit=commit, pushed=pushed,
        harbor_repo=redact(tpu.harbor_repo), harbor_branch=tpu.harbor_branch, harbor_tip=tip,
        before=before, after=after, dockerfile=tpu.dockerfile, dockerfile_line=docker_line, lock_diff=diff,
    )
