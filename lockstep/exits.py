"""The `lockstep` command's exit codes, and the exceptions that end a command with them.

0 ok; 1 a negative answer (no rollback target, a refused promotion, a probe that FAILS, a tag that
is not there); 2 usage (click's own: a bad option or argument, refused before anything is asked); 3
an operational error (the site, git, the registry, the instance or the webserver failed or could not
be reached). A script can tell "no" from "could not ask" by the code alone.
"""

from __future__ import annotations

import click

OK, NEGATIVE, USAGE, OPERATIONAL = 0, 1, 2, 3

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a negative answer (refused, none, FAILS); 2 usage (a bad option or "
    "argument); "
    "3 an operational error (site, git, registry, instance or webserver)."
)


class OperationalError(click.ClickException):
    """Something lockstep asked failed or could not be reached: exit 3, one line, no traceback."""

    exit_code = OPERATIONAL


class NegativeAnswer(click.ClickException):
    """The question was asked and answered "no": exit 1, with the answer's one line."""

    exit_code = NEGATIVE
