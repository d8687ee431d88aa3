"""Re-lock harbor in the consumer repo: ``uv lock
--upgrade-package harbor`` and the Dockerfile pin, together.

Everything is checked on a temporary checkout before anything is pushed; a failure at any step
leaves the remote branch exactly where it was.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resources.atomic import write_atomic
from resources.errors import FileFormatError, LockstepError
from resources.git import GitInputRefused, GitRemotes, NamedRefs, Worktree
from resources.names import PathEscape, under
from resources.reader import read_bytes, read_text
from resources.secrets import redact
from resources.site.tpu import TpuSection
from resources.uv import GitSource, UvCli, UvLock
from tpu_assets.dockerfile import find_pin, pin_variable, set_pin
from tpu_assets.harbor_declaration import (
    PYPROJECT,
    HarborDeclaration,
    read_declaration,
    read_pyproject,
)
from tpu_assets.models import HarborLock, HarborPin


class RelockRefused(LockstepError):
    """The consumer repo is not in a shape a re-lock can safely follow; nothing was pushed."""


def _same_repo(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        return re.sub(r"(\.git)?/*$", "", u.strip()).lower()

    return norm(a) == norm(b)


# An abbreviated or full commit: a ref that names one
# does not move, so a re-lock has nothing to follow.
_COMMITISH = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class ConsumerState:
    """What a re-lock reads from a consumer checkout: the lock, harbor's locked source and pin, how
    pyproject.toml declares harbor, and the Dockerfile with its pin line."""

    lock: UvLock
    source: GitSource
    pin: HarborPin
    declared: HarborDeclaration
    dockerfile_text: str
    dockerfile_line: int


def branch_refusal(
    kind: str | None,
    ref: str | None,
    tpu: TpuSection,
    refs: NamedRefs,
    lookup: Callable[[str], NamedRefs] | None = None,
) -> str | None:
    """Why harbor pinned by `kind=ref` is not following the site's harbor branch, or None when a
    re-lock can follow it. `refs` is what ls-remote says the site's branch name is on the site's
    harbor repo: a PEP 508 `@ref` (uv's `rev`) is followed only when
    it names that branch and no tag of the same name.
    `lookup` (ls-remote of another name) only words a
    refusal: is that other rev a tag or a branch?"""
    want, repo = tpu.harbor_branch, redact(tpu.harbor_repo)
    if kind is None or ref is None:
        return "follows the repository's default branch, not a named one"
    if kind == "tag":
        return f"is pinned to tag {ref!r}, which never moves"
    if kind == "rev" and ref != want and _COMMITISH.match(ref):
        return f"is pinned to commit {ref[:12]}, which never moves"
    if ref != want:
        if kind == "rev" and lookup is not None:
            try:
                other = lookup(ref)
            except GitInputRefused:
                return f"names {ref!r}, which is not a git ref name"
            if other.tag and not other.branch:
                return f"is pinned to tag {ref!r}, which never moves"
            kind = "branch" if other.branch else kind
        return f"follows {kind} {ref!r}, but the site watches [tpu].harbor_branch = {want!r}"
    if refs.branch is None:
        also = " (it is a tag there, which never moves)" if refs.tag else ""
        return f"names {ref!r}, which is not a branch of {repo} (git ls-remote){also}"
    if kind == "rev" and refs.tag is not None:
        return (
            f"names {ref!r}, which is both a branch and a tag of {repo}: a rev of that name is "
            "ambiguous "
            "(rename the tag, or declare the branch in [tool.uv.sources] with branch =)"
        )
    return None


def check_declaration(
    declared: HarborDeclaration, tpu: TpuSection, refs: NamedRefs, git: GitRemotes | None = None
) -> None:
    """pyproject.toml must declare harbor from the site's
    harbor repo, following the site's harbor branch.
    With `git`, a refusal of another rev says whether
    the harbor repo has it as a tag or a branch."""
    name = tpu.harbor_package
    if not _same_repo(declared.url, tpu.harbor_repo):
        raise FileFormatError(
            PYPROJECT,
            declared.line,
            f"{name} comes from {redact(declared.url)}, but the site watches [tpu].harbor_repo = "
            f"{redact(tpu.harbor_repo)}: make them the same",
        )
    lookup = (
        (lambda name: git.named_refs(url=tpu.harbor_repo, name=name)) if git is not None else None
    )
    if why := branch_refusal(declared.ref_kind, declared.ref, tpu, refs, lookup):
        raise FileFormatError(
            PYPROJECT,
            declared.line,
            f"{name} {why} ({declared.written}): a re-lock follows a branch. "
            f"Fix: write {declared.following(tpu.harbor_branch)}, then run `uv lock` and commit "
            "both files",
        )


def check_follows_branch(
    state: ConsumerState, tpu: TpuSection, refs: NamedRefs, git: GitRemotes | None = None
) -> None:
    """The declaration, and the lock uv wrote from it,
    follow the site's harbor branch on the site's harbor
    repo; otherwise a re-lock is meaningless. Errors name
    pyproject.toml's or uv.lock's line and the fix."""
    check_declaration(state.declared, tpu, refs, git)
    source, lock, name = state.source, state.lock, tpu.harbor_package
    line = lock.line_of(name)
    if not _same_repo(source.url, tpu.harbor_repo):
        raise FileFormatError(
            lock.path,
            line,
            f"{name} is locked from {redact(source.url)}, but the site watches [tpu].harbor_repo = "
            f"{redact(tpu.harbor_repo)}: run `uv lock` after fixing {state.declared.where}",
        )
    ref = source.branch or source.rev or source.tag
    if why := branch_refusal(source.pinned_by if ref else None, ref, tpu, refs):
        raise FileFormatError(
            lock.path,
            line,
            f"{name} is locked by {source.pinned_by}{f'={ref}' if ref else ''} and {why}: "
            "uv.lock does not match "
            f"{state.declared.where}; run `uv lock` there and commit it",
        )


def lock_diff(before: str, after: str, *, max_lines: int = 80) -> str:
    """A unified diff of two uv.lock texts, cut to `max_lines` (locks can be huge)."""
    diff = list(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            "uv.lock (before)",
            "uv.lock (after)",
            lineterm="",
            n=2,
        )
    )
    if len(diff) > max_lines:
        diff = [*diff[:max_lines], f"... ({len(diff) - max_lines} more diff lines)"]
    return "\n".join(diff)


def commit_message(package: str, pin: HarborPin) -> str:
    return f"chore(deps): re-lock {package} -> {pin.version or 'unversioned'} ({pin.commit[:8]})"


def in_checkout(wt: Path, relative: str) -> Path:
    """`wt/relative`, refused when it resolves outside
    the checkout (a symlink the consumer repo commits)."""
    try:
        return under(wt, *Path(relative).parts)
    except PathEscape as exc:
        raise FileFormatError(
            relative, None, f"{exc}: a re-lock reads and writes only inside the checkout"
        ) from None


def _text(path: Path, shown: str) -> str:
    return read_text(path, shown)


def read_state(wt: Path, tpu: TpuSection) -> ConsumerState:
    """The lock, harbor's source, the locked pin, pyproject's
    declaration and the Dockerfile pin, from a checkout."""
    lock_path = in_checkout(wt, "uv.lock")
    if not lock_path.exists():
        raise FileFormatError(
            "uv.lock",
            None,
            "the consumer repo has no uv.lock: run `uv lock` there once and commit it",
        )
    lock = UvLock.read(Path("uv.lock"), read_bytes(lock_path, "uv.lock"))
    pkg, src = lock.git_package(tpu.harbor_package)
    declared = read_declaration(read_pyproject(in_checkout(wt, PYPROJECT)), tpu.harbor_package)
    docker_path = in_checkout(wt, tpu.dockerfile)
    if not docker_path.is_file():
        raise FileFormatError(
            tpu.dockerfile, None, "no such file in the consumer repo (site [tpu].dockerfile)"
        )
    docker_text = _text(docker_path, tpu.dockerfile)
    pin = find_pin(docker_text, tpu.dockerfile, pin_variable(tpu.harbor_package))
    return ConsumerState(
        lock=lock,
        source=src,
        pin=HarborPin(commit=src.commit, version=pkg.version),
        declared=declared,
        dockerfile_text=docker_text,
        dockerfile_line=pin.line,
    )


def harbor_branch_refs(git: GitRemotes, tpu: TpuSection) -> NamedRefs:
    """The site's harbor branch as the harbor repo has it
    (one ls-remote); refused when it does not exist."""
    refs = git.named_refs(url=tpu.harbor_repo, name=tpu.harbor_branch)
    if refs.branch is None:
        raise RelockRefused(
            f"branch {tpu.harbor_branch!r} does not exist on {redact(tpu.harbor_repo)} (site "
            "[tpu].harbor_branch)"
        )
    return refs


def relock_harbor(*, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str) -> HarborLock:
    """Bring the consumer's uv.lock and Dockerfile pin
    to the harbor branch tip; push one commit or none."""
    refs = harbor_branch_refs(git, tpu)
    with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
        try:
            return _relock_in(wt, tpu=tpu, git=git, uv=uv, author=author, refs=refs)
        except FileFormatError as exc:
            raise RelockRefused(
                f"consumer repo {redact(tpu.consumer_repo)} ({tpu.consumer_branch} @ "
                f"{wt.base_sha[:8]}): "
                f"{exc}. Nothing was pushed."
            ) from None


def _relock_in(
    wt: Worktree, *, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str, refs: NamedRefs
) -> HarborLock:
    variable, harbor_tip = pin_variable(tpu.harbor_package), refs.branch
    assert harbor_tip is not None
    state = read_state(wt.path, tpu)
    # Judged before uv runs: uv fetches from the URL
    # pyproject names, so it must be the site's harbor repo.
    check_declaration(state.declared, tpu, refs, git)
    before, docker_pin = state.pin, find_pin(state.dockerfile_text, tpu.dockerfile, variable).commit

    if before.commit == harbor_tip and docker_pin == harbor_tip:
        # nothing to re-lock: the lock as it is must follow the branch
        check_follows_branch(state, tpu, refs, git)
        return _result(
            tpu, wt, wt.base_sha, False, harbor_tip, before, before, state.dockerfile_line, ""
        )

    uv.lock_upgrade(project_dir=wt.path, package=tpu.harbor_package)
    new = read_state(wt.path, tpu)
    check_follows_branch(new, tpu, refs)
    after = new.pin
    if after.commit == before.commit and docker_pin == after.commit:
        # uv found nothing newer than the lock (the branch tip is not ahead of the locked commit).
        return _result(
            tpu, wt, wt.base_sha, False, harbor_tip, before, after, state.dockerfile_line, ""
        )
    write_atomic(
        in_checkout(wt.path, tpu.dockerfile),
        set_pin(state.dockerfile_text, tpu.dockerfile, variable, after.commit),
    )

    # Re-read what will be committed: the two pins must agree before anything leaves this machine.
    committed = read_state(wt.path, tpu)
    if find_pin(committed.dockerfile_text, tpu.dockerfile, variable).commit != committed.pin.commit:
        raise RelockRefused(
            f"{tpu.dockerfile} and uv.lock disagree after the re-lock: nothing was pushed"
        )
    check = uv.lock_check(project_dir=wt.path)
    if not check.ok:
        raise RelockRefused(
            f"`uv lock --check` fails on the re-locked tree, nothing was pushed:\n{check.output}"
        )

    git.commit_all(
        worktree=wt,
        message=commit_message(tpu.harbor_package, after),
        author=author,
        paths=["uv.lock", tpu.dockerfile],
    )
    pushed = git.push_fast_forward(worktree=wt)
    return _result(
        tpu,
        wt,
        pushed,
        True,
        harbor_tip,
        before,
        after,
        state.dockerfile_line,
        lock_diff(state.lock.text, new.lock.text),
    )


def _result(
    tpu: TpuSection,
    wt: Worktree,
    commit: str,
    pushed: bool,
    tip: str,
    before: HarborPin,
    after: HarborPin,
    docker_line: int,
    diff: str,
) -> HarborLock:
    return HarborLock(
        consumer_repo=redact(tpu.consumer_repo),
        consumer_branch=tpu.consumer_branch,
        consumer_base=wt.base_sha,
        consumer_commit=commit,
        pushed=pushed,
        harbor_repo=redact(tpu.harbor_repo),
        harbor_branch=tpu.harbor_branch,
        harbor_tip=tip,
        before=before,
        after=after,
        dockerfile=tpu.dockerfile,
        dockerfile_line=docker_line,
        lock_diff=diff,
    )
