"""Fixtures for the deployment tests: one real PostgreSQL for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres_server import (
    PostgresNotInstalled,
    PostgresServer,
    start_postgres,
    stop_postgres,
)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL on 127.0.0.1 (host, port, user, db, url);
    `fresh_database()` gives a test its own database."""
    server: PostgresServer | None = None
    missing = ""
    try:
        server = start_postgres()
    except PostgresNotInstalled as exc:
        missing = str(exc)
    # failed outside the except block: the report is that one line, not a chained traceback
    if server is None:
        pytest.fail(missing, pytrace=False)
    try:
        yield server
    finally:
        stop_postgres(server)
