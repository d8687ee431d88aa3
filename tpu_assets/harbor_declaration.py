"""How the consumer's pyproject.toml declares harbor,
and the one edit a runtime pin (or its release) makes.

Two shapes are in the field, and uv re-locks both the same way (`uv lock --upgrade-package harbor`):
- a PEP 508 direct reference that names a branch, as OpenThoughts-Agent has it
  (`"harbor[daytona] @ git+https://github.com/marin-community/harbor.git@main"` in
  `[project].dependencies`, open-thoughts/OpenThoughts-Agent pyproject.toml at 53265d2f); uv locks
  it as `git = "...?rev=main#<sha>"`, since a PEP 508 `@ref` may be a branch, a tag or a commit;
- a `[tool.uv.sources]` git entry with `branch = "..."` (uv locks `?branch=`).
When both are present uv resolves from `[tool.uv.sources]` (uv 0.9), so lockstep reads that one.

The pyproject is the consumer's, so everything read here is untrusted: the URL is only compared with
the site's `[tpu].harbor_repo` and written back, never handed to git; the ref is checked as a git
ref name before anything asks a remote about it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from resources.errors import FileFormatError
from resources.model import Model
from resources.reader import read_text
from resources.secrets import redact
from resources.tomlfile import key_line

PYPROJECT = "pyproject.toml"
# Where a PEP 508 requirement naming harbor may sit:
# the project's dependencies, its extras, uv's groups.
_REQUIREMENT_TABLES = (
    ("project", "dependencies"),
    ("project", "optional-dependencies"),
    ("dependency-groups",),
)
_SOURCES = ("tool", "uv", "sources")


class HarborDeclaration(Model):
    """Where and how pyproject.toml declares the harbor package."""

    shape: Literal["direct_reference", "uv_source"]
    line: int | None = None
    url: str
    ref_kind: Literal["branch", "rev", "tag"] | None = None
    ref: str | None = None
    written: str = ""

    @property
    def where(self) -> str:
        return f"{PYPROJECT}:{self.line}" if self.line else PYPROJECT

    def following(self, branch: str) -> str:
        """What to write so this declaration follows `branch` (the fix a refusal names)."""
        if self.shape == "direct_reference":
            return f'"{_with_ref(self.written, self.url, branch)}"'
        return f'branch = "{branch}" in [tool.uv.sources] (not rev or tag)'


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _doc(text: str) -> Any:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise FileFormatError(
            PYPROJECT, getattr(exc, "line", None), f"not valid TOML: {exc}"
        ) from None


def _line_of(text: str, needle: str) -> int | None:
    return next((n for n, line in enumerate(text.splitlines(), 1) if needle in line), None)


def split_vcs_url(url: str) -> tuple[str, str | None]:
    """`git+URL@ref#fragment` -> (URL, ref). The ref
    follows the last '@' of the URL's PATH, as pip and
    uv read it: `git+ssh://git@host/x.git@main` keeps
    `git@host` as the netloc, `.../h.git@a/b` is ref `a/b`."""
    base = url.removeprefix("git+").partition("#")[0]
    parts = urlsplit(base)
    if "@" not in parts.path:
        return base, None
    path, ref = parts.path.rsplit("@", 1)
    return parts._replace(path=path).geturl(), ref or None


def _with_ref(requirement: str, url: str, ref: str) -> str:
    """`requirement` with its direct reference's ref
    replaced by `ref`; every other character kept."""
    from packaging.requirements import Requirement

    old = Requirement(requirement).url or ""
    fragment = old.partition("#")[1] + old.partition("#")[2]
    return requirement.replace(old, f"git+{url}@{ref}{fragment}", 1)


def _requirement_items(doc: Any) -> list[tuple[Any, int]]:
    """Every (array, index) of a dependency list in the tables a requirement may sit in."""
    found: list[tuple[Any, int]] = []
    for path in _REQUIREMENT_TABLES:
        node: Any = doc
        for key in path:
            node = node.get(key) if hasattr(node, "get") else None
        if node is None:
            continue
        arrays = list(node.values()) if hasattr(node, "values") else [node]
        for array in arrays:
            if isinstance(array, list):
                found += [(array, i) for i, item in enumerate(array) if isinstance(item, str)]
    return found


def _harbor_references(doc: Any, package: str) -> list[tuple[Any, int, Any]]:
    """(array, index, Requirement) of every requirement on `package` that carries a URL."""
    from packaging.requirements import InvalidRequirement, Requirement

    refs = []
    for array, i in _requirement_items(doc):
        try:
            req = Requirement(str(array[i]))
        except InvalidRequirement:
            continue  # not ours to judge: uv reports a bad requirement itself
        if _normalize(req.name) == _normalize(package) and req.url:
            refs.append((array, i, req))
    return refs


def read_declaration(text: str, package: str) -> HarborDeclaration:
    """How pyproject.toml `text` declares `package`;
    a FileFormatError naming the line when it is not a
    git source lockstep can follow or pin."""
    doc = _doc(text)
    source = doc.get("tool", {}).get("uv", {}).get("sources", {}).get(package)
    if source is not None:
        if not isinstance(source, dict) or "git" not in source:
            raise FileFormatError(
                PYPROJECT,
                key_line(text, _SOURCES, package),
                f"[tool.uv.sources] {package} is not a git source (got {redact(str(source))!r}): "
                "lockstep re-locks "
                f'a git source that follows a branch, e.g. {package} = {{ git = "<harbor repo>", '
                'branch = "<branch>" }',
            )
        kinds = [k for k in ("branch", "rev", "tag") if k in source]
        kind = kinds[0] if len(kinds) == 1 else None
        return HarborDeclaration(
            shape="uv_source",
            line=key_line(text, _SOURCES, package),
            url=str(source["git"]),
            ref_kind=kind,
            ref=str(source[kind]) if kind else None,
            written=f"{package} = {redact(str(dict(source)))}",
        )
    refs = _harbor_references(doc, package)
    if not refs:
        raise FileFormatError(
            PYPROJECT,
            None,
            f"{package} is declared neither as a git direct reference in [project].dependencies "
            f'(e.g. "{package}[daytona] @ git+<harbor repo>@<branch>") nor as a git source in '
            "[tool.uv.sources]: "
            "lockstep re-locks and pins a git dependency that follows a branch",
        )
    urls = {req.url for _, _, req in refs}
    if len(urls) > 1:
        lines = ", ".join(str(_line_of(text, str(a[i])) or "?") for a, i, _ in refs)
        raise FileFormatError(
            PYPROJECT,
            _line_of(text, str(refs[1][0][refs[1][1]])),
            (
                f"{package} is declared with {len(urls)} different URLs (lines {lines}): keep "
                "one, so the lock has one"
            ),
        )
    array, i, req = refs[0]
    if not req.url.startswith("git+"):
        raise FileFormatError(
            PYPROJECT,
            _line_of(text, str(array[i])),
            f"{package} is a direct reference to {redact(req.url)!r}, not a git repository: write "
            f'"{package}[daytona] @ git+<harbor repo>@<branch>"',
        )
    url, ref = split_vcs_url(req.url)
    return HarborDeclaration(
        shape="direct_reference",
        line=_line_of(text, str(array[i])),
        url=url,
        ref_kind="rev" if ref else None,
        ref=ref,
        written=redact(str(array[i])),
    )


def set_declared_ref(
    text: str, package: str, *, rev: str | None = None, branch: str | None = None
) -> str:
    """pyproject.toml `text` with `package` pinned to the commit `rev`, or following `branch`, in
    the shape it is declared in: a direct reference gets `@<rev or
    branch>`; a [tool.uv.sources] entry `rev = "..."` or
    `branch = "..."`. tomlkit keeps every other byte; the URL and extras stay as they are."""
    import tomlkit

    assert (rev is None) != (branch is None)
    # refuses a shape that cannot be edited, naming the line
    declared = read_declaration(text, package)
    ref = rev or branch
    assert ref is not None
    if declared.shape == "uv_source":
        edited = _set_source_ref(text, package, "rev" if rev else "branch", ref)
        now = read_declaration(edited, package)
        if (now.ref_kind, now.ref) != ("rev" if rev else "branch", ref):
            raise FileFormatError(
                PYPROJECT,
                declared.line,
                f"[tool.uv.sources] {package} names no branch, rev or tag "
                f"to re-point at {ref}: declare the branch it follows, e.g. "
                f'{package} = {{ git = "<harbor repo>", branch = "<branch>" }}',
            )
        return edited
    doc = _doc(text)
    for array, i, req in _harbor_references(doc, package):
        old = array[i]
        url, _ = split_vcs_url(req.url)
        new = _with_ref(str(old), url, ref)
        kind = getattr(old, "type", None)
        array[i] = tomlkit.string(new, literal=bool(kind and kind.is_literal()))
    return tomlkit.dumps(doc)


_REF_ASSIGNMENT = re.compile(r"""\b(?:branch|rev|tag)(\s*=\s*)(?:"[^"\n]*"|'[^'\n]*')""")


