"""`lockstep deploy env`: the environment names a deployment must give lockstep for a site.

The logic is lockstep/deploy_env.py's; this module only reads arguments and prints.
"""

from __future__ import annotations

import os
from pathlib import Path

import click


@click.group("deploy")
def deploy() -> None:
    """What a deployment (deploy/docker, deploy/k8s) must be given for a site."""


@deploy.command("env")
@click.option(
    "--site",
    "site_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The site file; default $LOCKSTEP_SITE, else .sandbox/site.toml.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["compose", "dotenv", "k8s", "all"]),
    default="all",
    show_default=True,
    help="compose: the run launcher's env_vars; dotenv: the .env secrets block; "
    "k8s: the keys of Secret lockstep-secrets and how to create it.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"site", "secrets": [{"name", "keys"}], "env_vars", '
    '"k8s_secret", "k8s_secret_keys"} instead.',
)
@click.option(
    "--update",
    "update_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help=(
        "Also rewrite DIR/dagster.yaml's env_vars and DIR/.env.example's secrets block (never "
        "DIR/.env)."
    ),
)
def deploy_env(site_file: Path | None, fmt: str, as_json: bool, update_dir: Path | None) -> None:
    """Print the environment variables a deployment must pass to lockstep for a site: the compose
    run launcher's env_vars, the .env template's secrets
    and the Kubernetes Secret's keys. Names only: no
    value is read or printed. The trusted key files the site names need not exist yet."""
    from lockstep.deploy_env import deploy_env as make
    from lockstep.deploy_env import render, update_docker_dir
    from lockstep.exits import OperationalError
    from resources.errors import LockstepError
    from resources.site.load import DEFAULT_SITE, SITE_ENV, site_names_only

    path = site_file or Path(os.environ.get(SITE_ENV) or DEFAULT_SITE)
    if not path.is_file():
        hint = f"check {SITE_ENV}" if os.environ.get(SITE_ENV) else "give --site FILE"
        raise OperationalError(f"{path}: no site file here ({hint})")
    try:
        env = make(site_names_only(path))
        changed = update_docker_dir(env, update_dir) if update_dir is not None else []
    except (LockstepError, OSError) as exc:
        raise OperationalError(str(exc)) from None
    click.echo(env.model_dump_json(indent=2) if as_json else render(env, fmt), nl=as_json)  # type: ignore[arg-type]
    for changed_path in changed:
        click.echo(f"updated {changed_path}", err=True)
