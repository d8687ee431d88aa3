"""Roll back what iris workers RUN: pin harbor in the consumer repo to an older commit, and release it.

Workers `uv sync --frozen --reinstall` from the consumer's uv.lock, overwriting whatever the image
baked (runbook §2). So moving `:tpu` back does not roll back the runtime: the lock must move too.
A runtime pin is a re-lock to a fixed commit: `[tool.uv.sources]` pins harbor by `rev = "<sha>"`
(so no re-lock can move it while it is pinned), `uv lock --upgrade-package harbor`, the Dockerfile's
`HARBOR_COMMIT` set to the same sha, the same checks as a re-lock, one commit, pushed fast-forward
only. Releasing it puts `branch = <site harbor_branch>` back and re-locks to the tip. Any failure
before the push leaves the remote exactly as it was.
"""

from __future__ import annotations

from resources.errors import FileFormatError, LockstepError
from resources.git import SHA_RE, GitRemotes, Worktree
from resources.secrets import redact
from resources.site import TpuSection
from resources.uv import UvCli
from tpu_assets.dockerfile import find_pin, pin_variable, set_pin
from tpu_assets.lock_checks import pins_agree
from tpu_assets.models import HarborLock, HarborPin
from tpu_assets.relock import _same_repo, check_follows_branch, in_checkout, lock_diff, read_state

PYPROJECT = "pyproject.toml"


class RuntimePinRefused(LockstepError):
    """The consumer repo could not be pinned (or released) safely; nothing was pushed."""


def set_harbor_source(text: str, package: str, *, rev: str | None = None, branch: str | None = None) -> str:
    """pyproject.toml text with `[tool.uv.sources].<package>` pinned by `rev` or following `branch`.

    Only that entry's branch/rev/tag keys change (tomlkit keeps every other byte); the git URL stays.
    """
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    assert (rev is None) != (branch is None)
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise FileFormatError(PYPROJECT, getattr(exc, "line", None), f"not valid TOML: {exc}") from None
    source = doc.get("tool", {}).get("uv", {}).get("sources", {}).get(package)
    if not isinstance(source, dict) or "git" not in source:
        raise FileFormatError(
            PYPROJECT, None,
            f"[tool.uv.sources] has no git source for {package}: a runtime pin moves that source's rev",
        )
    for key in ("branch", "rev", "tag"):
        if key in source:
            del source[key]
    source["rev" if rev else "branch"] = rev or branch
    return tomlkit.dumps(doc)


def pin_message(package: str, pin: HarborPin, build: str) -> str:
    return (f"revert(deps): pin {package} -> {pin.version or 'unversioned'} ({pin.commit[:8]}), "
            f"runtime rollback to build {build[:8]}")


def release_message(package: str, pin: HarborPin, branch: str) -> str:
    return f"chore(deps): release {package} hold, re-lock to {branch} -> {pin.version or 'unversioned'} ({pin.commit[:8]})"


def pin_runtime(*, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str, harbor_commit: str,
                build: str) -> HarborLock:
    """Pin the consumer's harbor (uv.lock + HARBOR_COMMIT) to `harbor_commit`; push one commit or none."""
    if not SHA_RE.match(harbor_commit):  # it becomes a pyproject value and a Dockerfile line
        raise RuntimePinRefused(f"{harbor_commit!r} is not a full 40-hex commit sha: nothing was pushed")
    with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
        lock, src, before, _, _ = _state(wt, tpu)
        if not _same_repo(src.url, tpu.harbor_repo):
            raise _refused(tpu, wt, f"uv.lock takes {tpu.harbor_package} from {redact(src.url)}, not the site's "
                                    f"[tpu].harbor_repo {redact(tpu.harbor_repo)}")
        if src.rev == harbor_commit and before.commit == harbor_commit:
            return _result(tpu, wt, wt.base_sha, False, harbor_commit, before, before, "")
        return _lock_and_push(wt, tpu=tpu, git=git, uv=uv, author=author, before=before, before_text=lock.text,
                              source={"rev": harbor_commit}, expect=harbor_commit,
                              message=lambda pin: pin_message(tpu.harbor_package, pin, build))