def _set_source_ref(text: str, package: str, key: str, ref: str) -> str:
    """`text` with the one `branch`/`rev`/`tag` of
    [tool.uv.sources] `package` replaced by `key = "ref"`.

    Edited as text on its line, not through tomlkit: tomlkit re-spaces an inline table whose key it
    deletes and re-adds, and this must change nothing but the ref."""
    lines = text.splitlines(keepends=True)
    number = key_line(text, _SOURCES, package)  # the inline table's line
    # written as [tool.uv.sources.<package>]
    if number is None or not _REF_ASSIGNMENT.search(lines[number - 1]):
        number = next(
            (n for k in ("branch", "rev", "tag") if (n := key_line(text, (*_SOURCES, package), k))),
            None,
        )
    if number is None or not _REF_ASSIGNMENT.search(lines[number - 1]):
        return text  # no ref to replace: the caller's re-read says so
    lines[number - 1] = _REF_ASSIGNMENT.sub(
        lambda m: f'{key}{m.group(1)}"{ref}"', lines[number - 1], count=1
    )
    return "".join(lines)


def read_pyproject(path: Path) -> str:
    """The checkout's pyproject.toml as text; a missing file is refused naming it."""
    if not path.exists():  # a directory or FIFO there is refused by the reader, naming what it is
        raise FileFormatError(
            PYPROJECT, None, "the consumer repo has no pyproject.toml: uv.lock is made from it"
        )
    return read_text(path, PYPROJECT)
