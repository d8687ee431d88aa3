"""Keeping secret values out of logs, metadata, exceptions and files.

The site file only ever names environment variables; the values are read at the last moment and
every string that leaves lockstep (an error, a logged command line, metadata) passes `redact`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable

MASK = "***"

# https://user:token@host/... — git and registry URLs may carry credentials in their userinfo.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def secret_values(env_names: Iterable[str]) -> list[str]:
    """The current values of the named environment variables (unset or empty ones are skipped)."""
    return [v for name in env_names if (v := os.environ.get(name, ""))]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove URL credentials and every given secret value from `text`."""
    out = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    # Longest first so a secret that contains another is masked whole.
    for value in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        out = out.replace(value, MASK)
    return out


def without_credentials(url: str) -> str:
    """`url` with any `user:token@` userinfo removed (not
    masked): for links and matching, never for logs."""
    return _URL_USERINFO.sub(lambda m: m.group("scheme"), url)


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """A command line fit for a log: every argument passed through `redact`."""
    secrets = list(secrets)
    return [redact(a, secrets) for a in argv]


def quiet_urllib3() -> None:
    """Called before the first request of every HTTP client lockstep builds: urllib3 logs each
    request line and each retry at DEBUG, path included, and for a webhook the path IS the token
    (hooks.slack.com/services/T.../B.../secret). A daemon run at DEBUG must not write it out."""
    logging.getLogger("urllib3").setLevel(logging.INFO)
