"""The lab's `<rev>.source.lock` (format
`local-inference-source-lock/v1`), parsed with every key kept.

The lock is the contract of a rev: engine packages pinned by full commit sha AND tree hash. Branch
names are not the contract (the LMCache lock's branch was renamed upstream within a day), so an
abbreviated sha or a branch name where a sha belongs is an error naming file:line, never a guess.
Keys the parser does not model (`runtime.*`, `flashkda.*`, `flashinfer.*`, `input.*.sha256`, ...)
are pins and facts too: they are kept verbatim, in file order.

The lab is an outside party: `release.version` becomes a partition key, a file name
(`profiles/<rev>.env`) and a docker tag, and each `P.repository` a git argument, so both are held
to resources/names.py's rules here, where they enter, with the line and the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jovian_assets.inputs import check_utf8, name_at, url_at
from resources.errors import FileFormatError
from resources.model import Model

FORMAT = "local-inference-source-lock/v1"
FULL_SHA = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-fA-F]+")
# P.version: a PEP 440 version's characters only; it becomes a pretend version in the profile and a
# pattern in the boot gates, so shell and regex syntax never ride along.
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,127}")
# Keys whose value is a git object id (commit, tree or blob): `P.commit`, `P.tree`,
# `P.package.tree`, `flashkda.base.commit`,
# `vllm.native.csrc.tree`, `vllm.native.cmakelists.blob`, ...
_SHA_SUFFIXES = (".commit", ".tree", ".blob")
# Keys whose value is a sha256 digest: `P.bundle.sha256`,
# `flashkda.patch.sha256`, `input.*.sha256`, ...
_SHA256_SUFFIX = ".sha256"


class LockedPackage(Model):
    """One engine package of the lock: a prefix P with both `P.repository` and `P.commit`."""

    name: str
    repository: str
    commit: str
    tree: str
    package_tree: str | None = None  # P.package.tree: the tree of the packaged sub-directory
    bundle_sha256: str | None = None  # P.bundle.sha256
    # P.version: the engine string carries the pin (…+glm53.r35.vllmde982a50)
    version: str | None = None
    line: int  # line of P.commit


class SourceLock(Model):
    """A parsed lock: the packages it pins, and every key=value exactly as the lab wrote it."""

    path: str
    format: str
    rev: str  # release.version, e.g. r35
    release_name: str | None = None
    packages: dict[str, LockedPackage]  # in file order of P.repository
    keys: dict[str, str]  # every key, verbatim, in file order
    lines: dict[str, int]  # 1-based line of each key

    def line_of(self, key: str) -> int | None:
        return self.lines.get(key)


def parse_source_lock(text: str, path: str, *, required: Sequence[str] = ()) -> SourceLock:
    """Parse a v1 source lock; every problem is a FileFormatError naming path:line and the value.

    `required` names packages (e.g. vllm, b12x, lmcache) that must be in the lock.
    """
    keys, lines = _read_pairs(check_utf8(text, path), path)
    for key, value in keys.items():
        if key.endswith(_SHA_SUFFIXES):
            _check_full_sha(path, lines[key], key, value)
        elif key.endswith(_SHA256_SUFFIX):
            _check_sha256(path, lines[key], key, value)
    end = max(text.count("\n") + (0 if text.endswith("\n") else 1), 1)  # the file's last line
    rev = keys.get("release.version")
    if rev is None:
        raise FileFormatError(
            path,
            end,
            f"no release.version key (the file ends at line {end}): it names the rev "
            "(e.g. release.version=r35)",
        )
    if not rev.strip():
        raise FileFormatError(
            path, lines["release.version"], "release.version is empty: it names the rev (e.g. r35)"
        )
    name_at(path, lines["release.version"], "release.version", rev)
    for name in required:  # first: a required package's own message names what it lacks
        _check_required(name, keys, lines, path, end)
    packages = _packages(keys, lines, path)
    return SourceLock(
        path=path,
        format=keys["format"].strip(),
        rev=rev,
        release_name=keys.get("release.name"),
        packages=packages,
        keys=keys,
        lines=lines,
    )


def to_json(lock: SourceLock) -> dict[str, object]:
    """The parsed lock as plain JSON for the CLI: packages as modelled, plus every key verbatim."""
    return {
        "rev": lock.rev,
        "release_name": lock.release_name,
        "packages": {
            name: {
                "repository": p.repository,
                "commit": p.commit,
                "tree": p.tree,
                "package_tree": p.package_tree,
                "bundle_sha256": p.bundle_sha256,
                "version": p.version,
            }
            for name, p in lock.packages.items()
        },
        "keys": dict(lock.keys),
    }


def _read_pairs(text: str, path: str) -> tuple[dict[str, str], dict[str, int]]:
    """key=value lines in file order; the first one must be the format line."""
    keys: dict[str, str] = {}
    lines: dict[str, int] = {}
    # Lines end at "\n" only, as the lab's shell reads them: splitlines() would also end one at
    # "\r", "\x0b", "\x85", "\u2028"..., and read `release.version=r1\r<anything>` as a clean `r1`
    # (then the rest as a line of its own), while bash reads the
    # whole value. Such a value is refused as itself.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "=" not in line:
            raise FileFormatError(
                path,
                number,
                f"{line.strip()!r} is not key=value: every line of a source lock is one key=value",
            )
        # Split on the FIRST '=' only: values carry '=' too (and spaces, ';', '@', ':').
        key, value = line.split("=", 1)
        key = key.strip()
        if not key:
            raise FileFormatError(path, number, f"{line.strip()!r} has an empty key before '='")
        if not keys:
            _check_format_line(path, number, key, value)
        if key in keys:
            raise FileFormatError(
                path,
                number,
                (
                    f"{key} is set twice (lines {lines[key]} and {number}): a lock pins each "
                    "key once; the lab must publish one value"
                ),
            )
        keys[key] = value
        lines[key] = number
    if not keys:
        raise FileFormatError(
            path, 1, f"the file is empty: a source lock starts with format={FORMAT}"
        )
    if not text.endswith("\n"):
        # The lab writes whole lines; a last line without its newline is a download or copy cut
        # short, and the keys after the cut (a package's pins, the fingerprint) are simply missing.
        last = text.count("\n") + 1
        raise FileFormatError(
            path,
            last,
            f"the file ends inside line {last} ({text.splitlines()[-1][:80]!r}, no newline "
            "after it): a truncated lock; fetch the whole file again",
        )
    return keys, lines


def _check_format_line(path: str, number: int, key: str, value: str) -> None:
    if key != "format":
        raise FileFormatError(
            path,
            number,
            (
                f"the first line must be format={FORMAT}, found {key}={value!r}: not a source "
                "lock, or a truncated one"
            ),
        )
    if value.strip() != FORMAT:
        raise FileFormatError(
            path,
            number,
            (
                f"format={value!r} is not {FORMAT}: lockstep reads only v1 locks; a new format "
                "needs a parser change"
            ),
        )


def _check_full_sha(path: str, line: int, key: str, value: str) -> None:
    if FULL_SHA.fullmatch(value):
        return
    if _HEX.fullmatch(value) and len(value) < 40:
        what = f"an abbreviated sha ({len(value)} hex digits)"
    elif _HEX.fullmatch(value) and len(value) == 40:
        what = "upper-case hex"
    elif not value.strip():
        what = "empty"
    else:
        what = "not a sha (a branch name?)"
    raise FileFormatError(
        path,
        line,
        f"{key}={value!r} is {what}: pins are full 40-hex lower-case git shas; branch names and "
        "short shas "
        "are not the contract (a branch was renamed upstream within a day). Take the full sha "
        "from the lab's commit.",
    )


def _check_sha256(path: str, line: int, key: str, value: str) -> None:
    if not SHA256.fullmatch(value):
        raise FileFormatError(
            path,
            line,
            (
                f"{key}={value!r} is not a sha256 digest: 64 lower-case hex digits, as "
                "`sha256sum` prints them"
            ),
        )


def _packages(keys: dict[str, str], lines: dict[str, int], path: str) -> dict[str, LockedPackage]:
    """Every prefix P with both P.repository and P.commit, in the file order of P.repository."""
    packages: dict[str, LockedPackage] = {}
    for key, url in keys.items():
        if not key.endswith(".repository"):
            continue
        name = key.removesuffix(".repository")
        commit_key = f"{name}.commit"
        if commit_key not in keys:
            pins = [
                k
                for k in (f"{name}.tree", f"{name}.package.tree", f"{name}.bundle.sha256")
                if k in keys
            ]
            # a package's pins without its commit: the commit line was lost (a cut, a bad merge)
            if pins:
                raise FileFormatError(
                    path,
                    lines[pins[0]],
                    f"package {name} has {pins[0]} but no {commit_key}: "
                    "every package pins its commit next to its tree",
                )
            continue  # e.g. model.repository: a Hugging Face repo, not a package pinned by commit
        tree_key = f"{name}.tree"
        if tree_key not in keys:
            raise FileFormatError(
                path,
                lines[commit_key],
                (
                    f"package {name} has {commit_key} but no {tree_key}: every package pins "
                    "the tree hash of its commit next to the commit"
                ),
            )
        url_at(path, lines[key], key, url)
        version_key = f"{name}.version"
        if version_key in keys and not _VERSION.fullmatch(keys[version_key]):
            raise FileFormatError(
                path,
                lines[version_key],
                f"{version_key}={keys[version_key]!r} is not a package version: letters, digits "
                "and . + ! _ - only "
                "(PEP 440, e.g. 0.26.1rc0+glm53.r35.vllmde982a50)",
            )
        packages[name] = LockedPackage(
            name=name,
            repository=url,
            commit=keys[commit_key],
            tree=keys[tree_key],
            package_tree=keys.get(f"{name}.package.tree"),
            bundle_sha256=keys.get(f"{name}.bundle.sha256"),
            version=keys.get(f"{name}.version"),
            line=lines[commit_key],
        )
    return packages


def _check_required(
    name: str, keys: dict[str, str], lines: dict[str, int], path: str, end: int
) -> None:
    repository, commit = f"{name}.repository", f"{name}.commit"
    missing = [k for k in (repository, commit) if k not in keys]
    if not missing:
        return
    present = next((k for k in (repository, commit) if k in keys), None)
    raise FileFormatError(
        path,
        lines[present] if present else end,
        (
            f"required package {name} is missing {' and '.join(missing)}: the rev must pin "
            f"{name} as part of its one cut"
        ),
    )
