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
    return re.compile(
        rf"^(?P<head>\s*ENV\s+{re.escape(variable)}(?:\s*=\s*|\s+))(?P<value>\S*)(?P<tail>.*)$",
        re.IGNORECASE,
    )


def _exact(variable: str) -> re.Pattern[str]:
    """The whole line is the pin and nothing else: `ENV
    VAR=<value>` (or the legacy `ENV VAR <value>`)."""
    return re.compile(rf"^\s*ENV\s+{re.escape(variable)}(?:=|\s+)(?P<value>\S+)\s*$", re.IGNORECASE)


_ESCAPE_DIRECTIVE = re.compile(r"^#\s*escape\s*=\s*(\S)\s*$", re.IGNORECASE)
_DIRECTIVE = re.compile(r"^#\s*[A-Za-z][A-Za-z0-9_-]*\s*=")
_HEREDOC = re.compile(r"<<(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")


class _Instruction(Model):
    line: int  # where it starts
    lines: list[int]  # every physical line it spans (continuations; comments inside are skipped)
    text: str  # its physical lines joined, continuation escapes dropped


def _scan(text: str) -> tuple[list[_Instruction], dict[int, int]]:
    """The Dockerfile's instructions as BuildKit reads
    them, and {heredoc body line: the line that opened it}.

    A line ending in the escape character continues
    onto the next; `<<EOF` opens a here-document whose
    body (up to a line that is `EOF`) is data for the instruction, never an instruction itself."""
    escape = "\\"
    instructions: list[_Instruction] = []
    heredoc_of: dict[int, int] = {}
    lines = text.splitlines()
    directives = True
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i]
        if directives and (m := _ESCAPE_DIRECTIVE.match(line)):
            escape = m.group(1)
        directives = directives and bool(_DIRECTIVE.match(line))
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        spans, parts = [number], [line]
        while parts[-1].rstrip().endswith(escape) and i < len(lines):
            parts[-1] = parts[-1].rstrip()[: -len(escape)]
            while i < len(lines) and lines[i].lstrip().startswith("#"):
                i += 1  # a comment inside a continued instruction is dropped by BuildKit
            if i < len(lines):
                spans.append(i + 1)
                parts.append(lines[i])
                i += 1
        instruction = _Instruction(line=number, lines=spans, text=" ".join(parts))
        instructions.append(instruction)
        for _, _, word in _HEREDOC.findall(instruction.text):
            while i < len(lines) and lines[i].strip() != word:
                heredoc_of[i + 1] = number
                i += 1
            i += 1  # the terminator
    return instructions, heredoc_of


def find_pin(text: str, path: str | Path, variable: str) -> DockerfilePin:
    """The single ``ENV <variable>=<sha>`` instruction,
    alone on its own line and outside any here-document.

    A second variable on the line, a pin continued with a backslash, a pin only inside a `RUN <<EOF`
    body (shell text, which docker never reads as ENV), a missing, repeated or non-sha pin: each is
    a FileFormatError naming the line. Anything looser
    lets the line lockstep rewrites differ from the
    value the image is built with."""
    instructions, heredoc_of = _scan(text)
    names = re.compile(rf"^\s*ENV\s+(?:.*\s)?{re.escape(variable)}(?:=|\s|$)", re.IGNORECASE)
    hits = [ins for ins in instructions if names.match(ins.text)]
    lines = text.splitlines()
    if not hits:
        inside = next((n for n in heredoc_of if names.match(lines[n - 1])), None)
        if inside is not None:
            raise FileFormatError(
                path,
                inside,
                f"`ENV {variable}` is inside the here-document opened on line "
                f"{heredoc_of[inside]}: that is shell text, not an instruction; put the pin "
                "on its own line above it",
            )
        last_from = max(
            (ins.line for ins in instructions if ins.text.lstrip().upper().startswith("FROM")),
            default=1,
        )
        raise FileFormatError(
            path,
            last_from,
            f"no `ENV {variable}=<sha>` line after this FROM: lockstep keeps the image's pin in "
            "lockstep with uv.lock "
            f"through it; add one above the RUN that installs it with --force-reinstall",
        )
    if len(hits) > 1:
        shown = ", ".join(str(ins.line) for ins in hits)
        raise FileFormatError(
            path, hits[1].line, f"`ENV {variable}` is set on lines {shown}: keep exactly one"
        )
    pin = hits[0]
    if len(pin.lines) > 1:
        raise FileFormatError(
            path,
            pin.line,
            f"`ENV {variable}` is continued onto line {pin.lines[1]}: the pin is one "
            f"line, `ENV {variable}=<40-hex sha>`, and nothing else",
        )
    match = _exact(variable).match(lines[pin.line - 1])
    if match is None:
        raise FileFormatError(
            path,
            pin.line,
            f"{lines[pin.line - 1].strip()[:200]!r} sets more than {variable}: the pin "
            f"is its own line, `ENV {variable}=<40-hex sha>`, and nothing else",
        )
    value = match.group("value")
    if not SHA_RE.match(value):
        raise FileFormatError(
            path, pin.line, f"{variable}={value!r} is not a full 40-hex commit sha"
        )
    return DockerfilePin(path=str(path), line=pin.line, variable=variable, commit=value)


def set_pin(text: str, path: str | Path, variable: str, commit: str) -> str:
    """`text` with the pin line pointing at `commit`; every other byte unchanged."""
    pin = find_pin(text, path, variable)
    lines = text.splitlines(keepends=True)
    m = _pattern(variable).match(lines[pin.line - 1].rstrip("\r\n"))
    assert m is not None
    ending = lines[pin.line - 1][len(lines[pin.line - 1].rstrip("\r\n")) :]
    lines[pin.line - 1] = f"{m.group('head')}{commit}{m.group('tail')}{ending}"
    return "".join(lines)
