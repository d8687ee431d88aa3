"""The dependency table of a vLLM source tree, read
from its cmake, and its diff against fetch-deps.sh.

Runbook, "Adopting a new lab rev", step 3: revs add and move deps (r27 added FlashKDA, LMCache,
flashinfer tvm-ffi/tilelang pins; r39 moved every external pin), so the gate list is re-synced from
the NEW tree's `cmake/external_projects/*.cmake` (and the top-level CMakeLists.txt, where vLLM
declares cutlass) every rev. Every GIT_REPOSITORY/GIT_TAG pin becomes a row; a platform branch is a
row of its own with its condition; a variable that cannot be resolved is reported, never dropped.

The vLLM tree is the lab's: each resolved pin is held to resources/names.py's rules (GIT_REPOSITORY
a git URL of a known scheme, GIT_TAG a ref or sha, GIT_SUBMODULES relative paths, the content name a
plain name), and a pin that breaks one is refused at the file:line of the set() it came from.
The tokenizer and the CUDA-path condition reader are in cmake_syntax.py.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from jovian_assets.cmake_syntax import Arg, Command, commands, condition_on_cuda, condition_tokens
from jovian_assets.inputs import check_utf8, read_text
from jovian_assets.models import DepRow, Finding
from resources.errors import FileFormatError
from resources.model import Model
from resources.names import (
    KNOWN_SCHEMES,
    NameRefused,
    check_name,
    check_ref,
    check_relative_path,
    check_url,
)

EXTERNAL_PROJECTS = "cmake/external_projects"


class Gate(Model):
    """One `gate NAME REPOSITORY TAG [SUBDIR...]` line of fetch-deps.sh."""

    name: str
    repository: str
    tag: str
    subdirs: list[str] = Field(default_factory=list)
    line: int


class GateMatch(Model):
    row: DepRow
    gate: Gate


class GateMove(Model):
    """A gate whose dependency the tree now pins at another tag or repository."""

    name: str
    old_repository: str
    old_tag: str
    new_repository: str | None
    new_tag: str | None
    gate_line: int
    row: DepRow
    change: str  # e.g. "tag a8f794d1… -> a6ec2ba7…"


class GateDiff(Model):
    added: list[DepRow]  # CUDA-path rows with no gate of the same name
    moved: list[GateMove]  # same name, another tag or repository
    removed: list[Gate]  # gates with no CUDA-path row
    # CUDA-path rows no gate pins exactly: what the blocking check fails on
    ungated_cuda_pins: list[DepRow]
    matched: list[GateMatch]

    @property
    def blocking(self) -> bool:
        return bool(self.ungated_cuda_pins)


class TableMove(Model):
    name: str
    condition: str | None
    old: DepRow
    new: DepRow
    change: str


class TableDiff(Model):
    """This rev's table against the previous rev's, by (name, condition)."""

    added: list[DepRow]
    moved: list[TableMove]
    removed: list[DepRow]


# -- one file: if() branches, set() definitions, FetchContent calls ------------------------------

BlockId = tuple[str, int]  # (file, line of its if())


@dataclass(frozen=True)
class _Branch:
    """One branch of an if() block, with the condition elements that hold inside it."""

    block: BlockId
    index: int  # 0 = if(), then each elseif()/else() in order
    elements: tuple[str, ...]


_Scope = tuple[_Branch, ...]


@dataclass(frozen=True)
class _Definition:
    name: str  # a variable, or ENV{X} for set(ENV{X} ...)
    value: str  # list elements joined with ';' as cmake does
    scope: _Scope
    where: tuple[str, int] = ("", 0)  # file and line of the set(): where a bad value is fixed


@dataclass(frozen=True)
class _Fetch:
    command: Command
    kind: Literal["declare", "populate"]
    scope: _Scope
    defs_before: int  # how many of the file's definitions precede it


@dataclass
class _Block:
    branches: int
    has_else: bool


@dataclass
class _OpenIf:
    block: BlockId
    conditions: list[str]  # the if() and elseif() conditions met so far
    branch: _Branch
    has_else: bool = False


@dataclass
class _FileScan:
    file: str
    definitions: list[_Definition] = field(default_factory=list)
    fetches: list[_Fetch] = field(default_factory=list)
    blocks: dict[BlockId, _Block] = field(default_factory=dict)


_FETCH_COMMANDS: dict[str, Literal["declare", "populate"]] = {
    "fetchcontent_declare": "declare",
    "fetchcontent_populate": "populate",
}


def _scan(text: str, file: str) -> _FileScan:
    scan = _FileScan(file=file)
    stack: list[_OpenIf] = []
    for command in commands(text, file):
        name = command.name
        if name in ("if", "elseif", "else", "endif"):
            _branching(command, stack, scan)
            continue
        scope = tuple(open_if.branch for open_if in stack)
        if name == "set":
            definition = _definition(command, scope, file)
            if definition is not None:
                scan.definitions.append(definition)
        elif name in _FETCH_COMMANDS:
            scan.fetches.append(
                _Fetch(command, _FETCH_COMMANDS[name], scope, len(scan.definitions))
            )
    if stack:
        raise FileFormatError(file, stack[-1].block[1], "if() has no matching endif()")
    return scan


def _branching(command: Command, stack: list[_OpenIf], scan: _FileScan) -> None:
    """Keep the stack of open if() blocks; each branch
    knows the condition elements that hold in it."""
    name, file = command.name, scan.file
    if name == "if":
        condition = _render(command.args)
        block = (file, command.line)
        stack.append(_OpenIf(block, [condition], _Branch(block, 0, (_wrap(condition),))))
        return
    if not stack:
        raise FileFormatError(file, command.line, f"{name}() without an open if()")
    top = stack[-1]
    if top.has_else and name != "endif":
        raise FileFormatError(
            file, command.line, f"{name}() after the else() of the if() at line {top.block[1]}"
        )
    negated = tuple(f"NOT ({c})" for c in top.conditions)
    if name == "elseif":
        condition = _render(command.args)
        top.branch = _Branch(top.block, top.branch.index + 1, negated + (_wrap(condition),))
        top.conditions.append(condition)
    elif name == "else":
        top.branch = _Branch(top.block, top.branch.index + 1, negated)
        top.has_else = True
    else:
        stack.pop()
        scan.blocks[top.block] = _Block(branches=top.branch.index + 1, has_else=top.has_else)


def _definition(command: Command, scope: _Scope, file: str) -> _Definition | None:
    """set(NAME v...) [CACHE TYPE doc [FORCE]] [PARENT_SCOPE] -> NAME = 'v;...'."""
    args = [a for a in command.args if a.kind != "paren"]
    if not args or ("$" in args[0].text and not args[0].text.startswith("ENV{")):
        return None  # a computed variable name cannot be resolved statically
    values = args[1:]
    if values and values[-1].kind == "unquoted" and values[-1].text == "PARENT_SCOPE":
        values = values[:-1]
    cache = next(
        (i for i, a in enumerate(values) if a.kind == "unquoted" and a.text == "CACHE"), None
    )
    if cache is not None:
        values = values[:cache]
    return _Definition(
        name=args[0].text,
        value=";".join(a.text for a in values),
        scope=scope,
        where=(file, command.line),
    )


def _render(args: Sequence[Arg]) -> str:
    """An if() condition as text: quotes kept, no space inside parentheses."""
    out = ""
    for arg in args:
        token = {"quoted": f'"{arg.text}"', "bracket": f"[[{arg.text}]]"}.get(arg.kind, arg.text)
        if out and not out.endswith("(") and token != ")":
            out += " "
        out += token
    return out


def _wrap(condition: str) -> str:
    """Parenthesize a condition with a top-level AND/OR
    so joining with ' AND ' keeps its meaning."""
    depth, compound = 0, False
    for token in condition_tokens(condition):
        depth += {"(": 1, ")": -1}.get(token, 0)
        compound = compound or (depth == 0 and token in ("AND", "OR"))
    return f"({condition})" if compound else condition


# -- resolution of ${VAR} through the definitions that can reach a use --------------------------

_REF = re.compile(r"\$(ENV|CACHE)?\{([A-Za-z0-9_./+\-]+)\}")  # ${X}, $ENV{X}, $CACHE{X}
_MAX_DEPTH = 10


@dataclass(frozen=True)
class _Resolved:
    value: str
    scope: _Scope  # the use's scope plus the branches its definitions live in
    unresolved: tuple[str, ...] = ()
    sources: tuple[tuple[str, int], ...] = ()  # (file, line) of every set() the value came through


def _compatible(a: _Scope, b: _Scope) -> bool:
    """False when the two scopes sit in different branches of the same if() block."""
    branches = {x.block: x.index for x in a}
    return all(branches.get(y.block, y.index) == y.index for y in b)


def _merge(a: _Scope, b: _Scope) -> _Scope:
    return a + tuple(x for x in b if x not in a)


class _Resolver:
    def __init__(self, blocks: dict[BlockId, _Block]) -> None:
        self.blocks = blocks

    def resolve(
        self, text: str, scope: _Scope, chain: Sequence[_Definition], depth: int = 0
    ) -> list[_Resolved]:
        """Every value `text` can take at a use in `scope`,
        one per combination of reaching definitions."""
        variants = [_Resolved("", scope)]
        pos = 0
        for ref in _REF.finditer(text):
            literal = text[pos : ref.start()]
            pos = ref.end()
            key = f"ENV{{{ref.group(2)}}}" if ref.group(1) == "ENV" else ref.group(2)
            variants = [
                e
                for v in variants
                for e in self._expand(
                    _Resolved(v.value + literal, v.scope, v.unresolved, v.sources),
                    key,
                    ref.group(),
                    chain,
                    depth,
                )
            ]
        return [_Resolved(v.value + text[pos:], v.scope, v.unresolved, v.sources) for v in variants]

    def _expand(
        self, so_far: _Resolved, key: str, raw: str, chain: Sequence[_Definition], depth: int
    ) -> list[_Resolved]:
        found = self._reaching(key, so_far.scope, chain) if depth < _MAX_DEPTH else []
        if not found:
            return [
                _Resolved(
                    so_far.value + raw, so_far.scope, so_far.unresolved + (key,), so_far.sources
                )
            ]
        out = []
        for index, definition in found:
            scope = _merge(so_far.scope, definition.scope)
            for sub in self.resolve(definition.value, scope, chain[:index], depth + 1):
                out.append(
                    _Resolved(
                        so_far.value + sub.value,
                        sub.scope,
                        so_far.unresolved + sub.unresolved,
                        so_far.sources + (definition.where,) + sub.sources,
                    )
                )
        return out

    def _reaching(
        self, key: str, scope: _Scope, chain: Sequence[_Definition]
    ) -> list[tuple[int, _Definition]]:
        """The set()s of `key` that can be the value at a use in `scope`, in file order.

        Walks back from the use; stops at a definition that always runs when the use runs, or when
        the definitions found cover every branch of an if()/else() block (e.g. TRITON_GIT set in
        both the ROCm and the else branch): nothing earlier can reach the use.
        """
        found: list[tuple[int, _Definition]] = []
        covered: dict[BlockId, set[int]] = {}
        for index in range(len(chain) - 1, -1, -1):
            definition = chain[index]
            if definition.name != key or not _compatible(definition.scope, scope):
                continue
            found.append((index, definition))
            extra = [b for b in definition.scope if b not in scope]
            if not extra:
                break
            if len(extra) == 1:
                covered.setdefault(extra[0].block, set()).add(extra[0].index)
                block = self.blocks.get(extra[0].block)
                if (
                    block is not None
                    and block.has_else
                    and len(covered[extra[0].block]) == block.branches
                ):
                    break
        return found[::-1]


# -- rows ----------------------------------------------------------------------------------------

# FetchContent_Declare / ExternalProject keywords: an option's values run until the next one.
_KEYWORDS = frozenset(
    [
        "GIT_REPOSITORY",
        "GIT_TAG",
        "GIT_SUBMODULES",
        "GIT_SUBMODULES_RECURSE",
        "GIT_PROGRESS",
        "GIT_SHALLOW",
        "GIT_REMOTE_NAME",
        "GIT_CONFIG",
        "GIT_REMOTE_UPDATE_STRATEGY",
        "URL",
        "URL_HASH",
        "URL_MD5",
        "DOWNLOAD_NAME",
        "DOWNLOAD_DIR",
        "DOWNLOAD_COMMAND",
        "DOWNLOAD_NO_EXTRACT",
        "DOWNLOAD_NO_PROGRESS",
        "DOWNLOAD_EXTRACT_TIMESTAMP",
        "SOURCE_DIR",
        "BINARY_DIR",
        "SUBBUILD_DIR",
        "SOURCE_SUBDIR",
        "PREFIX",
        "TMP_DIR",
        "STAMP_DIR",
        "INSTALL_DIR",
        "LOG_DIR",
        "CONFIGURE_COMMAND",
        "BUILD_COMMAND",
        "INSTALL_COMMAND",
        "TEST_COMMAND",
        "UPDATE_COMMAND",
        "PATCH_COMMAND",
        "UPDATE_DISCONNECTED",
        "CMAKE_ARGS",
        "CMAKE_CACHE_ARGS",
        "CMAKE_CACHE_DEFAULT_ARGS",
        "BUILD_IN_SOURCE",
        "BUILD_ALWAYS",
        "BUILD_BYPRODUCTS",
        "TLS_VERIFY",
        "TLS_CAINFO",
        "HTTP_USERNAME",
        "HTTP_PASSWORD",
        "HTTP_HEADER",
        "NETRC",
        "NETRC_FILE",
        "INACTIVITY_TIMEOUT",
        "TIMEOUT",
        "QUIET",
        "EXCLUDE_FROM_ALL",
        "SYSTEM",
        "OVERRIDE_FIND_PACKAGE",
        "FIND_PACKAGE_ARGS",
        "LOG_DOWNLOAD",
        "LOG_UPDATE",
        "LOG_PATCH",
        "LOG_CONFIGURE",
        "LOG_BUILD",
        "LOG_INSTALL",
        "USES_TERMINAL_DOWNLOAD",
        "USES_TERMINAL_UPDATE",
        "DEPENDS",
    ]
)


def _options(args: Sequence[Arg]) -> tuple[Arg | None, dict[str, list[Arg]]]:
    """(the content name, {KEYWORD: its values}) of a FetchContent call."""
    plain = [a for a in args if a.kind != "paren"]
    options: dict[str, list[Arg]] = {}
    current: list[Arg] | None = None
    for arg in plain[1:]:
        if arg.kind == "unquoted" and arg.text in _KEYWORDS:
            current = options.setdefault(arg.text, [])
        elif current is not None:
            current.append(arg)
    return (plain[0] if plain else None), options


def _override(options: dict[str, list[Arg]]) -> str | None:
    """The variable a SOURCE_DIR-only declare reads:
    `$ENV{X_SRC_DIR}`, `X_SRC_DIR` or a literal path."""
    if (
        "GIT_REPOSITORY" in options
        or "GIT_TAG" in options
        or "URL" in options
        or not options.get("SOURCE_DIR")
    ):
        return None  # with a download, SOURCE_DIR is only where it lands
    text = " ".join(a.text for a in options["SOURCE_DIR"])
    ref = _REF.search(text)
    if ref is None:
        return text
    return f"$ENV{{{ref.group(2)}}}" if ref.group(1) == "ENV" else ref.group(2)


def _condition(scope: _Scope) -> str | None:
    elements = [e for branch in scope for e in branch.elements]
    return " AND ".join(elements) if elements else None


def _rows_for(
    fetch: _Fetch,
    file: str,
    chain: Sequence[_Definition],
    resolver: _Resolver,
    overrides: dict[str, str],
) -> list[DepRow]:
    """One row per combination of definitions reaching the repository and the tag."""
    name_arg, options = _options(fetch.command.args)
    if name_arg is None or not ("GIT_REPOSITORY" in options or "GIT_TAG" in options):
        # FetchContent_Populate(name) of an earlier declare, or a SOURCE_DIR/URL-only call
        return []
    _refuse_empty_options(fetch.command.args, options, file)
    named = resolver.resolve(name_arg.text, fetch.scope, chain)[0]
    name = named.value
    if not named.unresolved:
        _check_value(check_name, "FetchContent name", named, file, name_arg.line)
    rows = []
    for repo in _option_values(options, "GIT_REPOSITORY", fetch.scope, chain, resolver):
        if "GIT_REPOSITORY" in options:
            _check_value(_git_url, "GIT_REPOSITORY", repo, file, options["GIT_REPOSITORY"][0].line)
        for tag in _option_values(options, "GIT_TAG", repo.scope, chain, resolver):
            if "GIT_TAG" in options:
                _check_value(check_ref, "GIT_TAG", tag, file, options["GIT_TAG"][0].line)
            submodules, missing = _submodules(options, tag.scope, chain, resolver)
            for path in submodules if not missing else []:
                _check_value(
                    check_relative_path,
                    "GIT_SUBMODULES path",
                    _Resolved(path, ()),
                    file,
                    options["GIT_SUBMODULES"][0].line,
                )
            unresolved = list(
                dict.fromkeys(named.unresolved + repo.unresolved + tag.unresolved + missing)
            )
            rows.append(
                DepRow(
                    recursive=_recursive(unresolved, chain),
                    name=name,
                    repository=repo.value or None,
                    tag=tag.value or None,
                    submodules=submodules,
                    condition=_condition(tag.scope),
                    file=file,
                    line=fetch.command.line,
                    source_dir_override=overrides.get(name.lower()),
                    unresolved=unresolved,
                    kind=fetch.kind,
                )
            )
    return rows


def _recursive(keys: Sequence[str], chain: Sequence[_Definition]) -> list[str]:
    """The unresolved `keys` that a set() defines from
    themselves (`set(T "${T}")`): there is a definition,
    but it can only ever expand to itself, so it is reported as recursive, not as missing."""
    out = []
    for key in keys:
        shown = f"${key}" if key.startswith("ENV{") else f"${{{key}}}"
        if any(d.name == key and shown in d.value for d in chain):
            out.append(key)
    return out


def _git_url(kind: str, value: object) -> str:
    return check_url(kind, value, KNOWN_SCHEMES)


def _refuse_empty_options(args: Sequence[Arg], options: dict[str, list[Arg]], file: str) -> None:
    """`GIT_TAG` or `GIT_REPOSITORY` followed by the next
    keyword (or `)`): cmake would fetch the default branch."""
    for arg in args:
        if (
            arg.kind == "unquoted"
            and arg.text in ("GIT_REPOSITORY", "GIT_TAG")
            and not options.get(arg.text)
        ):
            what = (
                "the repository URL"
                if arg.text == "GIT_REPOSITORY"
                else "a tag or the full commit sha"
            )
            raise FileFormatError(
                file,
                arg.line,
                f"{arg.text} has no value: give {what} after it (a pin that names nothing "
                "fetches whatever the default branch is)",
            )


def _check_value(
    rule: Callable[[str, object], str], kind: str, value: _Resolved, file: str, line: int
) -> None:
    """A resolved pin held to its rule (names.py); refused
    at the set() it came from when there was one."""
    if value.unresolved:
        # whatever the variable holds, git would read the value as an option
        if value.value.startswith("-"):
            raise FileFormatError(
                file,
                line,
                f"{kind} {value.value[:200]!r} starts with '-': git would read it as an "
                "option, whatever its unresolved variables hold",
            )
        return  # reported as unresolved, never fetched
    where = value.sources[-1] if len(value.sources) == 1 else (file, line)
    try:
        if not value.value:
            raise NameRefused(f"{kind} resolves to an empty value")
        rule(kind, value.value)
    except NameRefused as exc:
        via = f" (used by {file}:{line})" if where != (file, line) else ""
        raise FileFormatError(where[0], where[1], f"{exc}{via}") from None


def _option_values(
    options: dict[str, list[Arg]],
    key: str,
    scope: _Scope,
    chain: Sequence[_Definition],
    resolver: _Resolver,
) -> list[_Resolved]:
    if not options.get(key):
        return [_Resolved("", scope)]
    return resolver.resolve(";".join(a.text for a in options[key]), scope, chain)


def _submodules(
    options: dict[str, list[Arg]], scope: _Scope, chain: Sequence[_Definition], resolver: _Resolver
) -> tuple[list[str], tuple[str, ...]]:
    paths: list[str] = []
    unresolved: tuple[str, ...] = ()
    for arg in options.get("GIT_SUBMODULES", []):
        first = resolver.resolve(arg.text, scope, chain)[0]
        paths += [p for p in first.value.split(";") if p]
        unresolved += first.unresolved
    return paths, unresolved


def parse_tree(root: Path) -> list[DepRow]:
    """Every GIT_REPOSITORY/GIT_TAG pin of a vLLM tree:
    CMakeLists.txt, then each external project file.

    Variables set in the top-level CMakeLists.txt (e.g. CUTLASS_REVISION) reach every external
    project file; a file's own set()s shadow them. Errors name files relative to `root`.
    """
    root = Path(root)
    top = root / "CMakeLists.txt"
    # a FIFO or directory there is refused by read_text, not skipped as absent
    has_top = os.path.lexists(top)
    files = ([top] if has_top else []) + sorted((root / EXTERNAL_PROJECTS).glob("*.cmake"))
    if not files:
        raise FileFormatError(
            root,
            None,
            f"not a vLLM source tree: no CMakeLists.txt and no {EXTERNAL_PROJECTS}/*.cmake",
        )
    scans = [
        _scan(read_text(f, f.relative_to(root).as_posix()), f.relative_to(root).as_posix())
        for f in files
    ]
    return _rows(scans, scans[0].definitions if has_top else [])


def parse_cmake(text: str, file: str) -> list[DepRow]:
    """The pins of ONE cmake file on its own (no top-level variables reach it)."""
    return _rows([_scan(text, file)], [])


def _rows(scans: list[_FileScan], top_defs: list[_Definition]) -> list[DepRow]:
    resolver = _Resolver({k: v for scan in scans for k, v in scan.blocks.items()})
    rows: list[DepRow] = []
    for scan in scans:
        inherited = [] if scan.file == "CMakeLists.txt" else top_defs
        overrides = _overrides(scan)
        for fetch in scan.fetches:
            chain = [*inherited, *scan.definitions[: fetch.defs_before]]
            rows += _rows_for(fetch, scan.file, chain, resolver, overrides)
    return rows


def _overrides(scan: _FileScan) -> dict[str, str]:
    """{content name: the X_SRC_DIR variable} of the file's SOURCE_DIR-only declares."""
    overrides = {}
    for fetch in scan.fetches:
        name_arg, options = _options(fetch.command.args)
        if name_arg is not None and (variable := _override(options)) is not None:
            overrides[name_arg.text.lower()] = variable
    return overrides


