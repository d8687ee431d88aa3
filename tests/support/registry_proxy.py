"""A fault-injecting HTTP proxy in front of a real docker-registry, for the registry client's tests.

A threaded HTTP server on 127.0.0.1 that forwards every request to the registry and records what
it saw (method, path, headers, status). Faults are queued per request pattern and used up in order:

- ``Fault.status(429, retry_after="3")`` / ``Fault.status(503)``: answer that instead of forwarding;
- ``Fault.reset(after=N)``: forward, send N bytes of the body, then reset the connection (RST);
- ``Fault.truncate(after=N)``: forward, but claim and send only N bytes (a lying cache or proxy);
- ``Fault.ignore_range()``: forward without the request's Range header (the answer is a full 200).
- ``Fault.head_digest("sha256:...")``: answer a HEAD with 200 and that ``Docker-Content-Digest``,
  without asking the registry (a registry, proxy or cache that names a digest it may not hold).

With ``auth=True`` it also plays ghcr's bearer auth itself: a request without a token good for it
gets ``401 WWW-Authenticate: Bearer realm="http://127.0.0.1:<port>/token",service=..,scope=..``;
``/token`` issues tokens and records the scope of each request; a token whose scope lacks ``push``
gets 403 DENIED on a write (as ghcr answers); a repository in ``unreadable`` answers 404
NAME_UNKNOWN (as ghcr does for a package the token cannot read); for a repository in ``pull_only``
the token endpoint grants `pull` whatever was asked
(a token without write:packages), so a write gets
403. The registry behind it has no auth.

It is a thread in the test process, not a child
process: `stop()` shuts it down and closes its socket.
"""

from __future__ import annotations

import http.client
import itertools
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import parse_qs, urlsplit

from tests.support.report import count

_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "proxy-authorization",
    "proxy-connection",
}
_REPO_PATH = re.compile(r"^/v2/(?P<name>.+?)/(?:manifests|blobs|tags)/")


@dataclass(frozen=True)
class Fault:
    kind: str  # status | reset | truncate | ignore_range | head_digest
    status: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    after: int = 0

    @classmethod
    def status_code(cls, status: int, *, retry_after: str | None = None) -> Fault:
        return cls(
            "status", status=status, headers=(("Retry-After", retry_after),) if retry_after else ()
        )

    @classmethod
    def reset(cls, *, after: int) -> Fault:
        return cls("reset", after=after)

    @classmethod
    def truncate(cls, *, after: int) -> Fault:
        return cls("truncate", after=after)

    @classmethod
    def ignore_range(cls) -> Fault:
        return cls("ignore_range")

    @classmethod
    def head_digest(cls, digest: str) -> Fault:
        return cls("head_digest", headers=(("Docker-Content-Digest", digest),))


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    fault: str | None
    # set as the status line is sent, so a client never sees an answer not yet recorded
    status: int = 0


@dataclass
class _Rule:
    method: str
    path: re.Pattern[str]
    fault: Fault
    left: int


@dataclass
class RegistryProxy:
    upstream: str  # host:port of the real registry
    auth: bool = False
    service: str = "lockstep-proxy"
    unreadable: set[str] = field(default_factory=set)
    pull_only: set[str] = field(default_factory=set)
    seen: list[Seen] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._tokens: dict[str, set[tuple[str, str]]] = {}  # token -> {(repository, action)}
        self._serial = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def fail(self, method: str, path_regex: str, fault: Fault, *, times: int = 1) -> None:
        """The next `times` requests of `method` whose path matches `path_regex` get `fault`."""
        with self._lock:
            self._rules.append(_Rule(method.upper(), re.compile(path_regex), fault, times))

    def requests(self, method: str, path_regex: str = "") -> list[Seen]:
        pattern = re.compile(path_regex)
        return [s for s in self.seen if s.method == method.upper() and pattern.search(s.path)]

    def start(self) -> RegistryProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- used by the handler -----------------------------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for rule in self._rules:
                if rule.left > 0 and rule.method == method and rule.path.search(path):
                    rule.left -= 1
                    count(f"faults injected (registry {rule.fault.kind})")
                    return rule.fault
        return None

    def _issue(self, scope: str) -> str:
        token = f"proxy-token-{next(self._serial)}"
        granted: set[tuple[str, str]] = set()
        for item in scope.split(" "):
            kind, _, rest = item.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and name:
                granted |= {
                    (name, a)
                    for a in actions.split(",")
                    if a and (a == "pull" or name not in self.pull_only)
                }
        self._tokens[token] = granted
        return token

    def _grants(self, auth: str | None, repository: str, action: str) -> bool | None:
        """True: the token covers it; False: a token that does not (403); None: no token (401)."""
        if not auth or not auth.startswith("Bearer "):
            return None
        granted = self._tokens.get(auth.removeprefix("Bearer "))
        if granted is None:
            return None
        return (repository, action) in granted


