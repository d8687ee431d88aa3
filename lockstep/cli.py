"""The `lockstep` command: the sandbox, the demo, and (later) image and rollback tools for people."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from resources.errors import LockstepError


@click.group()
def main() -> None:
    """lockstep: re-lock, build, verify, promote and roll back container images with Dagster."""


@main.group()
def sandbox() -> None:
    """The embedded sandbox: real local upstream repos that stand in for harbor and the consumer."""


_dir = click.option(
    "--dir", "root", type=click.Path(file_okay=False, path_type=Path), default=Path(".sandbox"),
    show_default=True, help="Where the sandbox lives.",
)


@sandbox.command("up")
@_dir
def sandbox_up(root: Path) -> None:
    """Create the sandbox (idempotent) and print its site file."""
    from sandbox.world import up

    sb = _guard(lambda: up(root))
    click.echo(f"sandbox ready: {sb.site_file}")
    click.echo(f"  harbor   {sb.url(sb.harbor)}")
    click.echo(f"  consumer {sb.url(sb.consumer)}")


@sandbox.command("advance-harbor")
@_dir
@click.option("--fix", is_flag=True, help="Make this the commit that fixes the config-drift guard.")
@click.option("--no-version-bump", is_flag=True, help="Keep harbor's version (the stale-wheel trap).")
def sandbox_advance_harbor(root: Path, fix: bool, no_version_bump: bool) -> None:
    """Push one new harbor commit upstream and print its sha."""
    from sandbox.world import advance_harbor

    click.echo(_guard(lambda: advance_harbor(root, fix=fix, version_bump=not no_version_bump)))


@main.command()
@_dir
@click.option("--port", default=3000, show_default=True)
def demo(root: Path, port: int) -> None:
    """Sandbox up, then the Dagster UI on it (both code locations, sensors running)."""
    from sandbox.world import up

    sb = _guard(lambda: up(root))
    home = sb.root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LOCKSTEP_SITE": str(sb.site_file),
        "LOCKSTEP_CACHE": str(sb.root / "cache"),
        "LOCKSTEP_SENSORS_RUNNING": "1",
    }
    workspace = Path(__file__).resolve().parent.parent / "workspace.yaml"
    click.echo(f"lockstep demo on http://127.0.0.1:{port} (sandbox {sb.root}); Ctrl-C stops it")
    click.echo("  push upstream from another terminal: lockstep sandbox advance-harbor")
    argv = [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)]
    os.execvpe(argv[0], argv, env)


def _guard(fn):  # type: ignore[no-untyped-def]
    """Run `fn`; a LockstepError becomes a one-line message and exit code 2, not a traceback."""
    try:
        return fn()
    except LockstepError as exc:
        raise click.ClickException(str(exc)) from None
