"""A real PostgreSQL on 127.0.0.1, for the deployment tests (Dagster's Postgres storage).

Everything lives in one throw-away directory: the cluster made by ``initdb`` (trust auth, and only
for 127.0.0.1), the unix socket, the server log. The server is ``postgres -D DATA`` started as our
child on a free port, polled until it accepts connections, and stopped by its PID (``pg_ctl stop -m
fast``, then a kill if it is still alive); the loops are tests/support/servers.py's. The machine's
own cluster (port 5432, /var/lib/postgresql) is never touched.

Binaries are found the Debian way, in ``/usr/lib/postgresql/<major>/bin`` (the newest major), since
``apt-get install postgresql`` does not put ``initdb`` on PATH; ``LOCKSTEP_PG_BIN`` overrides it.
PostgreSQL refuses to run as root: when the tests run as root (CI does), ``initdb``, ``postgres``
and ``pg_ctl`` run as the unprivileged ``postgres`` user the Debian package creates
(``LOCKSTEP_PG_USER`` overrides it), through ``setpriv``, which execs (so the PID we hold is the
postmaster's own), and the directory is created outside
pytest's root-only tmp tree and owned by that user.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

from tests.support.servers import start_on_free_port, stop_process, wait_until_ready

PG_BIN_ENV = "LOCKSTEP_PG_BIN"
PG_USER_ENV = "LOCKSTEP_PG_USER"
INSTALL_HINT = "apt-get install postgresql; ./dev setup does"
# The cluster's superuser and first database: throw-away
# names, with trust auth there is no password.
SUPERUSER = "lockstep"
DEFAULT_DB = "lockstep"
_TOOLS = ("initdb", "postgres", "pg_ctl")


class PostgresNotInstalled(RuntimeError):
    """No initdb/postgres/pg_ctl where Debian's postgresql package puts them."""


@dataclass(frozen=True)
class PgDatabase:
    """One database on the test server."""

    host: str
    port: int
    user: str
    db: str

    @property
    def url(self) -> str:
        """The SQLAlchemy URL dagster-postgres accepts as `postgres_url`."""
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{self.db}"

    def connect(self) -> psycopg2.extensions.connection:
        return psycopg2.connect(
            host=self.host, port=self.port, user=self.user, dbname=self.db, connect_timeout=5
        )

    def query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()
        finally:
            conn.close()


@dataclass
class PostgresServer:
    """One running postmaster (our child) and its directory."""

    proc: subprocess.Popen[bytes]
    root: Path
    port: int
    bin_dir: Path
    run_as: str | None  # the unprivileged user postgres runs as when we are root
    host: str = "127.0.0.1"
    user: str = SUPERUSER
    db: str = DEFAULT_DB
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        return self.database(self.db).url

    def database(self, name: str) -> PgDatabase:
        return PgDatabase(host=self.host, port=self.port, user=self.user, db=name)

    def create_database(self, name: str) -> PgDatabase:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(
                f"database name {name!r}: use lower-case letters, digits and _ (at most 63)"
            )
        conn = self.database("postgres").connect()
        conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.database(name)

    def fresh_database(self, prefix: str = "test") -> PgDatabase:
        """A new, empty database for one test, so tests never see each other's runs or events."""
        slug = re.sub(r"[^a-z0-9_]+", "_", prefix.lower())[:40].strip("_") or "test"
        return self.create_database(f"{slug}_{os.getpid()}_{next(self._names)}")


def find_bin_dir() -> Path:
    """`LOCKSTEP_PG_BIN`, else the newest
    /usr/lib/postgresql/<major>/bin that has every tool we run."""
    override = os.environ.get(PG_BIN_ENV)
    candidates = (
        [Path(override)]
        if override
        else sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
            reverse=True,
        )
    )
    for bin_dir in candidates:
        if all(os.access(bin_dir / tool, os.X_OK) for tool in _TOOLS):
            return bin_dir
    where = f"{PG_BIN_ENV}={override}" if override else "/usr/lib/postgresql/*/bin"
    raise PostgresNotInstalled(
        f"PostgreSQL server binaries ({', '.join(_TOOLS)}) not found in {where}: {INSTALL_HINT} "
        f"(or point {PG_BIN_ENV} at a directory that has them)"
    )


