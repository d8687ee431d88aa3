"""Hostile servers for the deadline tests, each a child process on 127.0.0.1 stopped by its PID.

- ``drip``: an HTTP server that answers every request with 200 and headers at once, then drips the
  body one byte a second (what a registry behind a dying link does); each request line is logged.
- ``silent``: accepts TCP connections and never sends a byte (a hung git daemon, sshd or registry).

Run as ``python -m tests.support.fault_servers drip|silent PORT``; the context managers below do
that, wait until the port answers, and stop the process by PID however the test ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.servers import start_on_free_port, stop_process, wait_until_ready

# A manifest-sized body: at one byte a second no test deadline sees its end.
DRIP_BODY = (
    b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"'
    + b" " * 400
    + b"}"
)
DRIP_INTERVAL_S = 1.0


@dataclass(frozen=True)
class FaultServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def requests(self) -> list[str]:
        """The request lines the server logged (drip only), e.g. ``GET
        /v2/team/app/manifests/v1``."""
        return [
            line for line in self.log.read_text().splitlines() if line.startswith(("GET ", "HEAD "))
        ]


class _Drip(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        print(f"{self.command} {self.path}", flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        self.send_header("Content-Length", str(len(DRIP_BODY)))
        self.end_headers()
        self.wfile.flush()
        if not body:
            return
        with contextlib.suppress(OSError):  # the client gave up: that is the point
            for byte in DRIP_BODY:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(DRIP_INTERVAL_S)


def _serve_drip(port: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Drip)
    server.daemon_threads = True
    server.serve_forever()


def _serve_silent(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port), backlog=64)
    held = []  # kept open, never written to
    while True:
        conn, _ = listener.accept()
        held.append(conn)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start(kind: str, root: Path) -> FaultServer:
    """Start a `kind` server (drip | silent) on a free port; its log is root/<kind>.log."""
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{kind}.log"

    def run(port: int) -> FaultServer:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fault_servers", kind, str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=Path(__file__).resolve().parents[2],
            )
        server = FaultServer(proc=proc, port=port, log=log)
        wait_until_ready(
            proc,
            lambda: _answers(port),
            timeout_s=15,
            interval_s=0.05,
            log=log,
            tail_chars=2000,
            stop=lambda: stop_process(proc, grace_s=2),
            message=lambda _code, tail: f"{kind} server did not listen on {port}; its log:\n{tail}",
        )
        return server

    return start_on_free_port(run)


@contextlib.contextmanager
def running(kind: str, root: Path) -> Iterator[FaultServer]:
    server = start(kind, root)
    try:
        yield server
    finally:
        stop_process(server.proc, grace_s=2)


if __name__ == "__main__":
    {"drip": _serve_drip, "silent": _serve_silent}[sys.argv[1]](int(sys.argv[2]))
