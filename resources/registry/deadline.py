"""The total deadline of one registry request, its body included.

requests' timeout bounds each read of the socket, so a registry that answers one byte a second never
times out. Here the request must end `seconds` after it was sent, plus one second for every
`min_bps` bytes of body received: a multi-GiB layer keeps going while it moves at a useful rate, a
drip ends at the deadline. The body is read with `read1` (at most one socket read each time), so the
deadline is checked between reads, and each read's own timeout
is cut to what is left, so no read outlasts it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import requests

# Below this a read is not started: the deadline has as good as passed.
MIN_READ_S = 0.05
CHUNK = 64 * 1024


class TooSlow(OSError):
    """A request's deadline passed before its body
    ended. An OSError, so whatever resumes a body that
    broke off (transport.ResumableBody) treats it as a break; the message says why."""


class RequestDeadline:
    """When one request must be over; see the module docstring."""

    def __init__(self, *, seconds: float, min_bps: int, name: str, host: str) -> None:
        self.started = time.monotonic()
        self.seconds = seconds
        self.min_bps = min_bps
        self.name = name  # what to raise, e.g. "[timeouts] registry_request_s"
        self.host = host
        self.received = 0

    def left(self) -> float:
        return self.started + self.seconds + self.received / self.min_bps - time.monotonic()

    def read_timeout(self, per_read_s: float) -> float:
        """The timeout of the next socket read: the per-read
        one, or what is left of the deadline if less."""
        return max(MIN_READ_S, min(per_read_s, self.left()))

    def check(self) -> None:
        """Raise TooSlow when the deadline has passed."""
        if self.left() <= 0:
            took = time.monotonic() - self.started
            raise TooSlow(
                f"{self.host} sent {self.received} bytes of the answer in {took:.0f} s, past the "
                "request's deadline "
                f"({self.name} {self.seconds:g} s, plus 1 s per {self.min_bps} bytes received): "
                "the registry or "
                f"the network to it is too slow; check it, or raise {self.name}"
            )


# The deadline of a response rides on the response (requests.Response allows attributes), so the
# code that reads its body later, maybe after a Range
# resume, checks the one its own request started.
_ATTR = "_lockstep_deadline"


def attach(resp: requests.Response, deadline: RequestDeadline) -> None:
    setattr(resp, _ATTR, deadline)


def of(resp: requests.Response) -> RequestDeadline | None:
    return getattr(resp, _ATTR, None)


def read_some(resp: requests.Response, n: int, per_read_s: float, *, decode: bool = False) -> bytes:
    """At most `n` bytes of the body (b"" at its end) in at most one socket read, within the
    response's deadline; TooSlow when it has passed. `decode`:
    undo a Content-Encoding (gzip), as .content does;
    a body resumed at a byte offset is read as sent."""
    deadline = of(resp)
    if deadline is None:
        return resp.raw.read1(n, decode_content=decode)
    deadline.check()
    _cut_read_timeout(resp, deadline.read_timeout(per_read_s))
    try:
        data = resp.raw.read1(n, decode_content=decode)
    except Exception:
        deadline.check()  # a read cut short by the deadline says so, not "read timed out"
        raise
    deadline.received += len(data)
    return data


def read_all(resp: requests.Response, per_read_s: float) -> bytes:
    """The whole body, within the response's deadline
    (what requests' own non-streamed read does, without
    the deadline); also kept as the response's content, so .content and .json() work as usual."""
    chunks = []
    while chunk := read_some(resp, CHUNK, per_read_s, decode=True):
        chunks.append(chunk)
    body = b"".join(chunks)
    # requests keeps a read body in _content; filling it is what Response.content itself does.
    resp._content = body  # type: ignore[attr-defined]
    resp._content_consumed = True  # type: ignore[attr-defined]
    return body


def _cut_read_timeout(resp: requests.Response, seconds: float) -> None:
    # urllib3 set the socket's timeout to the per-read one when the request was sent; a read that
    # started just before the deadline could otherwise wait that long past it. Best effort: a
    # response without a live connection (already read, or not urllib3's) has nothing to cut.
    sock = getattr(getattr(resp.raw, "_connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(seconds)
