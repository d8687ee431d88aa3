"""`lockstep preflight [--site FILE] [--json] [--timeout
S]`: the click command (registered in lockstep/cli.py).

Exit 0 when no check fails (warnings allowed), 1 when one does, 2 for a bad command line (click's
own), 3 when preflight itself cannot run (no site file, or one that does not load).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from lockstep.preflight.findings import EXIT_CANNOT_RUN


@click.command("preflight")
@click.option(
    "--site",
    "site_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The site file (default: $LOCKSTEP_SITE, else .sandbox/site.toml).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Deadline of each outside call (default: the site's [iris] call_timeout_s and [spark] "
    "connect_timeout_s, 60 s for the rest).",
)
def preflight(site_file: Path | None, as_json: bool, timeout_s: float | None) -> None:
    """Check, before the first run on a site, that the consumer and build repos have the shape
    lockstep needs and that iris, the Spark nodes and the registry answer. Changes nothing anywhere
    (a registry upload session is opened and cancelled to prove push rights). Each finding says what
    is wrong, where (file:line, node, or site.toml:line) and the fix.

    Exit 0: nothing fails (warnings allowed); 1: a check fails; 3: preflight could not run."""
    from lockstep.preflight.findings import render_json, render_text
    from lockstep.preflight.run import run_preflight
    from resources.errors import LockstepError
    from resources.site.load import load_site

    try:
        if site_file is not None and not site_file.is_file():
            raise LockstepError(f"{site_file}: no site file here (--site)")
        site = load_site(site_file)
    except LockstepError as exc:
        message = f"preflight could not run: {exc}"
        if as_json:
            click.echo(json.dumps({"exit_code": EXIT_CANNOT_RUN, "error": message}, indent=2))
        else:
            click.echo(message, err=True)
        sys.exit(EXIT_CANNOT_RUN)
    report = run_preflight(site, timeout_s=timeout_s)
    click.echo(render_json(report) if as_json else render_text(report))
    sys.exit(report.exit_code)
