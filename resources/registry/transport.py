"""HTTP plumbing under HttpRegistry: when a read is retried and how long it waits, resuming a body
that broke off, and the small parsers of what registries answer (challenges, error bodies).

Reads (HEAD, GET) are idempotent and retried; writes never are. Hand-written rather than
urllib3's Retry or a decorator library: a retry here also resumes a half-read body at an offset
and shares one budget with Retry-After, which neither offers.
"""

from __future__ import annotations

import email.utils
import io
import ipaddress
import random
import re
import time
from collections.abc import Callable
from datetime import UTC
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from resources.registry.deadline import TooSlow, read_some
from resources.registry.refs import RegistryError

if TYPE_CHECKING:
    import requests

# 429 and the 5xx a proxy or an overloaded registry answers; 501 and 505 will not change on a retry.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
READS = frozenset({"GET", "HEAD"})


def _broken() -> tuple[type[BaseException], ...]:
    """What a body that broke off raises (requests is
    loaded by the first request, not with a location)."""
    import requests
    import urllib3

    return (urllib3.exceptions.HTTPError, requests.RequestException, OSError)


def backoff_sleep(seconds: float) -> None:
    """Every wait between retries goes through here, so a test can record it instead of waiting."""
    time.sleep(seconds)


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """A Retry-After header in seconds: delta-seconds or
    an HTTP-date (RFC 9110 10.2.3); None if unusable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RetryBudget:
    """How often and how long ONE read retries: at most `attempts` tries, waits with exponential
    backoff and full jitter (or what Retry-After asks, capped), and no retry that would end more
    than `budget_s` after the first failure."""

    def __init__(self, *, attempts: int, budget_s: float, base_s: float, max_wait_s: float) -> None:
        self.attempts = attempts
        self.budget_s = budget_s
        self.base_s = base_s
        self.max_wait_s = max_wait_s
        self.tries = 1
        self._first_failure: float | None = None
        self._waited = 0.0

    def again(self, resp: requests.Response | None = None) -> bool:
        """Wait and return True when one more try is allowed; False when the budget is spent."""
        if self.tries >= self.attempts:
            return False
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        asked = retry_after_s(resp.headers.get("Retry-After")) if resp is not None else None
        if asked is None:
            wait = random.uniform(0, min(self.max_wait_s, self.base_s * 2 ** (self.tries - 1)))
        else:
            wait = min(asked, self.max_wait_s)
        if self._elapsed(now) + wait > self.budget_s:
            return False
        backoff_sleep(wait)
        self._waited += wait
        self.tries += 1
        return True

    def _elapsed(self, now: float) -> float:
        # At least the waits asked for, so the budget holds
        # even where backoff_sleep does not really wait.
        started = now if self._first_failure is None else self._first_failure
        return max(now - started, self._waited)

    def progress(self) -> None:
        """A broken download moved forward since the last break: it starts a fresh budget."""
        self.tries, self._first_failure, self._waited = 1, None, 0.0

    def spent(self) -> str:
        return f"{self.tries} tries in {self._elapsed(time.monotonic()):.0f} s"


# Opens the body again from a byte offset: (offset, budget) -> a response whose body starts there.
Reopen = Callable[[int, RetryBudget], "requests.Response"]


class ResumableBody(io.RawIOBase):
    """A streamed GET body that, when the connection breaks mid-body, asks `reopen` for the rest
    (a Range request) and carries on; closing it drops the connection instead of draining it."""

    def __init__(
        self,
        resp: requests.Response,
        where: str,
        reopen: Reopen,
        budget: RetryBudget,
        *,
        per_read_s: float = 60.0,
    ) -> None:
        self._resp = resp
        self._per_read_s = per_read_s
        self._where = where
        self._reopen = reopen
        self._budget = budget
        self.offset = 0
        self._offset_at_break = -1

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                # One socket read at a time within the request's deadline
                # (resources/registry/deadline.py).
                data = read_some(self._resp, len(buffer), self._per_read_s)
            except _broken() as exc:
                self._resume(exc)
                continue
            n = len(data)
            buffer[:n] = data
            self.offset += n
            return n

    def _resume(self, exc: BaseException) -> None:
        # The request timeout also bounds every read of the body, so a stalled download lands here;
        # so does one past its deadline (TooSlow). A drip moves a little before each deadline: that
        # is not progress that earns a fresh retry budget, or it would drip forever.
        self._resp.close()
        if self.offset > self._offset_at_break and not isinstance(exc, TooSlow):
            self._budget.progress()
        self._offset_at_break = self.offset
        if not self._budget.again():
            why = str(exc) if isinstance(exc, TooSlow) else exc.__class__.__name__
            raise RegistryError(
                f"GET {self._where}: the download broke off at byte {self.offset} ({why}) "
                f"and did not resume ({self._budget.spent()}): check the network to the "
                "registry, or raise "
                "timeout_s / retry_budget_s"
            ) from None
        try:
            self._resp = self._reopen(self.offset, self._budget)
        # the resumed body broke (or ran out of time) while skipping to the offset
        except _broken() as again:
            self._resume(again)

    def close(self) -> None:
        self._resp.close()
        super().close()


def skip_to(
    resp: requests.Response, offset: int, where: str, *, per_read_s: float = 60.0
) -> requests.Response:
    """Position a resumed body at `offset`: a 206 must
    start there; a 200 (Range ignored) is the whole
    body again, so the bytes already read are read and dropped (within the request's deadline)."""
    if resp.status_code == 206:
        got = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.headers.get("Content-Range", ""))
        if got is None or int(got.group(1)) != offset:
            resp.close()
            raise RegistryError(
                f"GET {where}: asked to resume at byte {offset} and got Content-Range "
                f"{resp.headers.get('Content-Range')!r}: the registry or a proxy mangles ranges; "
                "run again"
            )
        return resp
    left = offset
    while left > 0:
        chunk = read_some(resp, min(left, 1024 * 1024), per_read_s)
        if not chunk:
            resp.close()
            raise RegistryError(
                f"GET {where}: the body served again is shorter than the {offset} bytes read before"
            )
        left -= len(chunk)
    return resp


