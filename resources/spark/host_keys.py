"""The ssh transport's host-key policy: an unknown host is refused, keeping the key it offered.

Apart from transports.py because these subclass paramiko's classes, and paramiko (with invoke and
nacl) loads with the first ssh connection, not with a code location.
"""

from __future__ import annotations

import paramiko


class _RefuseUnknownHost(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key, so the error can show its fingerprint."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise _UnknownHost(hostname, key)


class _UnknownHost(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} not found in known_hosts")
        self.hostname = hostname
        self.key = key
