"""Finding a rev's source lock in the lab repo: listings and parses at one lab commit."""

from __future__ import annotations

from jovian_assets.models import AdoptedLock
from jovian_assets.source_lock import parse_source_lock
from resources.errors import LockstepError
from resources.git import GitRemotes
from resources.model import Model
from resources.names import NameRefused, check_name
from resources.secrets import redact
from resources.site.jovian import JovianSection

LAB_COMMIT_TAG = "lockstep/lab_commit"  # set by lab_rev_sensor: the lab commit a run adopts from


class LabLock(Model):
    """One lock file at a lab commit: its rev, or why it could not be read."""

    path: str
    blob: str
    rev: str | None = None
    error: str | None = None


def lab_locks(git: GitRemotes, jovian: JovianSection, *, lab_commit: str) -> list[LabLock]:
    """Every source lock the glob finds at `lab_commit` (shallow fetch), each parsed for its rev."""
    locks = []
    found = sorted(
        git.list_files(url=jovian.lab_repo, sha=lab_commit, pattern=jovian.lock_glob).items()
    )
    texts = git.read_blobs(
        url=jovian.lab_repo, sha=lab_commit, blobs=sorted({blob for _, blob in found})
    )
    for path, blob in found:
        entry = LabLock(path=path, blob=blob)
        try:
            entry.rev = parse_source_lock(texts[blob], path).rev
        except LockstepError as exc:
            entry.error = str(exc)
        locks.append(entry)
    return locks


def find_rev_lock(
    git: GitRemotes, jovian: JovianSection, *, lab_commit: str, rev: str
) -> AdoptedLock:
    """The lock whose release.version is `rev` at
    `lab_commit`, fully parsed (errors name file:line)."""
    locks = lab_locks(git, jovian, lab_commit=lab_commit)
    unreadable = "".join(f"\n  {entry.error}" for entry in locks if entry.error)
    because = f"; these locks could not be read:{unreadable}" if unreadable else ""
    try:
        # A partition added by hand can hold anything; no
        # parsed lock can, so say which lock was refused.
        check_name("lab_revs partition", rev)
    except NameRefused as exc:
        raise LockstepError(f"{exc}: no source lock can publish it{because}") from None
    candidates = [entry for entry in locks if entry.rev == rev]
    if not candidates:
        raise LockstepError(
            (
                f"no source lock with release.version={rev} under {jovian.lock_glob} at "
                f"{redact(jovian.lab_repo)} @ {lab_commit[:12]}"
            )
            + because
        )
    if len(candidates) > 1:
        raise LockstepError(
            f"rev {rev} is published twice: {', '.join(c.path for c in candidates)}; the lab "
            "must publish one lock per rev"
        )
    entry = candidates[0]
    # The blob's exact bytes (`git show` output loses the
    # last newline, which is how a cut-off lock shows).
    text = git.read_blobs(url=jovian.lab_repo, sha=lab_commit, blobs=[entry.blob])[entry.blob]
    lock = parse_source_lock(text, entry.path, required=jovian.packages)
    return AdoptedLock(rev=rev, lab_commit=lab_commit, path=entry.path, blob=entry.blob, lock=lock)
