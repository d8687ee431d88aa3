"""cmake syntax for the dep table: command invocations with their arguments and lines, and if()
conditions evaluated for a CUDA build. No cmake semantics beyond that: set() resolution and the
FetchContent rows live in dep_table.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from resources.errors import FileFormatError

# -- cmake tokenizer -----------------------------------------------------------------------------
# Hand-written: no maintained Python cmake parser fits (cmakelang/cmake-format: last release 2020;
# parse_cmake: 2015; cmakeast: 2016; cmake-parser 0.9 is syntax only), and we need if() branch
# conditions and set() resolution on top of the syntax anyway.

ArgKind = Literal["unquoted", "quoted", "bracket", "paren"]


@dataclass(frozen=True)
class Arg:
    text: str
    kind: ArgKind
    line: int


@dataclass(frozen=True)
class Command:
    name: str  # lower-cased: cmake command names are case-insensitive
    args: tuple[Arg, ...]
    line: int


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", ";": "\\;"}


class _Scanner:
    """Splits a cmake file into command invocations:
    name '(' args ')' with nested parens and quotes."""

    def __init__(self, text: str, path: str) -> None:
        self.text, self.path, self.pos, self.line = text, path, 0, 1

    def commands(self) -> Iterator[Command]:
        while True:
            self._skip_blank()
            if self.pos >= len(self.text):
                return
            match = _IDENT.match(self.text, self.pos)
            if match is None:
                raise FileFormatError(
                    self.path, self.line, f"expected a cmake command, found {self._snippet()!r}"
                )
            line = self.line
            self._advance(match.end() - self.pos)
            self._skip_blank(comments=False)
            if self._peek() != "(":
                raise FileFormatError(
                    self.path,
                    self.line,
                    f"{match.group()} is not followed by '(': found {self._snippet()!r}",
                )
            self._advance(1)
            yield Command(
                name=match.group().lower(), args=self._arguments(match.group(), line), line=line
            )

    def _arguments(self, name: str, start: int) -> tuple[Arg, ...]:
        args: list[Arg] = []
        depth = 1
        while True:
            self._skip_blank()
            char = self._peek()
            if char == "":
                raise FileFormatError(
                    self.path, start, f"{name}( is never closed: a ')' is missing"
                )
            if char in "()":
                depth += 1 if char == "(" else -1
                self._advance(1)
                if depth == 0:
                    return tuple(args)
                args.append(Arg(char, "paren", self.line))
            elif char == '"':
                args.append(self._quoted())
            elif _BRACKET_OPEN.match(self.text, self.pos):
                args.append(self._bracket())
            else:
                args.append(self._unquoted())

    def _quoted(self) -> Arg:
        line, out = self.line, list[str]()
        self._advance(1)
        while True:
            char = self._peek()
            if char == "":
                raise FileFormatError(
                    self.path, line, "a quoted argument is never closed: a '\"' is missing"
                )
            self._advance(1)
            if char == '"':
                return Arg("".join(out), "quoted", line)
            if char == "\\":
                escaped = self._peek()
                self._advance(1)
                if escaped != "\n":  # backslash-newline continues the line
                    out.append(_ESCAPES.get(escaped, escaped))
            else:
                out.append(char)

    def _bracket(self) -> Arg:
        line = self.line
        match = _BRACKET_OPEN.match(self.text, self.pos)
        assert match is not None
        close = "]" + match.group(1) + "]"
        end = self.text.find(close, match.end())
        if end < 0:
            raise FileFormatError(
                self.path, line, f"a bracket argument {match.group()} is never closed by {close}"
            )
        body = self.text[match.end() : end]
        self._advance(end + len(close) - self.pos)
        return Arg(body.removeprefix("\n"), "bracket", line)

    def _unquoted(self) -> Arg:
        line, start = self.line, self.pos
        while (char := self._peek()) and not char.isspace() and char not in "()#":
            if char == "\\":
                self._advance(2)
            # legacy unquoted form, e.g. -DFOO="a b": the quotes belong to the argument
            elif char == '"':
                end = self.text.find('"', self.pos + 1)
                if end < 0:
                    raise FileFormatError(
                        self.path,
                        line,
                        "a quoted part of an argument is never closed: a '\"' is missing",
                    )
                self._advance(end + 1 - self.pos)
            else:
                self._advance(1)
        return Arg(self.text[start : self.pos], "unquoted", line)

    def _skip_blank(self, comments: bool = True) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char.isspace():
                self._advance(1)
            elif char == "#" and comments:
                self._comment()
            else:
                return

    def _comment(self) -> None:
        bracket = _BRACKET_OPEN.match(self.text, self.pos + 1)
        if bracket:  # #[[ ... ]] spans lines
            close = "]" + bracket.group(1) + "]"
            end = self.text.find(close, bracket.end())
            if end < 0:
                raise FileFormatError(
                    self.path,
                    self.line,
                    f"a bracket comment #{bracket.group()} is never closed by {close}",
                )
            self._advance(end + len(close) - self.pos)
            return
        end = self.text.find("\n", self.pos)
        self._advance((len(self.text) if end < 0 else end) - self.pos)

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _advance(self, count: int) -> None:
        self.line += self.text.count("\n", self.pos, self.pos + count)
        self.pos += count

    def _snippet(self) -> str:
        return self.text[self.pos : self.pos + 40].split("\n", 1)[0]


def commands(text: str, path: str) -> list[Command]:
    """Every command invocation of a cmake file, in order; a syntax error names path:line."""
    return list(_Scanner(text, path).commands())


# -- if() conditions on a CUDA build ---------------------------------------------------------------

_UNARY = frozenset(
    [
        "DEFINED",
        "EXISTS",
        "COMMAND",
        "POLICY",
        "TARGET",
        "TEST",
        "IS_DIRECTORY",
        "IS_SYMLINK",
        "IS_ABSOLUTE",
        "IS_READABLE",
        "IS_WRITABLE",
        "IS_EXECUTABLE",
    ]
)
_BINARY = frozenset(
    [
        "STREQUAL",
        "EQUAL",
        "LESS",
        "GREATER",
        "LESS_EQUAL",
        "GREATER_EQUAL",
        "STRLESS",
        "STRGREATER",
        "STRLESS_EQUAL",
        "STRGREATER_EQUAL",
        "MATCHES",
        "VERSION_EQUAL",
        "VERSION_LESS",
        "VERSION_GREATER",
        "VERSION_LESS_EQUAL",
        "VERSION_GREATER_EQUAL",
        "IN_LIST",
        "IS_NEWER_THAN",
        "PATH_EQUAL",
    ]
)
_PLATFORM_COMPARISONS = frozenset({"STREQUAL", "MATCHES", "IN_LIST"})
_ROCM = re.compile(r"(?<![A-Z0-9])(HIP|ROCM)")
_CUDA = re.compile(r"(?<![A-Z0-9])CUDA")
_COND_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[()]|[^\s()"]+')


def condition_tokens(condition: str) -> list[str]:
    return _COND_TOKEN.findall(condition)


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


def _and(a: bool | None, b: bool | None) -> bool | None:
    return False if a is False or b is False else (True if a and b else None)


def _or(a: bool | None, b: bool | None) -> bool | None:
    return True if a or b else (False if a is False and b is False else None)


class _ConditionOnCuda:
    """Recursive descent over cmake's if() grammar (OR
    < AND < NOT < comparisons), in Kleene logic."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def value(self) -> bool | None:
        result = self._or()
        return result if self.i == len(self.tokens) else None  # a shape we do not read: unknown

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _next(self) -> str | None:
        token = self._peek()
        self.i += 1
        return token

    def _or(self) -> bool | None:
        result = self._and()
        while self._peek() == "OR":
            self._next()
            result = _or(result, self._and())
        return result

    def _and(self) -> bool | None:
        result = self._not()
        while self._peek() == "AND":
            self._next()
            result = _and(result, self._not())
        return result

    def _not(self) -> bool | None:
        if self._peek() == "NOT":
            self._next()
            return _not(self._not())
        return self._primary()

    def _primary(self) -> bool | None:
        token = self._next()
        if token is None:
            return None
        if token == "(":
            result = self._or()
            if self._peek() == ")":
                self._next()
            return result
        if token in _UNARY:
            return _platform_atom(None, [self._next() or ""])
        if self._peek() in _BINARY:
            op = self._next()
            return _platform_atom(op, [token, self._next() or ""])
        return _platform_atom(None, [token])


def _platform_atom(op: str | None, operands: list[str]) -> bool | None:
    text = " ".join(o.strip('"') for o in operands).upper()
    rocm, cuda = bool(_ROCM.search(text)), bool(_CUDA.search(text))
    # a bare or DEFINED/EXISTS variable: only ROCm/HIP ones say anything about the platform
    if op is None:
        return False if rocm else None
    if op not in _PLATFORM_COMPARISONS or rocm == cuda:
        return None  # version and numeric checks do not pick a platform
    return cuda


def condition_on_cuda(condition: str) -> bool | None:
    """A condition's value on a CUDA build: False (selects
    ROCm/HIP or excludes CUDA), True, or None (unknown)."""
    return _ConditionOnCuda(condition_tokens(condition)).value()