def _handler(proxy: RegistryProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            self.handle_one()

        def do_HEAD(self) -> None:
            self.handle_one()

        def do_POST(self) -> None:
            self.handle_one()

        def do_PUT(self) -> None:
            self.handle_one()

        def do_PATCH(self) -> None:
            self.handle_one()

        def do_DELETE(self) -> None:
            self.handle_one()

        def handle_one(self) -> None:
            body = self.read_body()
            path = self.path
            fault = proxy._take_fault(self.command, urlsplit(path).path)
            self.record = Seen(
                self.command, path, dict(self.headers.items()), fault.kind if fault else None
            )
            proxy.seen.append(self.record)
            self.answer(path, body, fault)

        def send_response(self, code: int, message: str | None = None) -> None:
            self.record.status = code
            super().send_response(code, message)

        def read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def answer(self, path: str, body: bytes, fault: Fault | None) -> int:
            url = urlsplit(path)
            if fault is not None and fault.kind == "status":
                return self.send(
                    fault.status, _error("UNAVAILABLE", "injected fault"), dict(fault.headers)
                )
            if fault is not None and fault.kind == "head_digest" and self.command == "HEAD":
                return self.send(200, b"", dict(fault.headers))
            if proxy.auth and url.path == "/token":
                return self.token(url.query)
            if proxy.auth and (refused := self.check_auth(url.path)) is not None:
                return refused
            return self.forward(path, body, fault)

        def token(self, query: str) -> int:
            params = {k: v[0] for k, v in parse_qs(query).items()}
            proxy.token_requests.append(
                {**params, "basic": str(bool(self.headers.get("Authorization")))}
            )
            return self.send(
                200, json.dumps({"token": proxy._issue(params.get("scope", ""))}).encode()
            )

        def check_auth(self, path: str) -> int | None:
            match = _REPO_PATH.match(path)
            if match is None:
                return None
            name = match.group("name")
            write = self.command not in ("GET", "HEAD")
            action = "push" if write else "pull"
            granted = proxy._grants(self.headers.get("Authorization"), name, action)
            if granted is None:
                scope = f"repository:{name}:{'pull,push' if write else 'pull'}"
                challenge = f'Bearer realm="http://{proxy.host}/token",service="{proxy.service}",scope="{scope}"'
                return self.send(
                    401,
                    _error("UNAUTHORIZED", "authentication required"),
                    {"WWW-Authenticate": challenge},
                )
            if name in proxy.unreadable:
                return self.send(
                    404, _error("NAME_UNKNOWN", "repository name not known to registry")
                )
            if not granted:
                return self.send(
                    403, _error("DENIED", "requested access to the resource is denied")
                )
            return None

        def forward(self, path: str, body: bytes, fault: Fault | None) -> int:
            conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in _HOP_HEADERS | {"authorization"}
            }
            if fault is not None and fault.kind == "ignore_range":
                headers = {k: v for k, v in headers.items() if k.lower() != "range"}
            headers["Host"] = proxy.host  # so the registry's Location headers point back here
            if body:
                headers["Content-Length"] = str(len(body))
            try:
                conn.request(self.command, path, body=body or None, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status, resp.reason)
                length = resp.getheader("Content-Length")
                if fault is not None and fault.kind == "truncate":
                    length = str(min(int(length or 0), fault.after))
                for key, value in resp.getheaders():
                    if key.lower() not in _HOP_HEADERS | {"content-length"}:
                        self.send_header(key, value)
                if length is not None:
                    self.send_header("Content-Length", length)
                self.end_headers()
                if self.command == "HEAD":
                    return resp.status
                self.relay(resp, fault, int(length) if length is not None else None)
                return resp.status
            finally:
                conn.close()

        def relay(
            self, resp: http.client.HTTPResponse, fault: Fault | None, length: int | None
        ) -> None:
            limit = (
                fault.after if fault is not None and fault.kind in ("reset", "truncate") else None
            )
            sent = 0
            while True:
                want = 64 * 1024 if limit is None else min(64 * 1024, limit - sent)
                chunk = resp.read(want) if want > 0 else b""
                if not chunk:
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
            self.wfile.flush()
            if fault is not None and fault.kind == "reset":
                time.sleep(0.1)  # let the client take the bytes sent before the reset
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
                self.close_connection = True
            elif limit is not None:
                self.close_connection = True

        def send(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> int:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return status

    return Handler


def _error(code: str, message: str) -> bytes:
    return json.dumps({"errors": [{"code": code, "message": message}]}).encode()
