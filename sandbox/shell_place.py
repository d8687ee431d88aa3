"""Put a path into a shell script in place of a literal one, quoted for where it stands.

The sandbox's iris moves a kaniko script's literal ``/tmp`` and ``/kaniko`` into the job's own
root. That root lives under the sandbox directory, whose name the user chose: it may hold shell
syntax (``sb;touch${IFS}x;y``). Pasted bare, such a path becomes code. So each occurrence is written
the way its spot in the script reads it: bare -> single-quoted (shlex.quote); inside "..." or an
unquoted here-doc -> with ``\\ $ ` "`` escaped; inside '...' -> close the quote, the quoted path,
reopen. A comment is left alone (nothing reads it, and a newline in a path would end it). A quoted
here-doc cannot hold an escape: a path that needs one there is refused (ShellPlaceError).

The lexer is bash's quoting as far as a build script uses it (bash(1), QUOTING and Here Documents):
quotes, backslash, comments, ``$( )`` nesting, ``<<`` / ``<<-`` with a quoted or bare word.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

PLAIN, SINGLE, DOUBLE, HEREDOC, HEREDOC_LITERAL, COMMENT = (
    "plain",
    "single",
    "double",
    "heredoc",
    "literal",
    "comment",
)
_WORD_START = " \t\n;|&()<>"
_HEREDOC_WORD = re.compile(
    r"<<(-?)[ \t]*(?:'([^'\n]*)'|\"([^\"\n]*)\"|\\?([A-Za-z_][A-Za-z0-9_]*))"
)


class ShellPlaceError(ValueError):
    """A path cannot be written safely at that spot of the script (a quoted here-doc)."""


def contexts(script: str) -> list[str]:
    """How bash reads each character of `script`: one of PLAIN,
    SINGLE, DOUBLE, HEREDOC, HEREDOC_LITERAL, COMMENT."""
    n = len(script)
    out = [PLAIN] * n
    stack = [PLAIN]  # PLAIN or DOUBLE; a `$(` or `(` pushes PLAIN, its `)` pops
    pending: list[tuple[str, bool, bool]] = []  # here-docs whose bodies start at the next newline
    i = 0
    while i < n:
        c, top = script[i], stack[-1]
        out[i] = top
        if top == DOUBLE:
            if c == "\\":
                if i + 1 < n:
                    out[i + 1] = DOUBLE
                i += 2
                continue
            if c == '"':
                stack.pop()
            elif script.startswith("$(", i):
                out[i + 1] = DOUBLE
                stack.append(PLAIN)
                i += 2
                continue
            i += 1
            continue
        # PLAIN
        if c == "\\":
            if i + 1 < n:
                out[i + 1] = PLAIN
            i += 2
            continue
        if c == "'":
            end = script.find("'", i + 1)
            end = n - 1 if end < 0 else end
            for j in range(i + 1, end):
                out[j] = SINGLE
            if end > i:
                out[end] = PLAIN
            i = end + 1
            continue
        if c == '"':
            stack.append(DOUBLE)
        elif c == "#" and (i == 0 or script[i - 1] in _WORD_START):
            end = script.find("\n", i)
            end = n if end < 0 else end
            for j in range(i, end):
                out[j] = COMMENT
            i = end
            continue
        elif script.startswith("$(", i):
            out[i + 1] = PLAIN
            stack.append(PLAIN)
            i += 2
            continue
        elif c == "(":
            stack.append(PLAIN)
        elif c == ")" and len(stack) > 1:
            stack.pop()
        elif script.startswith("<<", i) and not script.startswith("<<<", i):
            m = _HEREDOC_WORD.match(script, i)
            if m:
                quoted = (
                    m.group(2) is not None
                    or m.group(3) is not None
                    or script[m.end(1) : m.start(4)].strip().startswith("\\")
                )
                word = (
                    m.group(2)
                    if m.group(2) is not None
                    else m.group(3)
                    if m.group(3) is not None
                    else m.group(4)
                )
                pending.append((word, quoted, m.group(1) == "-"))
                for j in range(i, m.end()):
                    out[j] = PLAIN
                i = m.end()
                continue
        elif c == "\n" and pending:
            i = _heredoc_bodies(script, i + 1, pending, out)
            pending = []
            continue
        i += 1
    return out


def _heredoc_bodies(
    script: str, start: int, pending: list[tuple[str, bool, bool]], out: list[str]
) -> int:
    """Mark each pending here-doc's body from `start`; the index after the last delimiter line."""
    i = start
    for word, quoted, dash in pending:
        while i < len(script):
            end = script.find("\n", i)
            end = len(script) if end < 0 else end
            line = script[i:end]
            if (line.lstrip("\t") if dash else line) == word:
                i = end + 1
                break
            for j in range(i, end + 1 if end < len(script) else end):
                out[j] = HEREDOC_LITERAL if quoted else HEREDOC
            i = end + 1
    return i


def quoted_for(context: str, path: str) -> str:
    """`path` written so that bash reads exactly `path` at a spot of kind `context`."""
    if shlex.quote(path) == path:  # nothing in it a shell reads specially: as it is, anywhere
        return path
    if context == PLAIN:
        return shlex.quote(path)
    if context == DOUBLE:
        return re.sub(r'([\\$`"])', r"\\\1", path)
    if context == HEREDOC:  # `"` is literal in a here-doc body; \, $ and ` are not
        return re.sub(r"([\\$`])", r"\\\1", path)
    if context == SINGLE:
        return "'" + shlex.quote(path) + "'"
    raise ShellPlaceError(
        f"{path!r} holds characters a shell reads specially and stands in a quoted here-doc, "
        "where no "
        "quoting applies: it cannot be placed there as data"
    )


def replace_paths(
    script: str, pattern: re.Pattern[str], path_for: Callable[[re.Match[str]], str]
) -> str:
    """`script` with each match of `pattern` outside comments
    replaced by `path_for(match)`, quoted for its spot."""
    where = contexts(script)

    def one(m: re.Match[str]) -> str:
        context = where[m.start()]
        return m.group(0) if context == COMMENT else quoted_for(context, path_for(m))

    return pattern.sub(one, script)
