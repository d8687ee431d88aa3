"""A DAGSTER_HOME with the team deployment's instance config (deploy/docker/dagster.yaml) on a test
Postgres: its storage (from `DAGSTER_POSTGRES_*`),
queue and pool rules, none of its Docker parts."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.postgres_server import PgDatabase

PRODUCTION_YAML = Path(__file__).resolve().parents[3] / "deploy" / "docker" / "dagster.yaml"


def postgres_env(db: PgDatabase) -> dict[str, str]:
    """The `DAGSTER_POSTGRES_*` the deployment's storage block reads, for `db`."""
    # Trust auth on 127.0.0.1: the password is empty,
    # but the deployment's config names it, so it is set.
    return {
        "DAGSTER_POSTGRES_USER": db.user,
        "DAGSTER_POSTGRES_PASSWORD": "",
        "DAGSTER_POSTGRES_HOST": db.host,
        "DAGSTER_POSTGRES_DB": db.db,
        "DAGSTER_POSTGRES_PORT": str(db.port),
    }


def write_production_home(home: Path, db: PgDatabase) -> dict[str, str]:
    """Write `home`/dagster.yaml; returns the environment
    an instance on it needs (see postgres_env)."""
    production = yaml.safe_load(PRODUCTION_YAML.read_text(encoding="utf-8"))
    config = {key: production[key] for key in ("storage", "run_coordinator", "concurrency")}
    config["telemetry"] = {"enabled": False}
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return postgres_env(db)
