"""Names from outside — revs, branches, tags, node
names, URLs, path parts — checked where they enter.

A lab's lock, a vLLM tree's cmake files, a site file and a registry's answer are written by other
people. Whatever they name becomes a partition key, a file name, a git argument or a word on a
node's command line, so each kind has one strict rule here, and every parser and loader applies it
before the value goes anywhere. The checks raise `NameRefused` (a ValueError, so pydantic reports
it with the file's line); callers add the file and line.

Branch and tag names follow git's own rules (git-check-ref-format(1)), written out here because a
`git check-ref-format` process per name would cost every site load and sensor tick a fork; the
tests hold this rule to the real git's answer on every hostile name.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

# A rev, a node name, a build-dir part: starts with a letter or digit, at most 64 characters.
# \Z: `$` also matches before a final newline
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# a user or job name part of an iris /<user>/<name>
IRIS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*\Z")

# Transports git may use for any URL lockstep hands it. `ext::` runs a command and `fd::` reads a
# file descriptor: never. A site narrows this further with `[site] url_schemes`.
KNOWN_SCHEMES = frozenset({"https", "http", "ssh", "git", "file"})
DEFAULT_SCHEMES = ("https", "ssh")
# scp-like ssh syntax: `git@github.com:org/repo.git` (no `://`, a colon before the first slash).
_SCP = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9.-]*:(?!//)[^\s]+$")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://[^\s]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


class NameRefused(ValueError):
    """A name from outside broke its rule. The message says which rule and shows the value."""


def _text(kind: str, value: object) -> str:
    if not isinstance(value, str):
        raise NameRefused(f"{kind} must be text, got {type(value).__name__} {value!r}")
    return value


def check_name(kind: str, value: object) -> str:
    """A rev (`r35`), node name or path part: `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`, and no `..`."""
    text = _text(kind, value)
    if not NAME.match(text) or ".." in text:
        raise NameRefused(
            f"{kind} {text!r} is not a plain name: letters, digits, '.', '_', '-', starting with "
            "a letter "
            "or digit, at most 64 characters, no '..' (it becomes a file name and a partition key)"
        )
    return text


def check_ref(kind: str, value: object) -> str:
    """A branch or tag name as git accepts it after
    `refs/heads/` (git-check-ref-format --branch)."""
    text = _text(kind, value)
    why = ref_problem(text)
    if why:
        raise NameRefused(f"{kind} {text!r} is not a valid git ref name: {why}")
    return text


def ref_problem(name: str) -> str | None:
    """Why git would refuse `name` as a branch, or None.
    git-check-ref-format(1), rules 1-10 and --branch."""
    if not name:
        return "it is empty"
    if name.startswith("-"):
        return "it starts with '-' (git would read it as an option)"
    if name.startswith("refs/"):
        return "give the short name (e.g. 'main'), not 'refs/...'"
    if _REF_FORBIDDEN.search(name):
        return "it holds a space, a control character or one of ~ ^ : ? * [ \\"
    if ".." in name or "@{" in name or name == "@":
        return "it holds '..' or '@{', or is '@'"
    if name.startswith("/") or name.endswith("/") or "//" in name:
        return "it starts or ends with '/', or holds '//'"
    if name.endswith("."):
        return "it ends with '.'"
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"its part {part!r} starts with '.' or ends with '.lock'"
    return None


def url_scheme(url: str) -> str | None:
    """`https` for https://..., `ssh` for ssh:// and scp-like `git@host:path`, else None."""
    if m := _URL.match(url):
        return m.group(1).lower()
    if _SCP.match(url):
        return "ssh"
    return None


