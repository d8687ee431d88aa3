"""The image's copy of the harbor pin: the ``ENV HARBOR_COMMIT=<sha>`` line of Dockerfile.tpu.

Changing that line is what busts kaniko's cached install layer (runbook §2), so it must carry the
same commit as uv.lock — the runtime gate — at every consumer commit.
"""

from __future__ import annotations

import re
from pathlib import Path

from resources.errors import FileFormatError
from resources.git import SHA_RE
from resources.model import Model


class DockerfilePin(Model):
    path: str
    line: int
    variable: str
    commit: str


def pin_variable(package: str) -> str:
    """``harbor`` -> ``HARBOR_COMMIT`` (the runbook's convention for canonical fast-moving deps)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", package).upper() + "_COMMIT"


def _pattern(variable: str) -> re.Pattern[str]:
    return re.compile(rf"^(?P<head>\s*ENV\s+{re.escape(variable)}(?:\s*=\s*|\s+))(?P<value>\S*)(?P<tail>.*)$")


def find_pin(text: str, path: str | Path, variable: str) -> DockerfilePin:
    """The single ``ENV <variable>=<sha>`` line; a missing, repeated or non-sha pin is an error."""
    pattern = _pattern(variable)
    hits = [(n, m) for n, line in enumerate(text.splitlines(), 1) if (m := pattern.match(line))]
    if not hits:
        raise FileFormatError(
            path, None,
            f"no `ENV {variable}=<sha>` line: lockstep keeps the image's pin in lockstep with uv.lock "
            f"through it; add one above the RUN that installs it with --force-reinstall",
        )
    if len(hits) > 1:
        lines = ", ".join(str(n) for n, _ in hits)
        raise FileFormatError(path, hits[1][0], f"`ENV {variable}` is set on lines {lines}: keep exactly one")
    number, match = hits[0]
    value = match.group("value")
    if not SHA_RE.match(value):
        raise FileFormatError(path, number, f"{variable}={value!r} is not a full 40-hex commit sha")
    return DockerfilePin(path=str(path), line=number, variable=variable, commit=value)


def set_pin(text: str, path: str | Path, variable: str, commit: str) -> str:
    """`text` with the pin line pointing at `commit`; every other byte unchanged."""
    pin = find_pin(text, path, variable)
    lines = text.splitlines(keepends=True)
    m = _pattern(variable).match(lines[pin.line - 1].rstrip("\r\n"))
    assert m is not None
    ending = lines[pin.line - 1][len(lines[pin.line - 1].rstrip("\r\n")):]
    lines[pin.line - 1] = f"{m.group('head')}{commit}{m.group('tail')}{ending}"
    return "".join(lines)
