"""One lock per floating tag across every lockstep writer of a deployment.

No registry offers a conditional tag PUT, so a move is read-compare-write-reread-record and two
writers between one's read and its PUT would overwrite each other. The `tag_moves` pool serialises
runs that one instance's daemon queues; it does not cover a second daemon, `dagster asset
materialize` from a shell, an in-process run, or floating_tag_watch. This lock does: it lives where
every writer's instance already points.

- Postgres event log (a team deployment): a session-level `pg_advisory_lock` on a key derived from
  the registry, repository and tag, on a connection of its own, held for the whole critical section.
  The server drops it when the holder's connection ends, so a SIGKILLed run does not wedge the tag.
- Anything else (SQLite, a local instance): an exclusive `flock` on a file under the instance's root
  directory; the kernel drops it when the holder's process ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from resources.errors import LockstepError

LOCK_DIR = "lockstep-locks"
_POLL_S = 0.05


class TagLockTimeout(LockstepError):
    """Another lockstep writer of the same floating tag held the lock for longer than we wait."""


def lock_name(*, registry: str, repository: str, tag: str) -> str:
    """What the lock is for, as a person reads it: `host/repository:tag`."""
    return f"{registry}/{repository}:{tag}"


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_advisory_lock`, from the lock's name."""
    return int.from_bytes(
        hashlib.sha256(f"lockstep floating tag {name}".encode()).digest()[:8], "big", signed=True
    )


def postgres_url(instance: dg.DagsterInstance) -> str | None:
    """The event log's Postgres URL when the instance
    keeps its event log in Postgres (dagster-postgres)."""
    from dagster_postgres import PostgresEventLogStorage

    storage = instance.event_log_storage
    return storage.postgres_url if isinstance(storage, PostgresEventLogStorage) else None


@contextlib.contextmanager
def floating_tag_lock(
    instance: dg.DagsterInstance, *, name: str, timeout_s: float, holder: str
) -> Iterator[str]:
    """Hold the lock for `name` (see `lock_name`) around a whole move, or raise TagLockTimeout after
    `timeout_s` (0: try once). Yields a description of the lock, for logs. `holder` (a run id, the
    watch) is written where the next writer's timeout error can name it."""
    url = postgres_url(instance)
    if url is not None:
        with _advisory_lock(url, name=name, timeout_s=timeout_s) as where:
            yield where
    else:
        path = Path(instance.root_directory) / LOCK_DIR / f"{_slug(name)}.lock"
        with _file_lock(path, name=name, timeout_s=timeout_s, holder=holder) as where:
            yield where


@contextlib.contextmanager
def _advisory_lock(url: str, *, name: str, timeout_s: float) -> Iterator[str]:
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    key = advisory_key(name)
    # pg_locks shows a bigint advisory key as classid (high 32 bits) and objid (low 32 bits).
    classid, objid = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    db = sa.engine.make_url(url)
    where = f"Postgres advisory lock {key} for {name} on {db.host}:{db.port or 5432}/{db.database}"
    # Its own connection, never one of the storage's pool: the lock belongs to this session and
    # must outlive whatever the event log does meanwhile. NullPool: closing it really disconnects.
    engine = sa.create_engine(
        url,
        poolclass=NullPool,
        connect_args={"connect_timeout": 10, "application_name": "lockstep floating-tag lock"},
    )
    try:
        try:
            conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except sa.exc.OperationalError as exc:
            raise TagLockTimeout(
                "cannot connect to the instance's Postgres at "
                f"{db.host}:{db.port or 5432}/{db.database} to take "
                f"the lock for {name} ({type(exc.orig).__name__}): check the database is "
                "reachable from here"
            ) from None
        with conn:
            deadline = time.monotonic() + timeout_s
            while not conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                if time.monotonic() >= deadline:
                    raise TagLockTimeout(
                        "another lockstep writer (a promote, rollback or release run, or "
                        "floating_tag_watch) held "
                        f"the {where} for over {timeout_s:g} s: nothing was moved. See who holds "
                        "it: SELECT pid, "
                        "application_name, backend_start FROM pg_locks JOIN pg_stat_activity "
                        "USING (pid) WHERE "
                        f"locktype = 'advisory' AND classid = {classid} AND objid = {objid}; "
                        "then run again"
                    )
                time.sleep(_POLL_S)
            try:
                yield where
            finally:
                # Closing the connection would release it too; unlocking says so while we still can.
                with contextlib.suppress(sa.exc.SQLAlchemyError):
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
    finally:
        engine.dispose()


@contextlib.contextmanager
def _file_lock(path: Path, *, name: str, timeout_s: float, holder: str) -> Iterator[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    where = f"file lock {path} for {name}"
    with open(path, "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    held_by = fh.read().strip() or "unknown"
                    raise TagLockTimeout(
                        f"another lockstep writer ({held_by}) held the {where} for over "
                        f"{timeout_s:g} s: nothing "
                        "was moved. Wait for it to finish (or check that process is alive), then "
                        "run again"
                    ) from None
                time.sleep(_POLL_S)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{holder}, pid {os.getpid()}\n")
            fh.flush()
            yield where
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _slug(name: str) -> str:
    """A file name for the lock: readable, and unique through a short hash of the exact name."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]
    return f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
