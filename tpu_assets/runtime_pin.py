"""Roll back what iris workers RUN: pin harbor in
the consumer repo to an older commit, and release it.

Workers `uv sync --frozen --reinstall` from the consumer's uv.lock, overwriting whatever the image
baked (runbook §2). So moving `:tpu` back does not roll back the runtime: the lock must move too.
A runtime pin is a re-lock to a fixed commit: pyproject.toml pins harbor to `<sha>` in the shape the
consumer declares it (a direct reference's `@<branch>` becomes `@<sha>`; a `[tool.uv.sources]`
entry's `branch =` becomes `rev = "<sha>"`: tpu_assets/harbor_declaration.py), so no re-lock can
move it while it is pinned; then `uv lock --upgrade-package harbor`, the Dockerfile's
`HARBOR_COMMIT` set to the same sha, the same checks as a re-lock, one commit, pushed fast-forward
only. Releasing it puts the site's harbor branch back in the same place and re-locks to the tip. Any
failure before the push leaves the remote exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from resources.atomic import write_atomic
from resources.errors import FileFormatError, LockstepError
from resources.git import SHA_RE, GitRemotes, NamedRefs, Worktree
from resources.secrets import redact
from resources.site.tpu import TpuSection
from resources.uv import UvCli
from tpu_assets.dockerfile import find_pin, pin_variable, set_pin
from tpu_assets.harbor_declaration import PYPROJECT, set_declared_ref
from tpu_assets.lock_checks import pins_agree
from tpu_assets.models import HarborLock, HarborPin
from tpu_assets.relock import (
    ConsumerState,
    RelockRefused,
    _same_repo,
    check_follows_branch,
    harbor_branch_refs,
    in_checkout,
    lock_diff,
    read_state,
)


class RuntimePinRefused(LockstepError):
    """The consumer repo could not be pinned (or released) safely; nothing was pushed."""


def pin_message(package: str, pin: HarborPin, build: str) -> str:
    return (
        f"revert(deps): pin {package} -> {pin.version or 'unversioned'} ({pin.commit[:8]}), "
        f"runtime rollback to build {build[:8]}"
    )


def release_message(package: str, pin: HarborPin, branch: str) -> str:
    return (
        f"chore(deps): release {package} hold, re-lock to {branch} -> "
        f"{pin.version or 'unversioned'} ({pin.commit[:8]})"
    )


def pin_runtime(
    *, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str, harbor_commit: str, build: str
) -> HarborLock:
    """Pin the consumer's harbor (uv.lock + HARBOR_COMMIT)
    to `harbor_commit`; push one commit or none."""
    if not SHA_RE.match(harbor_commit):  # it becomes a pyproject value and a Dockerfile line
        raise RuntimePinRefused(
            f"{harbor_commit!r} is not a full 40-hex commit sha: nothing was pushed"
        )
    with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
        state = _state(wt, tpu)
        if state.source.rev == harbor_commit and state.pin.commit == harbor_commit:
            return _result(tpu, wt, wt.base_sha, False, harbor_commit, state.pin, state.pin, "")
        return _lock_and_push(
            wt,
            tpu=tpu,
            git=git,
            uv=uv,
            author=author,
            before=state,
            ref={"rev": harbor_commit},
            refs=None,
            message=lambda pin: pin_message(tpu.harbor_package, pin, build),
        )


def release_runtime(*, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str) -> HarborLock:
    """Put the site's branch back in pyproject and
    re-lock to the harbor branch tip; push one commit."""
    try:
        refs = harbor_branch_refs(git, tpu)
    except RelockRefused as exc:
        raise RuntimePinRefused(f"{exc}: the hold stays set, nothing was pushed") from None
    with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
        state = _state(wt, tpu)
        result = _lock_and_push(
            wt,
            tpu=tpu,
            git=git,
            uv=uv,
            author=author,
            before=state,
            ref={"branch": tpu.harbor_branch},
            refs=refs,
            message=lambda pin: release_message(tpu.harbor_package, pin, tpu.harbor_branch),
        )
        return result.model_copy(update={"harbor_tip": refs.branch})


def _state(wt: Worktree, tpu: TpuSection) -> ConsumerState:
    """The checkout's state, refused unless both the
    lock and pyproject take harbor from the site's harbor
    repo: uv fetches from the URL pyproject names."""
    try:
        state = read_state(wt.path, tpu)
    except FileFormatError as exc:
        raise _refused(tpu, wt, str(exc)) from None
    for what, url in (
        ("uv.lock takes", state.source.url),
        (f"{state.declared.where} declares", state.declared.url),
    ):
        if not _same_repo(url, tpu.harbor_repo):
            raise _refused(
                tpu,
                wt,
                f"{what} {tpu.harbor_package} from {redact(url)}, not the site's "
                f"[tpu].harbor_repo {redact(tpu.harbor_repo)}",
            )
    return state


def _refused(tpu: TpuSection, wt: Worktree, why: str) -> RuntimePinRefused:
    return RuntimePinRefused(
        f"consumer repo {redact(tpu.consumer_repo)} ({tpu.consumer_branch} @ {wt.base_sha[:8]}): "
        f"{why}. Nothing was pushed."
    )


def _lock_and_push(
    wt: Worktree,
    *,
    tpu: TpuSection,
    git: GitRemotes,
    uv: UvCli,
    author: str,
    before: ConsumerState,
    ref: dict[str, str],
    refs: NamedRefs | None,
    message: Callable[[HarborPin], str],
) -> HarborLock:
    """Re-point pyproject's harbor at `ref` (a pin's `rev`, or the release's `branch`), re-lock, set
    the Dockerfile pin, run a re-lock's checks (for a
    release, `refs`: the branch must be followed again),
    commit, push fast-forward."""
    pyproject = in_checkout(wt.path, PYPROJECT)
    try:
        write_atomic(
            pyproject,
            set_declared_ref(pyproject.read_text(encoding="utf-8"), tpu.harbor_package, **ref),
        )
        uv.lock_upgrade(project_dir=wt.path, package=tpu.harbor_package)
        new = read_state(wt.path, tpu)
        if refs is not None:
            check_follows_branch(new, tpu, refs)
        elif new.pin.commit != ref["rev"]:
            raise _refused(
                tpu,
                wt,
                (
                    f"uv locked {tpu.harbor_package} {new.pin.commit[:8]}, not the pinned "
                    f"{ref['rev'][:8]}"
                ),
            )
        variable = pin_variable(tpu.harbor_package)
        docker_path = in_checkout(wt.path, tpu.dockerfile)
        write_atomic(
            docker_path, set_pin(new.dockerfile_text, tpu.dockerfile, variable, new.pin.commit)
        )
        agree = pins_agree(
            in_checkout(wt.path, "uv.lock").read_text(encoding="utf-8"),
            docker_path.read_text(encoding="utf-8"),
            tpu,
        )
        if not agree.passed:
            raise _refused(tpu, wt, agree.description)
        find_pin(docker_path.read_text(encoding="utf-8"), tpu.dockerfile, variable)
    except FileFormatError as exc:
        raise _refused(tpu, wt, str(exc)) from None
    check = uv.lock_check(project_dir=wt.path)
    if not check.ok:
        raise _refused(tpu, wt, f"`uv lock --check` fails on the pinned tree:\n{check.output}")
    git.commit_all(
        worktree=wt,
        message=message(new.pin),
        author=author,
        paths=[PYPROJECT, "uv.lock", tpu.dockerfile],
    )
    pushed = git.push_fast_forward(worktree=wt)
    return _result(
        tpu,
        wt,
        pushed,
        True,
        new.pin.commit,
        before.pin,
        new.pin,
        lock_diff(before.lock.text, new.lock.text),
    )


def _result(
    tpu: TpuSection,
    wt: Worktree,
    commit: str,
    pushed: bool,
    tip: str,
    before: HarborPin,
    after: HarborPin,
    diff: str,
) -> HarborLock:
    line = find_pin(
        in_checkout(wt.path, tpu.dockerfile).read_text(encoding="utf-8"),
        tpu.dockerfile,
        pin_variable(tpu.harbor_package),
    ).line
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
        dockerfile_line=line,
        lock_diff=diff,
    )