def check_url(kind: str, value: object, schemes: Collection[str] = KNOWN_SCHEMES) -> str:
    """A git remote URL whose transport is one of
    `schemes`; never an option, `ext::` or a bare path."""
    text = _text(kind, value)
    if not text:
        raise NameRefused(
            f"{kind} is empty: give the repository's URL (e.g. https://github.com/org/repo.git)"
        )
    if text.startswith("-"):
        raise NameRefused(f"{kind} {text!r} starts with '-': git would read it as an option")
    if _CONTROL.search(text) or any(c.isspace() for c in text):
        raise NameRefused(f"{kind} {text!r} holds whitespace or a control character")
    if "::" in text.split("/", 1)[0]:
        raise NameRefused(
            f"{kind} {text!r} names a git remote helper ('<transport>::'), which may run commands"
        )
    if why := _login_problem(text):
        raise NameRefused(f"{kind} {text!r}: {why}")
    scheme = url_scheme(text)
    if scheme is None:
        raise NameRefused(
            f"{kind} {text!r} is not a URL: use <scheme>://host/path or git@host:path "
            f"(allowed schemes: {', '.join(sorted(schemes))})"
        )
    if scheme not in schemes:
        raise NameRefused(
            f"{kind} {text!r} uses {scheme!r}; this site allows {', '.join(sorted(schemes))}"
        )
    return text


def _login_part(url: str) -> str:
    """The `[user@]host[:port]` of a URL (`scheme://`
    form) or of scp-like `[user@]host:path`; '' if none."""
    if "://" in url:
        return re.split(r"[/?#]", url.split("://", 1)[1], maxsplit=1)[0]
    head = url.split("/", 1)[0]
    if head.startswith("["):  # scp-like `[user@host:port]:path` (git's connect.c parse_connect_url)
        return head[1:].split("]", 1)[0]
    return head.split(":", 1)[0] if ":" in head else ""


def _login_problem(url: str) -> str | None:
    """Why ssh could read this URL's user or host as its own option, or None.

    git hands the host (and `user@`) of an ssh URL to ssh as an argument; one that starts with '-'
    (`ssh://-oProxyCommand=...`, `user@-oProxy...:path`, `ssh://[-oProxy...]/x`) would be an option
    that runs a command. git decodes `%XX` in ssh URLs (url.c url_decode), so `%2d` is a '-' too:
    every form is decoded (twice over, for `%252d`) and checked piece by piece, brackets and
    `user@` and `:port` taken apart.
    """
    forms = {url}
    for _ in range(3):
        forms |= {unquote(f) for f in forms}
    for form in forms:
        login = _login_part(form)
        # a path may hold a %20; a host may not
        if _CONTROL.search(login) or any(c.isspace() for c in login):
            return "its user or host hides whitespace or a control character behind %-encoding"
        for piece in re.split(r"[@:\[\]]", login):
            if piece.strip().startswith("-"):
                return (
                    "its user or host starts with '-' (plain, bracketed or %-encoded), which "
                    "ssh would read as an option"
                )
    return None


def check_relative_path(kind: str, value: object) -> str:
    """A path inside a repo or tree (`docker/Dockerfile.tpu`):
    relative, no `..`, each part a plain name."""
    text = _text(kind, value)
    path = PurePosixPath(text)
    if not text or path.is_absolute() or "\\" in text:
        raise NameRefused(f"{kind} {text!r} must be a relative path inside its repository")
    for part in path.parts:
        if part == ".." or not NAME.match(part):
            raise NameRefused(
                f"{kind} {text!r}: its part {part!r} is not a plain name (letters, digits, '.', "
                "'_', '-'; no '..')"
            )
    return text


class PathEscape(ValueError):
    """A path lockstep was about to write or remove resolves outside the root it belongs under."""


def under(root: Path, *parts: str) -> Path:
    """`root / parts...`, resolved (symlinks too), refused unless it stays strictly inside `root`.

    Call it on every path built from outside input before writing or removing it.
    """
    base = root.resolve()
    target = base.joinpath(*parts).resolve()
    if target == base or base not in target.parents:
        shown = "/".join(parts)
        raise PathEscape(
            f"{shown!r} resolves to {target}, outside {base}: refused before anything was written"
        )
    return target
