"""`lockstep site`: check a site file (every error
at once, with its line) and print its JSON Schema.

The logic is resources/site/check.py's; this module only reads arguments and prints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click


@click.group("site")
def site() -> None:
    """The site file: check it before a code location loads it; give editors its schema."""


@site.command("check")
@click.argument(
    "file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"file", "ok", "errors": [{"file", "line", "table", '
    '"key", "message"}]} instead of one line per error.',
)
def site_check(file: Path | None, as_json: bool) -> None:
    """Check a site file and name EVERY error in it, each as FILE:LINE: [table] key: what is wrong.

    FILE: the site file; default $LOCKSTEP_SITE, else .sandbox/site.toml. Exit status: 0 the file is
    valid, 1 it has errors, 2 usage (e.g. FILE does not exist).
    """
    from resources.site.check import SiteCheck, check_site
    from resources.site.errors import SiteProblem
    from resources.site.load import DEFAULT_SITE, SITE_ENV

    path = file or Path(os.environ.get(SITE_ENV) or DEFAULT_SITE)
    if path.is_file():
        report = check_site(path)
    else:  # $LOCKSTEP_SITE or the sandbox's file, not there: say which, and what to do
        hint = (
            f"check {SITE_ENV}"
            if os.environ.get(SITE_ENV)
            else "run `lockstep sandbox up`, or give FILE"
        )
        report = SiteCheck(
            file=str(path),
            ok=False,
            errors=[SiteProblem(file=str(path), message=f"no site file here ({hint})")],
        )
    if as_json:
        click.echo(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        for error in report.errors:
            click.echo(str(error))
        n = len(report.errors)
        click.echo(f"{path}: {n} error{'s' if n != 1 else ''}" if n else f"{path}: valid site file")
    raise SystemExit(0 if report.ok else 1)


@site.command("schema")
def site_schema() -> None:
    """Print the site file's JSON Schema (draft 2020-12) for editors.

    Save it (`lockstep site schema > site.schema.json`) and put `#:schema ./site.schema.json` as the
    first line of the site file: Taplo (Even Better TOML) then completes and checks keys as you
    type. The rules written as code (names, URLs, cross-table rules) are `lockstep site check`'s.
    """
    from resources.site.check import site_schema as schema

    click.echo(json.dumps(schema(), indent=2))
