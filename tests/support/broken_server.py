"""Servers that fail the way a remote does on a bad day, on 127.0.0.1, in one child process.

Run as a script it listens on one free port per behaviour, prints ``{"behaviour": port, ...}`` as
one JSON line once every socket listens, and serves until
it is killed (start_broken/stop_broken, by PID):

    reset   accepts, then closes with an RST (SO_LINGER 0): "connection reset by peer"
    silent  accepts and reads, never answers: a registry, git server or sshd that hangs
    html    answers every HTTP request with an HTML error page, as a proxy does when the registry
            behind it is down: 502 (404 for a path containing /missing), text/html, not JSON
    cut     answers 200 with a Content-Length it never sends: a download that breaks off

A port nobody listens on ("refused") needs no server: tests.support.servers.free_port gives one.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

BEHAVIOURS = ("reset", "silent", "html", "cut")
PAGE = (
    b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad "
    b"Gateway</h1>nginx</body></html>\n"
)


def _read_request(conn: socket.socket) -> bytes:
    """The request line and headers (a request body, if any, is never needed to answer)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _serve(behaviour: str, conn: socket.socket) -> None:
    with conn:
        if behaviour == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        if behaviour == "silent":
            while conn.recv(65536):
                pass
            return
        request = _read_request(conn)
        if not request:
            return
        line = request.split(b"\r\n", 1)[0]
        head_only = line.startswith(b"HEAD ")
        if behaviour == "html":
            status = b"404 Not Found" if b"/missing" in line else b"502 Bad Gateway"
            body = b"" if head_only else PAGE
            conn.sendall(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: text/html\r\nContent-Length: "
                + str(len(PAGE)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
        else:  # cut
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Content-Length: 1048576\r\nConnection: close\r\n\r\n"
                + b"\0"
                * (0 if head_only else 1000)
            )
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _listen(behaviour: str, sock: socket.socket) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=_serve, args=(behaviour, conn), daemon=True).start()


def main() -> None:
    ports = {}
    for behaviour in BEHAVIOURS:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        ports[behaviour] = sock.getsockname()[1]
        threading.Thread(target=_listen, args=(behaviour, sock), daemon=True).start()
    print(json.dumps(ports), flush=True)
    threading.Event().wait()


@dataclass
class BrokenServers:
    proc: subprocess.Popen[bytes]
    ports: dict[str, int]


def start_broken() -> BrokenServers:
    """The server as our child; returns once it listens (it prints its ports only then)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve())],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise RuntimeError(
            f"tests/support/broken_server.py exited {proc.returncode} before listening"
        )
    return BrokenServers(proc=proc, ports=json.loads(line))


def stop_broken(server: BrokenServers) -> None:
    from tests.support.servers import stop_process

    stop_process(server.proc, grace_s=5.0)
    if server.proc.stdout is not None:
        server.proc.stdout.close()


if __name__ == "__main__":
    main()