def release_runtime(*, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str) -> HarborLock:
    """Put the branch source back and re-lock to the harbor branch tip; push one commit."""
    tip = git.ls_remote(url=tpu.harbor_repo, branch=tpu.harbor_branch)
    if tip is None:
        raise RuntimePinRefused(f"branch {tpu.harbor_branch!r} does not exist on {redact(tpu.harbor_repo)}: "
                                "the hold stays set, nothing was pushed")
    with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
        lock, _, before, _, _ = _state(wt, tpu)
        result = _lock_and_push(wt, tpu=tpu, git=git, uv=uv, author=author, before=before, before_text=lock.text,
                                source={"branch": tpu.harbor_branch}, expect=None,
                                message=lambda pin: release_message(tpu.harbor_package, pin, tpu.harbor_branch))
        return result.model_copy(update={"harbor_tip": tip})


def _state(wt: Worktree, tpu: TpuSection):  # type: ignore[no-untyped-def]
    try:
        return read_state(wt.path, tpu)
    except FileFormatError as exc:
        raise _refused(tpu, wt, str(exc)) from None


def _refused(tpu: TpuSection, wt: Worktree, why: str) -> RuntimePinRefused:
    return RuntimePinRefused(f"consumer repo {redact(tpu.consumer_repo)} ({tpu.consumer_branch} @ {wt.base_sha[:8]}): "
                             f"{why}. Nothing was pushed.")


def _lock_and_push(wt: Worktree, *, tpu: TpuSection, git: GitRemotes, uv: UvCli, author: str, before: HarborPin,
                   before_text: str, source: dict[str, str], expect: str | None, message) -> HarborLock:  # type: ignore[no-untyped-def]
    """Re-point the source, re-lock, set the Dockerfile pin, run a re-lock's checks, commit, push fast-forward."""
    pyproject = in_checkout(wt.path, PYPROJECT)
    try:
        pyproject.write_text(set_harbor_source(pyproject.read_text(encoding="utf-8"), tpu.harbor_package, **source),
                             encoding="utf-8")
        uv.lock_upgrade(project_dir=wt.path, package=tpu.harbor_package)
        new_lock, new_src, after, docker_text, _ = read_state(wt.path, tpu)
        if expect is None:
            check_follows_branch(new_src, new_lock, tpu)
        elif after.commit != expect:
            raise _refused(tpu, wt, f"uv locked {tpu.harbor_package} {after.commit[:8]}, not the pinned {expect[:8]}")
        variable = pin_variable(tpu.harbor_package)
        docker_path = in_checkout(wt.path, tpu.dockerfile)
        docker_path.write_text(set_pin(docker_text, tpu.dockerfile, variable, after.commit), encoding="utf-8")
        agree = pins_agree(in_checkout(wt.path, "uv.lock").read_text(encoding="utf-8"),
                           docker_path.read_text(encoding="utf-8"), tpu)
        if not agree.passed:
            raise _refused(tpu, wt, agree.description)
        find_pin(docker_path.read_text(encoding="utf-8"), tpu.dockerfile, variable)
    except FileFormatError as exc:
        raise _refused(tpu, wt, str(exc)) from None
    check = uv.lock_check(project_dir=wt.path)
    if not check.ok:
        raise _refused(tpu, wt, f"`uv lock --check` fails on the pinned tree:\n{check.output}")
    git.commit_all(worktree=wt, message=message(after), author=author, paths=[PYPROJECT, "uv.lock", tpu.dockerfile])
    pushed = git.push_fast_forward(worktree=wt)
    return _result(tpu, wt, pushed, True, after.commit, before, after, lock_diff(before_text, new_lock.text))


def _result(tpu: TpuSection, wt: Worktree, commit: str, pushed: bool, tip: str, before: HarborPin, after: HarborPin,
            diff: str) -> HarborLock:
    line = find_pin(in_checkout(wt.path, tpu.dockerfile).read_text(encoding="utf-8"), tpu.dockerfile,
                    pin_variable(tpu.harbor_package)).line
    return HarborLock(
        consumer_repo=redact(tpu.consumer_repo), consumer_branch=tpu.consumer_branch,
        consumer_base=wt.base_sha, consumer_commit=commit, pushed=pushed,
        harbor_repo=redact(tpu.harbor_repo), harbor_branch=tpu.harbor_branch, harbor_tip=tip,
        before=before, after=after, dockerfile=tpu.dockerfile, dockerfile_line=line, lock_diff=diff,
    )