# -- what registries answer ------------------------------------------------------------------------


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="..",service="..",scope=".."`` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'([A-Za-z]+)="([^"]*)"', rest)}
    return scheme.lower(), params


def is_loopback(host: str) -> bool:
    name = urlsplit("//" + host).hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def error_codes(resp: requests.Response) -> list[tuple[str, str]]:
    """The distribution API's JSON errors: [(code, message)]; [] for no body or not that shape."""
    # here, not only under TYPE_CHECKING: the except clause below names it at run time
    import requests

    try:
        body = resp.json()
        errors = body.get("errors") or []
        return [
            (str(e.get("code", "")), str(e.get("message", "")))
            for e in errors
            if isinstance(e, dict)
        ]
    except (ValueError, AttributeError, requests.RequestException):
        return []


def error_detail(resp: requests.Response) -> str:
    """The registry's own error codes and messages, short, for an error message."""
    text = "; ".join(f"{code}: {message}" for code, message in error_codes(resp))
    return f" ({text[:300]})" if text else ""


def with_query(url: str, **params: str) -> str:
    """Add query parameters to an upload Location, which may already carry its own (_state=...)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


STATUS_HINTS = {
    400: "the registry refused the request as invalid; if it names a blob, push the blobs first",
    401: (
        "the registry wants credentials: set token_env to the NAME of an env var holding a "
        "token, and export it"
    ),
    403: "the credentials lack permission: the token needs read:packages (write:packages to push)",
    404: "not found: check the repository and the tag or digest",
    405: "the registry does not allow this operation (deletes or pushes disabled?)",
    429: "rate limited: wait and run again",
}