# -- which rows a CUDA build fetches ---------------------------------------------------------------


def is_cuda_path(row: DepRow) -> bool:
    """False only when the row's condition selects ROCm/HIP
    (or excludes CUDA), evaluated for a CUDA build.

    Three-valued: `VLLM_GPU_LANG STREQUAL "HIP"`, `USE_ROCM`, `DEFINED ENV{ROCM_PATH}` are false on
    a CUDA build, `VLLM_GPU_LANG STREQUAL "CUDA"` is true, anything else (version checks, X_SRC_DIR
    overrides) is unknown and keeps the row on the CUDA path.
    """
    if not row.condition:
        return True
    return condition_on_cuda(row.condition) is not False


# -- fetch-deps.sh gate list ---------------------------------------------------------------------


def parse_gates(text: str, path: str) -> list[Gate]:
    """`gate NAME REPOSITORY TAG [SUBDIR...]` lines (backslash
    continuations joined); other bash is ignored."""
    gates = []
    for number, line in _logical_lines(check_utf8(text, path)):
        words = line.split()
        if not words or words[0] != "gate":
            continue
        try:
            args = shlex.split(line, comments=True)[1:]
        except ValueError as exc:
            raise FileFormatError(
                path, number, f"gate line does not parse as shell words ({exc}): {line.strip()!r}"
            ) from None
        if len(args) < 3:
            raise FileFormatError(
                path, number, f"gate needs NAME REPOSITORY TAG [SUBDIR...], found {line.strip()!r}"
            )
        if any("$" in a for a in args[:3]):
            raise FileFormatError(
                path,
                number,
                (
                    "gate arguments must be literal (the list is read without running bash), "
                    f"found {line.strip()!r}"
                ),
            )
        gates.append(
            Gate(name=args[0], repository=args[1], tag=args[2], subdirs=args[3:], line=number)
        )
    return gates


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each shell line, backslash continuations joined."""
    start, parts = 0, list[str]()
    for number, line in enumerate(text.splitlines(), 1):
        if not parts:
            start = number
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            parts.append(line.rstrip()[:-1])
            continue
        yield start, " ".join([*parts, line])
        parts = []
    if parts:
        yield start, " ".join(parts)


def _same_repository(a: str | None, b: str | None) -> bool:
    def norm(url: str | None) -> str:
        return (url or "").strip().rstrip("/").lower().removesuffix(".git")

    return norm(a) == norm(b)


def _change(
    old_repository: str | None, old_tag: str | None, new_repository: str | None, new_tag: str | None
) -> str:
    parts = []
    if old_tag != new_tag:
        parts.append(f"tag {old_tag} -> {new_tag}")
    if not _same_repository(old_repository, new_repository):
        parts.append(f"repository {old_repository} -> {new_repository}")
    return "; ".join(parts)


def diff_gates(rows: Sequence[DepRow], gates: Sequence[Gate]) -> GateDiff:
    """The tree's CUDA-path pins against fetch-deps.sh:
    names case-insensitive, repositories without .git."""
    by_name: dict[str, list[Gate]] = {}
    for gate in gates:
        by_name.setdefault(gate.name.lower(), []).append(gate)
    cuda_rows = [row for row in rows if is_cuda_path(row)]
    diff = GateDiff(added=[], moved=[], removed=[], ungated_cuda_pins=[], matched=[])
    for row in cuda_rows:
        same_name = by_name.get(row.name.lower(), [])
        exact = next(
            (
                g
                for g in same_name
                if g.tag == row.tag and _same_repository(g.repository, row.repository)
            ),
            None,
        )
        if exact is not None:
            diff.matched.append(GateMatch(row=row, gate=exact))
            continue
        diff.ungated_cuda_pins.append(row)
        if not same_name:
            diff.added.append(row)
            continue
        gate = next(
            (g for g in same_name if _same_repository(g.repository, row.repository)), same_name[0]
        )
        diff.moved.append(
            GateMove(
                name=row.name,
                old_repository=gate.repository,
                old_tag=gate.tag,
                new_repository=row.repository,
                new_tag=row.tag,
                gate_line=gate.line,
                row=row,
                change=_change(gate.repository, gate.tag, row.repository, row.tag),
            )
        )
    names = {row.name.lower() for row in cuda_rows}
    diff.removed = [gate for gate in gates if gate.name.lower() not in names]
    return diff


def _short(tag: str | None) -> str:
    return tag[:12] if tag and re.fullmatch(r"[0-9a-f]{40}", tag) else str(tag)


def _move_text(move: GateMove) -> str:
    if move.old_tag != move.new_tag and _same_repository(move.old_repository, move.new_repository):
        return f"{move.name} {_short(move.old_tag)} -> {_short(move.new_tag)}"
    if move.old_tag == move.new_tag:
        return f"{move.name} -> {move.new_repository}"
    return f"{move.name} -> {move.new_repository} @ {_short(move.new_tag)}"


def lineage_split(diff: GateDiff, gates: Sequence[Gate]) -> list[str] | None:
    """What changed when the tree moved EVERY pin of the gate list (none still matches a gate; the
    runbook's r39 moved every external cmake pin): the
    lineage split, not a re-sync. None otherwise."""
    if not gates or diff.matched or not diff.moved:
        return None
    changes = list(dict.fromkeys(_move_text(m) for m in diff.moved))
    changes += list(dict.fromkeys(f"+ {r.name}" for r in diff.added))
    moved_names = {m.name.lower() for m in diff.moved}
    changes += [f"- {g.name}" for g in diff.removed if g.name.lower() not in moved_names]
    return changes


def gated_finding(
    diff: GateDiff, gates: Sequence[Gate], *, gates_path: str, rev: str, new_dir: str
) -> Finding:
    """`cuda_pins_gated`: every CUDA-path pin has its
    gate; when every gate moved, a new lineage is suggested
    instead of a wall of ungated pins."""
    ungated = diff.ungated_cuda_pins
    if not ungated:
        return Finding(
            passed=True,
            description=f"all {len(diff.matched)} CUDA-path pins are gated by {gates_path}",
        )
    split = lineage_split(diff, gates)
    if split is not None:
        return Finding(
            passed=False,
            description=(
                f"every one of the {len(gates)} gated pins of {gates_path} moved "
                f"({', '.join(split)}): start a lineage, e.g. "
                f'[[jovian.lineages]] dir = "{new_dir}" from_rev = "{rev}" (its own '
                "versions.env, profiles/ and a "
                "fetch-deps.sh gate list re-synced from this tree's cmake)"
            ),
        )
    return Finding(
        passed=False,
        description=(
            f"CUDA-path pins with no {gates_path} gate: "
            + "; ".join(f"{r.name} {r.repository} {r.tag} ({r.file}:{r.line})" for r in ungated)
            + ". Re-sync the gate list from this tree's cmake."
        ),
    )


def diff_tables(previous_rows: Sequence[DepRow], rows: Sequence[DepRow]) -> TableDiff:
    """This rev's table against the previous rev's, matched by (name, condition)."""

    def keyed(table: Sequence[DepRow]) -> dict[tuple[str, str | None], list[DepRow]]:
        out: dict[tuple[str, str | None], list[DepRow]] = {}
        for row in table:
            out.setdefault((row.name.lower(), row.condition), []).append(row)
        return out

    before, after = keyed(previous_rows), keyed(rows)
    diff = TableDiff(added=[], moved=[], removed=[])
    for key in dict.fromkeys([*before, *after]):
        old, new = before.get(key, []), after.get(key, [])
        for a, b in zip(old, new, strict=False):  # extras on either side are added/removed below
            change = _change(a.repository, a.tag, b.repository, b.tag)
            if a.submodules != b.submodules:
                change = "; ".join(
                    filter(None, [change, f"submodules {a.submodules} -> {b.submodules}"])
                )
            if change:
                diff.moved.append(
                    TableMove(name=b.name, condition=b.condition, old=a, new=b, change=change)
                )
        diff.removed += old[len(new) :]
        diff.added += new[len(old) :]
    return diff


def to_rows_json(rows: Sequence[DepRow]) -> list[dict[str, object]]:
    """The table for the CLI and the asset metadata:
    name, repository, tag, submodules, condition, and the
    variables left unresolved (a row with any is never
    fetched: its `${VAR}` is kept in the value)."""
    return [
        {
            "name": r.name,
            "repository": r.repository,
            "tag": r.tag,
            "submodules": list(r.submodules),
            "condition": r.condition,
            "unresolved": list(r.unresolved),
        }
        for r in rows
    ]


def shown_variable(name: str) -> str:
    """An unresolved variable as cmake writes it: `${NOPE}`, `$ENV{MYSTERY_OWNER}`."""
    return f"${name}" if name.startswith("ENV{") else f"${{{name}}}"


def why_unresolved(row: DepRow) -> str:
    """`${T} (recursive: ...)`, `${NOPE} (set nowhere
    ...)`: each unresolved variable of a row and why."""
    return ", ".join(
        shown_variable(v)
        + (
            " (recursive: its only set() refers to itself)"
            if v in row.recursive
            else " (set nowhere that reaches this use)"
        )
        for v in row.unresolved
    )


def check_resolved(rows: Sequence[DepRow]) -> list[DepRow]:
    """`rows` when every pin resolved; else a FileFormatError
    at the first open row's FetchContent call."""
    for row in rows:
        if row.unresolved:
            raise FileFormatError(
                row.file,
                row.line,
                f"{row.name}: unresolved {why_unresolved(row)}: lockstep never "
                "fetches a pin it cannot read",
            )
    return list(rows)


def unresolved_finding(rows: Sequence[DepRow]) -> Finding:
    """Passes when every pin resolved; else names each
    `${VAR}` with its file:line (CUDA-path rows first)."""
    open_rows = sorted((r for r in rows if r.unresolved), key=lambda r: not is_cuda_path(r))
    if not open_rows:
        return Finding(
            passed=True, description=f"all {len(rows)} cmake pins resolved to literal values"
        )
    return Finding(
        passed=False,
        description="cmake pins with unresolved variables (never fetched, never gated): "
        + "; ".join(
            f"{r.file}:{r.line}: {r.name} "
            + ", ".join(shown_variable(v) for v in r.unresolved)
            + ("" if is_cuda_path(r) else f" (only when {r.condition})")
            for r in open_rows
        ),
    )