def _unprivileged_user() -> str | None:
    """Who postgres runs as: ourselves, or (when we are root) the package's `postgres` user."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get(PG_USER_ENV, "postgres")
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise PostgresNotInstalled(
            f"the tests run as root and PostgreSQL refuses to; there is no user {name!r} to run "
            "it as: "
            f"{INSTALL_HINT} (it creates `postgres`), or set {PG_USER_ENV} to an unprivileged user"
        ) from None
    return name


def _as_user(run_as: str | None, argv: list[str]) -> list[str]:
    if run_as is None:
        return argv
    entry = pwd.getpwnam(run_as)
    # setpriv execs the command (runuser forks and waits), so Popen's PID is the postmaster itself.
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--init-groups",
        "--",
        *argv,
    ]


def _accepts(port: int, user: str) -> bool:
    try:
        psycopg2.connect(
            host="127.0.0.1", port=port, user=user, dbname="postgres", connect_timeout=1
        ).close()
        return True
    except psycopg2.OperationalError:  # refused, or "the database system is starting up"
        return False


def _initdb(bin_dir: Path, root: Path, run_as: str | None) -> None:
    data = root / "data"
    argv = [
        str(bin_dir / "initdb"),
        "-D",
        str(data),
        "-U",
        SUPERUSER,
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-sync",
        "--no-instructions",
    ]
    done = subprocess.run(
        _as_user(run_as, argv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"initdb failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    # Only TCP from 127.0.0.1 is trusted; no other host and no unix-socket login.
    (data / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
    _give(data / "pg_hba.conf", run_as)


def _give(path: Path, run_as: str | None) -> None:
    """Make `path` the unprivileged user's (when we are root; otherwise it is ours already)."""
    if run_as is not None:
        entry = pwd.getpwnam(run_as)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def start_postgres(*, ready_timeout_s: float = 30.0) -> PostgresServer:
    """initdb into a fresh directory and start postgres
    on a free 127.0.0.1 port; returns when it accepts
    connections and the default database exists."""
    bin_dir = find_bin_dir()
    run_as = _unprivileged_user()
    # Not under pytest's tmp tree: as root that tree
    # is 0700 and the postgres user could not enter it.
    root = Path(tempfile.mkdtemp(prefix="lockstep-pg-"))
    try:
        (root / "run").mkdir()
        for path in (root, root / "run"):
            _give(path, run_as)
        _initdb(bin_dir, root, run_as)

        def start(port: int) -> PostgresServer:
            argv = [
                str(bin_dir / "postgres"), "-D", str(root / "data"),
                "-c", "listen_addresses=127.0.0.1", "-c", f"port={port}",
                "-c", f"unix_socket_directories={root / 'run'}",
                # A test cluster: durability buys nothing, speed does.
                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            ]  # fmt: skip
            with open(root / "postgres.log", "ab") as log:
                proc = subprocess.Popen(
                    _as_user(run_as, argv),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=root,
                )
            server = PostgresServer(proc=proc, root=root, port=port, bin_dir=bin_dir, run_as=run_as)
            wait_until_ready(
                proc,
                lambda: _accepts(port, SUPERUSER),
                timeout_s=ready_timeout_s,
                interval_s=0.1,
                log=server.log,
                tail_chars=3000,
                stop=lambda: _stop_process(server),
                message=lambda _returncode, tail: (
                    f"postgres did not accept connections within {ready_timeout_s} s; its "
                    f"log:\n{tail}"
                ),
            )
            try:
                server.create_database(DEFAULT_DB)
            except BaseException:
                # the directory is removed below: leave no postmaster serving it
                _stop_process(server)
                raise
            return server

        return start_on_free_port(start)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _stop_process(server: PostgresServer) -> None:
    """Stop exactly the postmaster we started: pg_ctl's
    fast shutdown, then its PID if it is still alive."""
    proc = server.proc
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            argv = [
                str(server.bin_dir / "pg_ctl"),
                "stop",
                "-D",
                str(server.data),
                "-m",
                "fast",
                "-w",
                "-t",
                "15",
            ]
            subprocess.run(
                _as_user(server.run_as, argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                check=False,
            )
        # pg_ctl has asked for the shutdown (not SIGTERM: that is postgres's "smart" mode, which
        # waits for clients); the kill is for a postmaster still
        # there. Backends exit on their own once it is gone.
        stop_process(proc, grace_s=10, sigterm=False)


def stop_postgres(server: PostgresServer) -> None:
    _stop_process(server)
    shutil.rmtree(server.root, ignore_errors=True)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        stop_postgres(server)
