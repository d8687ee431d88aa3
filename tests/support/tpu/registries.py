"""Real docker-registry clients that misbehave the way the scars say, for the promotion-log tests.

Each is an HttpRegistry talking to the test's real server; only `tag` (the floating-tag PUT) is
changed, and every change really happens on the server: a manifest PUT the registry applied but
answered 500, a PUT that failed without applying, another writer moving the tag right after our
PUT, a process SIGKILLed between its PUT and its record, two writers held inside the window
between their guard read and their PUT.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

from resources.registry import OCI_CONFIG, OCI_MANIFEST, HttpRegistry, RegistryError

# The file that arms HeldAfterPut in a code location the test serves
# (tests/support/tpu/crash_location.py).
ARM_ENV = "LOCKSTEP_TEST_ARM"
SERVER_500 = "PUT {where}: HTTP 500 Internal Server Error: the registry failed: run again later"


class AppliedThen500(HttpRegistry):
    """The PUT lands on the server, then the client
    sees a 500 (a proxy, a registry storage hiccup)."""

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        super().tag(repository=repository, digest=digest, tag=tag)
        raise RegistryError(SERVER_500.format(where=self._where(repository, tag)))


# Tags whose PUT AppliedThen500ThenGone has made: from then on that tag cannot be read back.
_GONE_AFTER_PUT: set[str] = set()


class AppliedThen500ThenGone(AppliedThen500):
    """The PUT lands and answers 500, and the registry cannot be read after it: the run cannot tell
    whether it moved the tag (TagStateUnknown), fails, and records nothing, as if it had died."""

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        _GONE_AFTER_PUT.add(tag)
        super().tag(repository=repository, digest=digest, tag=tag)

    def resolve(self, *, repository: str, reference: str) -> str | None:
        if reference in _GONE_AFTER_PUT:
            raise RegistryError(f"GET {self._where(repository, reference)}: connection refused")
        return super().resolve(repository=repository, reference=reference)


class FailedPut(HttpRegistry):
    """The PUT is refused and nothing is written."""

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        raise RegistryError(SERVER_500.format(where=self._where(repository, tag)))


class MovedRightAfter(HttpRegistry):
    """Our PUT lands; before our re-read someone else
    (`crane tag`) points the tag at `then_digest`."""

    then_digest: str

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        super().tag(repository=repository, digest=digest, tag=tag)
        HttpRegistry(host=self.host).tag(repository=repository, digest=self.then_digest, tag=tag)


class KilledAfterPut(HttpRegistry):
    """The PUT lands, then the process is SIGKILLed: no record, no finally, no cleanup."""

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        super().tag(repository=repository, digest=digest, tag=tag)
        os.kill(os.getpid(), signal.SIGKILL)


class RaceWindow(HttpRegistry):
    """Holds this writer between its guard read and its PUT until the other writer is there too.

    `tag` is called right after the guard read. It marks `<name>.ready`, waits until the other
    writer has reached the floating-tag lock (its `.locking`, written by
    tests/support/tpu/race_worker.py), then at most `wait_s` for the other's `.ready`; notes whether
    it came (`<name>.window`: met / alone), PUTs, and appends the PUT to `puts.jsonl`. With the
    lock, the other writer is waiting on it and cannot get here while this one holds it, so the wait
    ends alone; without it both PUT from the same read.
    """

    barrier_dir: str
    name: str
    other: str
    wait_s: float = 4.0
    start_timeout_s: float = 120.0  # the other process starting up (imports, instance)

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        box = Path(self.barrier_dir)
        (box / f"{self.name}.ready").touch()
        deadline = time.monotonic() + self.start_timeout_s
        while not (box / f"{self.other}.locking").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        deadline = time.monotonic() + self.wait_s
        while not (box / f"{self.other}.ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (box / f"{self.name}.window").write_text(
            "met" if (box / f"{self.other}.ready").exists() else "alone"
        )
        super().tag(repository=repository, digest=digest, tag=tag)
        with open(box / "puts.jsonl", "a") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(json.dumps({"writer": self.name, "digest": digest, "at": time.time()}) + "\n")


def push_hand_made_image(registry: HttpRegistry, *, repository: str) -> str:
    """A small image lockstep never built or verified,
    as someone's `crane push` would leave: its digest."""
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
            "config": {"Labels": {"made.by": "hand"}},
        }
    ).encode()
    desc = registry.push_blob(repository=repository, data=config, media_type=OCI_CONFIG)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "layers": [],
            "config": {"mediaType": OCI_CONFIG, "digest": desc.digest, "size": desc.size},
        }
    ).encode()
    return registry.push_manifest(
        repository=repository, raw=manifest, media_type=OCI_MANIFEST, tag="hand-made"
    )


class HeldAfterPut(HttpRegistry):
    """Armed by the file `arm` (consumed by the first PUT that finds it): the PUT lands, this
    process writes its pid to `<arm>.put`, and waits there
    for ever, between its PUT and its record, for the
    test to SIGKILL it. Unarmed, a plain PUT."""

    arm: str

    def tag(self, *, repository: str, digest: str, tag: str) -> None:
        super().tag(repository=repository, digest=digest, tag=tag)
        try:
            Path(self.arm).unlink()
        except FileNotFoundError:
            return
        Path(f"{self.arm}.put").write_text(str(os.getpid()))
        while True:
            time.sleep(1)
