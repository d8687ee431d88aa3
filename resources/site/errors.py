"""How the site file's validation errors read:
``site.toml:LINE: [table] key: what is wrong (got VALUE)``.

pydantic reports every field error of a file at once; each renders here as a `SiteProblem` with the
line of the key at fault (resources/tomlfile.py finds it), the table and key as a person finds them,
and a hint where one helps (the key a typo meant; where a secret goes instead). A value is shown
only when its key does not name a secret, and always through `redact`.

`load_site` raises the one problem `first_problem` picks; `lockstep site check` lists them all
(`problems_of`), with the problems a cross-key rule found after its first (`KeyRefused.others`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from resources.errors import FileFormatError
from resources.model import Model
from resources.names import NameRefused
from resources.secrets import redact
from resources.site.rules import KeyRefused
from resources.tomlfile import SECRET_KEY, key_line

# One pydantic error, as `ValidationError.errors()` lists them.
ErrorDetails = dict[str, Any]


class SiteProblem(Model):
    """One thing wrong with a site file: where (file, line, table, key) and what (the message)."""

    file: str
    line: int | None = None
    # as in the message: "[tpu]", "[[spark.nodes]] #2"; None: the file as a whole
    table: str | None = None
    key: str | None = None  # None: the table as a whole (a missing table, a rule over the table)
    message: str  # what `site.toml:LINE: ` is followed by: "[tpu] image: required key is missing"

    def error(self) -> FileFormatError:
        return FileFormatError(self.file, self.line, self.message)

    @classmethod
    def of(
        cls, exc: FileFormatError, *, table: str | None = None, key: str | None = None
    ) -> SiteProblem:
        return cls(file=exc.path, line=exc.line, table=table, key=key, message=exc.message)

    def __str__(self) -> str:
        return str(self.error())


def first_problem(errors: Sequence[ErrorDetails], path: Path, text: str) -> SiteProblem:
    """The one problem a load reports."""
    # A misspelt key is both unknown and (as the key
    # it should be) missing: name the one in the file.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    return render(err, errors, path, text)


def problems_of(errors: Sequence[ErrorDetails], path: Path, text: str) -> list[SiteProblem]:
    """Every problem in `errors`, in the file's order;
    a key a typo meant is not also reported missing."""
    expanded: list[ErrorDetails] = []
    for err in errors:
        expanded.append(err)
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, KeyRefused):
            expanded += [
                {**err, "msg": f"Value error, {other}", "ctx": {**err["ctx"], "error": other}}
                for other in cause.others
            ]
    meant = {
        e["loc"][:-1] + (close,)
        for e in errors
        if e["type"] == "extra_forbidden" and (close := _meant(e, errors))
    }
    problems: list[SiteProblem] = []
    for err in expanded:
        if err["type"] == "missing" and tuple(err["loc"]) in meant:
            continue
        problem = render(err, errors, path, text)
        if problem not in problems:  # e.g. one key failing both arms of a union
            problems.append(problem)
    return sorted(problems, key=lambda p: p.line or 0)


def table_name(table: tuple[str, ...]) -> str:
    """`("spark", "nodes", "1")` -> `[[spark.nodes]] #2`, as a person finds it in the file."""
    if table and table[-1].isdigit():
        return f"[[{'.'.join(p for p in table[:-1] if not p.isdigit())}]] #{int(table[-1]) + 1}"
    return f"[{'.'.join(p for p in table if not p.isdigit())}]"


def line_of(text: str, loc: tuple[str, ...]) -> int | None:
    """The line of the key at `loc`; failing that (an inline table, a dotted key), of the nearest
    enclosing key or table header that is in the file."""
    for n in range(len(loc), 0, -1):
        table, key = loc[: n - 1], loc[n - 1]
        if (line := key_line(text, table, key)) is not None:
            return line
    return None


def _meant(err: ErrorDetails, errors: Sequence[ErrorDetails]) -> str | None:
    """For an unknown key: the missing key of the same table it is closest to (a typo), if any."""
    missing = [
        str(e["loc"][-1])
        for e in errors
        if e["type"] == "missing" and e["loc"][:-1] == err["loc"][:-1]
    ]
    close = difflib.get_close_matches(str(err["loc"][-1]), missing, n=1)
    return close[0] if close else None


def render(err: ErrorDetails, errors: Sequence[ErrorDetails], path: Path, text: str) -> SiteProblem:
    """One pydantic error as a person reads it. `errors`:
    all of the file's (a typo's hint looks there)."""
    file = str(path)
    raw = list(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, KeyRefused):  # a rule over several keys names the key to fix
        raw += list(cause.key)
    # an item of a value list: point at the list's key
    while len(raw) > 1 and isinstance(raw[-1], int):
        raw.pop()
    loc = tuple(str(p) for p in raw)
    msg = redact(err["msg"].removeprefix("Value error, "))
    whole_table = (
        not cause.key
        if isinstance(cause, KeyRefused)
        else isinstance(err.get("input"), dict)
        and err["type"] not in ("missing", "extra_forbidden")
    )
    if whole_table:
        # A rule over a whole table (a model validator): point at the table's header, not at a key.
        table = table_name(loc) if loc else None
        return SiteProblem(
            file=file,
            line=line_of(text, loc) or 1,
            table=table,
            message=f"{table or 'site file'}: {msg}",
        )
    parent, key = loc[:-1], loc[-1] if loc else None
    # A key (or table) missing from a table that is not
    # in the file either: the file as a whole, line 1.
    line = line_of(text, loc) or 1
    if parent:
        table, dotted = table_name(parent), f"{table_name(parent)} {key}"
    elif err["type"] == "missing":  # a required table
        table, key, dotted = f"[{key}]", None, f"[{key}]"
    else:
        table, dotted = None, str(key)

    def problem(message: str) -> SiteProblem:
        return SiteProblem(
            file=file, line=line, table=table, key=key, message=f"{dotted}: {message}"
        )

    if err["type"] == "extra_forbidden":
        close = _meant(err, errors)
        hint = (
            f" (did you mean {close}?)"
            if close
            else (
                " (not a key of this table: check the spelling, and that it sits under the "
                "right [table] header)"
            )
        )
        if key and SECRET_KEY.search(key):
            hint = (
                " (secrets are never stored in the site file: put the NAME of an environment "
                f"variable in {key}_env)"
            )
        return problem(f"unknown key{hint}")
    if err["type"] == "missing":
        return problem(f"required {'key' if parent else 'table'} is missing")
    secretish = key is not None and (key.endswith("_env") or SECRET_KEY.search(key) is not None)
    # The name rules and the cross-key rules show the value in their own words.
    says_value = isinstance(cause, NameRefused | KeyRefused)
    shown = "" if secretish or says_value else f" (got {redact(repr(err.get('input')))})"
    return problem(f"{msg}{shown}")
