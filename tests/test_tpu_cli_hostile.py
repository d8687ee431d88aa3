"""The tpu-side CLI (`image digest|cat|probes`, `rollback plan`, `changelog`, `reject`, `release`,
and the commands that act through the webserver: `promote`, `rollback`, `build reject|release`)
refuses hostile arguments as usage errors (exit 2) before it reads
the site, opens the instance, asks a registry or git
anything, or connects to the webserver."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

import resources.site.load
from lockstep.cli import main
from resources.errors import LockstepError
from resources.registry.base import Registry
from tests.support.hostile import HOSTILE_NAMES, HOSTILE_URLS
from tests.support.report import count

HOSTILE = sorted(set(HOSTILE_NAMES + HOSTILE_URLS))
MARKERS = [Path("/tmp/lockstep-pwned"), Path("/tmp/lockstep-escape"), Path("/tmp/lockstep-abs")]


@pytest.fixture
def outside_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every registry read, socket connect and site
    load is recorded (and fails): none may happen."""
    calls: list[str] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCKSTEP_SITE", raising=False)

    def record(what: str, error: type[Exception] = OSError):  # type: ignore[no-untyped-def]
        def call(*args: object, **kwargs: object) -> None:
            calls.append(what)
            raise error(f"{what}: not in this test")

        return call

    for name in ("resolve", "scan", "read_file", "absence"):
        monkeypatch.setattr(Registry, name, record(f"registry.{name}"))
    monkeypatch.setattr(socket.socket, "connect", record("socket.connect"))
    monkeypatch.setattr(resources.site.load, "load_site", record("load_site", LockstepError))
    return calls


COMMANDS = {
    "image digest": lambda v: ["image", "digest", "--", v],
    "image cat ref": lambda v: ["image", "cat", "--", v, "harbor/job.py"],
    "image cat path": lambda v: ["image", "cat", "--", "127.0.0.1:5000/org/image:tag", v],
    "image probes": lambda v: ["image", "probes", "--", v],
    "rollback --build": lambda v: ["rollback", "plan", f"--build={v}"],
    "rollback --must-contain": lambda v: ["rollback", "plan", f"--must-contain={v}"],
    "changelog FROM": lambda v: ["changelog", "--", v, "abcd1234"],
    "changelog TO": lambda v: ["changelog", "--", "abcd1234", v],
    "changelog --must-contain": lambda v: [
        "changelog",
        f"--must-contain={v}",
        "abcd1234",
        "abcd5678",
    ],
    "reject": lambda v: ["reject", "--reason=bad build", "--", v],
    "release": lambda v: ["release", "--", v],
    "promote --build": lambda v: ["promote", f"--build={v}", "--by=ops"],
    "rollback act --build": lambda v: ["rollback", f"--build={v}", "--by=ops"],
    "rollback act --must-contain": lambda v: ["rollback", f"--must-contain={v}", "--by=ops"],
    "rollback --plan --build": lambda v: ["rollback", "--plan", f"--build={v}"],
    "build reject": lambda v: ["build", "reject", "--reason=bad build", "--by=ops", "--", v],
    "build release": lambda v: ["build", "release", "--by=ops", "--", v],
}


# The argument each refusal must name (click's "Invalid value for <it>"): where the value came from.
ARGUMENT = {
    "image digest": "REF",
    "image cat ref": "REF",
    "image cat path": "PATH",
    "image probes": "REF",
    "rollback --build": "--build",
    "rollback --must-contain": "--must-contain",
    "changelog FROM": "FROM",
    "changelog TO": "TO",
    "changelog --must-contain": "--must-contain",
    "reject": "BUILD",
    "release": "BUILD",
    "promote --build": "--build",
    "rollback act --build": "--build",
    "rollback act --must-contain": "--must-contain",
    "rollback --plan --build": "--build",
    "build reject": "BUILD",
    "build release": "BUILD",
}


@pytest.mark.parametrize("command", COMMANDS)
def test_hostile_arguments_are_refused_before_anything_is_read(
    command: str, outside_calls: list[str]
) -> None:
    refused = 0
    for value in HOSTILE:
        if command == "image cat path" and value and "\n" not in value:
            # a path inside an image is data read from its
            # layers; only an empty or multi-line one is refused
            continue
        if (
            command.startswith(("rollback", "promote")) or command.endswith("--must-contain")
        ) and not value:
            continue  # an empty option is the default: no build / no required commit
        result = CliRunner().invoke(main, COMMANDS[command](value))
        assert result.exit_code == 2, (value, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            value,
            result.exception,
        )
        assert "Error" in result.output, (value, result.output)
        assert f"Invalid value for {ARGUMENT[command]}" in result.output, (value, result.output)
        refused += 1
    assert outside_calls == []
    assert not any(m.exists() for m in MARKERS)
    count("hostile names refused (tpu CLI)", refused)


def test_a_good_reference_does_reach_the_registry(outside_calls: list[str]) -> None:
    # The control: the recording above would see a call that got past the checks.
    result = CliRunner().invoke(main, ["image", "digest", "127.0.0.1:5000/org/image:tpu"])
    assert result.exit_code != 0 and outside_calls == ["load_site", "registry.resolve"]
