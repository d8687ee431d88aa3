"""Every dependency at its pin, through the shared object cache, with its gitlinks really populated.

The scar (twice: build death): a clone materializes a vendored gitlink as an EMPTY directory, and a
`[ -d ]` check passes on it. Here a gitlink counts as populated only when it holds a `.git` (its own
checkout) or a checked-out tree.

A dependency's `.gitmodules` is someone else's file: it is read by git's own config parser
(`git config --file - --list -z`, no includes), so lockstep sees exactly the path and url that
`git submodule` would (quoting, comments, escapes; a `%` in a URL is just a character), and each url
and path is checked before it becomes a fetch or a directory. Every directory written here is
resolved under its root first (names.under).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path, PurePosixPath

from pydantic import Field

from jovian_assets.inputs import check_utf8, path_under, read_text
from jovian_assets.models import DepTree, Finding
from resources.errors import FileFormatError, LockstepError
from resources.git import SHA_RE, GitRemotes
from resources.model import Model
from resources.names import KNOWN_SCHEMES, NameRefused, check_relative_path, check_url

MAX_DEPTH = 4
_GIT_CONFIG_TIMEOUT_S = 30.0
_BAD_LINE = re.compile(r"bad config line (\d+)")
_HEADER = re.compile(r'^\s*\[\s*submodule\s+"((?:[^"\\]|\\.)*)"\s*\]', re.IGNORECASE)


class Submodule(Model):
    """One `[submodule "name"]` of a .gitmodules: its path in the tree and its url as written."""

    name: str
    path: str | None = None
    url: str | None = None


def _git_config_list(text: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "config", "--no-includes", "--file", "-", "--list", "-z"],
        input=text.encode("utf-8"),
        capture_output=True,
        timeout=_GIT_CONFIG_TIMEOUT_S,
        check=False,
    )


def _bad_line(text: str, stderr: str) -> int | None:
    """The line git refused. git counts the newline that ends a broken line before it notices (an
    unclosed `[submodule "x"` is reported on the NEXT
    line), so the line before is tried on its own."""
    bad = _BAD_LINE.search(stderr)
    if bad is None:
        return None
    line = int(bad.group(1))
    if (
        line > 1
        and _git_config_list("\n".join(text.splitlines()[: line - 1]) + "\n").returncode != 0
    ):
        return line - 1
    return line


def read_gitmodules(text: str, path: str) -> list[Submodule]:
    """The submodules of a `.gitmodules`, as git reads it;
    a line git refuses is a FileFormatError at that line."""
    proc = _git_config_list(check_utf8(text, path))
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        line = _bad_line(text, stderr)
        lines = text.splitlines()
        shown = lines[line - 1].strip() if line and line <= len(lines) else stderr
        raise FileFormatError(path, line, f"git cannot read this line of a .gitmodules: {shown!r}")
    found: dict[str, Submodule] = {}
    for entry in proc.stdout.decode("utf-8").split("\0"):
        key, _, value = entry.partition("\n")
        section, _, rest = key.partition(".")
        name, _, option = rest.rpartition(".")
        if section != "submodule" or not name or option not in ("path", "url"):
            continue
        setattr(found.setdefault(name, Submodule(name=name)), option, value)
    return list(found.values())


def _line_of(text: str, name: str, option: str) -> int | None:
    """The line of `option = ...` inside `[submodule "name"]` (the last one wins, as in git)."""
    current, hit = None, None
    for number, line in enumerate(text.splitlines(), 1):
        if header := _HEADER.match(line):
            current = header.group(1).replace('\\"', '"').replace("\\\\", "\\")
        elif current == name and re.match(rf"^\s*{option}\s*=", line, re.IGNORECASE):
            hit = number
    return hit


def relative_submodule_url(parent_url: str, url: str) -> str:
    """A `./` or `../` submodule url resolved against the parent's URL the way git resolves it: each
    `../` drops one component of the parent (after a `/`, or the `:` of scp-like `host:path`).

    Not urljoin: it leaves a relative url unresolved under a scheme it does not know as hierarchical
    (`ssh://`, `git://`), so a vLLM fork served over ssh would lose its vendored cutlass."""
    base, rest, sep = parent_url.rstrip("/"), url, "/"
    scheme = base.find("://")
    # Under a scheme only the path's `/`s separate components; the host (and its :port) stays.
    # no path: len(base)
    floor = (base.find("/", scheme + 3) % (len(base) + 1)) if scheme >= 0 else 0
    while rest.startswith(("./", "../")):
        if rest.startswith("./"):
            rest = rest[2:]
            continue
        rest = rest[3:]
        cut = base.rfind("/") if scheme >= 0 else max(base.rfind("/"), base.rfind(":"))
        if cut < max(floor, 1):
            return url  # above the host: unresolvable, and check_url refuses it naming the line
        base, sep = base[:cut], base[cut]
    return f"{base}{sep}{rest}"


def submodule_urls(
    gitmodules_text: str, parent_url: str, path: str = ".gitmodules"
) -> dict[str, str]:
    """`.gitmodules` path -> absolute URL (relative
    URLs resolve against the parent's URL, as git does).

    Each url must be a git URL of a known scheme (never an option, `ext::` or a bare path) and each
    path a relative path inside the tree: otherwise FileFormatError names the line and the value."""
    urls = {}
    for sub in read_gitmodules(gitmodules_text, path):
        if sub.path is None or sub.url is None:
            continue
        url = sub.url
        if url.startswith(("./", "../")):
            url = relative_submodule_url(parent_url, url)
        try:
            check_relative_path(f"submodule {sub.name!r} path", sub.path)
        except NameRefused as exc:
            raise FileFormatError(
                path, _line_of(gitmodules_text, sub.name, "path"), str(exc)
            ) from None
        try:
            check_url(f"submodule {sub.name!r} url", url, KNOWN_SCHEMES)
        except NameRefused as exc:
            raise FileFormatError(
                path, _line_of(gitmodules_text, sub.name, "url"), str(exc)
            ) from None
        urls[sub.path] = url
    return urls


class CacheUse(Model):
    """What one dependency took from the shared cache, over every mirror it used (its own and its
    gitlinks', which may be another dependency's): bytes fetched, and what each held before."""

    fetched: int = 0
    # mirror URL -> bytes it held when this dependency first used it
    held_before: dict[str, int] = Field(default_factory=dict)

    def record(self, url: str, before: int, after: int) -> None:
        self.fetched += max(after - before, 0)
        self.held_before.setdefault(url, before)


def populate(
    git: GitRemotes, *, url: str, sha: str, dest: Path, depth: int = 0, use: CacheUse | None = None
) -> dict[str, str]:
    """Check out `sha` of `url` at `dest` and, recursively, every gitlink at the commit its parent
    records. Returns {gitlink path relative to the top dest:
    commit}. A gitlink that cannot be fetched stays an
    empty directory, for the check to name. `use` adds up what each fetch brought into the cache."""
    before = git.mirror_bytes(url=url)
    try:
        git.materialize(url=url, sha=sha, dest=dest)
        links = git.gitlinks(url=url, sha=sha)
    finally:
        if use is not None:
            use.record(url, before, git.mirror_bytes(url=url))
    if not links or depth >= MAX_DEPTH:
        return links
    gitmodules = dest / ".gitmodules"
    urls = (
        submodule_urls(read_text(gitmodules), url, str(gitmodules))
        if os.path.lexists(gitmodules)
        else {}
    )
    found: dict[str, str] = {}
    for path, commit in links.items():
        found[path] = commit
        sub_url = urls.get(path)
        if sub_url is None:
            continue
        sub_dest = path_under(dest, *PurePosixPath(path).parts, kind="gitlink path part")
        try:
            nested = populate(git, url=sub_url, sha=commit, dest=sub_dest, depth=depth + 1, use=use)
        except FileFormatError:
            raise  # a refused .gitmodules deeper down is named, not left as an empty dir
        except LockstepError:
            continue  # left empty: gitlinks_populated names it
        found.update({f"{path}/{p}": c for p, c in nested.items()})
    return found


def gitlink_states(root: Path, gitlinks: dict[str, str]) -> dict[str, str]:
    """Each gitlink path -> 'checkout' (.git present),
    'tree' (files present) or 'EMPTY' / 'MISSING'."""
    states = {}
    for path in gitlinks:
        where = root / path
        if (where / ".git").exists():
            states[path] = "checkout"
        elif where.is_dir() and any(where.iterdir()):
            states[path] = "tree"
        else:
            states[path] = "EMPTY" if where.is_dir() else "MISSING"
    return states


def gitlinks_populated(trees: list[DepTree]) -> Finding:
    """Every gitlink of every dep tree holds a .git or
    a checked-out tree; an empty directory fails."""
    bad: list[str] = []
    total = 0
    for tree in trees:
        if tree.path is None:
            continue
        states = gitlink_states(Path(tree.path), tree.gitlinks)
        total += len(states)
        bad += [
            f"{tree.name}/{p} is {s} (gitlink {tree.gitlinks[p][:12]})"
            for p, s in states.items()
            if s in ("EMPTY", "MISSING")
        ]
    if bad:
        return Finding(
            passed=False,
            description=(
                "gitlinks not populated (an empty dir passes `[ -d ]` and dies in the build): "
            )
            + "; ".join(bad),
        )
    return Finding(
        passed=True, description=f"all {total} gitlinks hold a .git or a checked-out tree"
    )


def resolve_pin(git: GitRemotes, repository: str, tag: str) -> str:
    """A cmake GIT_TAG as a commit: a full sha as is, else the tag (or branch) on the remote."""
    if SHA_RE.match(tag):
        return tag
    commit = git.ls_remote_tag(url=repository, tag=tag) or git.ls_remote(url=repository, branch=tag)
    if commit is None:
        raise LockstepError(f"{tag!r} is neither a tag nor a branch of {repository}")
    return commit


def fetch_dep(git: GitRemotes, *, name: str, repository: str, tag: str, dest: Path) -> DepTree:
    """One dependency at its pin, with bytes fetched (its
    gitlinks' too) vs already in the shared cache."""
    tree = DepTree(name=name, repository=repository, tag=tag, commit=None, path=None)
    use = CacheUse()
    try:
        commit = resolve_pin(git, repository, tag)
        tree.gitlinks = populate(git, url=repository, sha=commit, dest=dest, use=use)
        tree.commit, tree.path = commit, str(dest)
    except LockstepError as exc:
        tree.error = str(exc)
    tree.bytes_fetched = use.fetched
    tree.bytes_reused = sum(use.held_before.values())
    return tree
