"""Every dependency at its pin, through the shared object cache, with its gitlinks really populated.

The scar (twice: build death): a clone materializes a vendored gitlink as an EMPTY directory, and a
`[ -d ]` check passes on it. Here a gitlink counts as populated only when it holds a `.git` (its own
checkout) or a checked-out tree.
"""

from __future__ import annotations

import configparser
from pathlib import Path
from urllib.parse import urljoin

from jovian_assets.models import DepTree, Finding
from resources.errors import LockstepError
from resources.git import SHA_RE, GitRemotes

GITLINKS_POPULATED = "gitlinks_populated"
MAX_DEPTH = 4


def submodule_urls(gitmodules_text: str, parent_url: str) -> dict[str, str]:
    """`.gitmodules` path -> absolute URL (relative URLs resolve against the parent's URL, as git does)."""
    parser = configparser.ConfigParser()
    parser.read_string(gitmodules_text)
    urls = {}
    for section in parser.sections():
        if section.startswith("submodule") and parser.has_option(section, "path") and parser.has_option(section, "url"):
            url = parser.get(section, "url")
            if url.startswith(("./", "../")):
                url = urljoin(parent_url.rstrip("/") + "/", url)
            urls[parser.get(section, "path")] = url
    return urls


def populate(git: GitRemotes, *, url: str, sha: str, dest: Path, depth: int = 0) -> dict[str, str]:
    """Check out `sha` of `url` at `dest` and, recursively, every gitlink at the commit its parent records.
    Returns {gitlink path relative to the top dest: commit}. A gitlink that cannot be fetched stays an
    empty directory, for the check to name."""
    git.materialize(url=url, sha=sha, dest=dest)
    links = git.gitlinks(url=url, sha=sha)
    if not links or depth >= MAX_DEPTH:
        return links
    gitmodules = dest / ".gitmodules"
    urls = submodule_urls(gitmodules.read_text(encoding="utf-8"), url) if gitmodules.exists() else {}
    found: dict[str, str] = {}
    for path, commit in links.items():
        found[path] = commit
        sub_url = urls.get(path)
        if sub_url is None:
            continue
        try:
            nested = populate(git, url=sub_url, sha=commit, dest=dest / path, depth=depth + 1)
        except LockstepError:
            continue  # left empty: gitlinks_populated names it
        found.update({f"{path}/{p}": c for p, c in nested.items()})
    return found


def gitlink_states(root: Path, gitlinks: dict[str, str]) -> dict[str, str]:
    """Each gitlink path -> 'checkout' (.git present), 'tree' (files present) or 'EMPTY' / 'MISSING'."""
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
    """Every gitlink of every dep tree holds a .git or a checked-out tree; an empty directory fails."""
    bad: list[str] = []
    total = 0
    for tree in trees:
        if tree.path is None:
            continue
        states = gitlink_states(Path(tree.path), tree.gitlinks)
        total += len(states)
        bad += [f"{tree.name}/{p} is {s} (gitlink {tree.gitlinks[p][:12]})" for p, s in states.items() if s in ("EMPTY", "MISSING")]
    if bad:
        return Finding(passed=False, description="gitlinks not populated (an empty dir passes `[ -d ]` and dies in the build): " + "; ".join(bad))
    return Finding(passed=True, description=f"all {total} gitlinks hold a .git or a checked-out tree")


def resolve_pin(git: GitRemotes, repository: str, tag: str) -> str:
    """A cmake GIT_TAG as a commit: a full sha as is, else the tag (or branch) on the remote."""
    if SHA_RE.match(tag):
        return tag
    commit = git.ls_remote_tag(url=repository, tag=tag) or git.ls_remote(url=repository, branch=tag)
    if commit is None:
        raise LockstepError(f"{tag!r} is neither a tag nor a branch of {repository}")
    return commit


def fetch_dep(git: GitRemotes, *, name: str, repository: str, tag: str, dest: Path) -> DepTree:
    """One dependency at its pin, with bytes fetched vs already in the shared cache."""
    tree = DepTree(name=name, repository=repository, tag=tag, commit=None, path=None)
    before = git.mirror_bytes(url=repository)
    try:
        commit = resolve_pin(git, repository, tag)
        tree.gitlinks = populate(git, url=repository, sha=commit, dest=dest)
        tree.commit, tree.path = commit, str(dest)
    except LockstepError as exc:
        tree.error = str(exc)
    after = git.mirror_bytes(url=repository)
    tree.bytes_fetched = max(after - before, 0)
    tree.bytes_reused = before
    return tree
