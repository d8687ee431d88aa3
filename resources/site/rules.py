"""The site file's value rules that are not names.py's:
sizes iris accepts, hosts, image names, env keys.

Each check takes the value from the file and returns it or raises a ValueError whose message shows
the value, so the site loader can add the file and line. `KeyRefused` is for the rules that look
across keys (a node named in [jovian] that [spark] lacks): it says which key the person must fix;
`across_tables` holds the rules that look across tables, which SiteConfig and `lockstep site check`
both apply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from resources.names import NameRefused

# The OCI reference rules (resources.registry.refs) load
# when a site names an image, not with the location.


class KeyRefused(ValueError):
    """A rule over several keys broke; `key` is where to fix it, relative to the table that checked.

    `others`: the problems the same check found after this one (see `refuse`).
    """

    def __init__(self, key: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.key = key
        self.others: tuple[KeyRefused, ...] = ()


def refuse(problems: Sequence[KeyRefused]) -> None:
    """Raise the first of `problems`, carrying the rest.

    pydantic keeps one error per validator call, and a load names only the first; `lockstep site
    check` reads `others` to name every problem the rule found, each with its own key.
    """
    if problems:
        first = problems[0]
        first.others = tuple(problems[1:])
        raise first


def repository_urls(tables: Mapping[str, Any]) -> dict[tuple[str, ...], str]:
    """Every repository URL the site's `tables` name (each location table's REPOSITORY_KEYS), by
    (table, key), in the order of `tables`."""
    urls: dict[tuple[str, ...], str] = {}
    for name, table in tables.items():
        for key in getattr(type(table), "REPOSITORY_KEYS", ()):
            urls[(name, key)] = getattr(table, key)
    return urls


def across_tables(tables: Mapping[str, Any]) -> list[KeyRefused]:
    """Every broken rule that spans tables, in the
    order a load reports them; keys from the file's top.

    `tables`: the site's tables by name, as validated models (an optional table the file leaves out
    is there as None). A table that failed its own checks is left out of `tables`, and a rule that
    needs it is skipped: its problems are that table's errors.
    """
    from resources.names import url_scheme
    from resources.secrets import redact

    problems: list[KeyRefused] = []
    if (site := tables.get("site")) is not None:
        allowed = site.url_schemes
        for key, url in repository_urls(tables).items():
            if url_scheme(url) not in allowed:
                problems.append(
                    KeyRefused(
                        key,
                        (
                            f"repository URL {redact(url)!r} uses {url_scheme(url)!r}; this site "
                            "allows "
                            f"{', '.join(allowed)} ([site] url_schemes)"
                        ),
                    )
                )
    jovian, spark = tables.get("jovian"), tables.get("spark")
    if jovian is None or "spark" not in tables:
        return problems
    have = [n.name for n in spark.nodes] if spark else []
    named: list[tuple[tuple[str | int, ...], str]] = []
    if jovian.build_node is not None:
        named.append((("jovian", "build_node"), jovian.build_node))
    if jovian.lane is not None:
        named += [(("jovian", "lane", "nodes", i), n) for i, n in enumerate(jovian.lane.nodes)]
    for key, name in named:
        if name not in have:
            known = (
                f"the [[spark.nodes]] are {', '.join(have)}"
                if have
                else "the site has no [[spark.nodes]]"
            )
            problems.append(
                KeyRefused(key, f"node {name!r} is not a [[spark.nodes]] name ({known})")
            )
    if jovian.distribute == "relay" and jovian.lane is not None and spark is not None:
        from resources.spark.relay import relay_site_problems

        problems += [
            KeyRefused(("spark", *key), message)
            for key, message in relay_site_problems(spark.nodes, jovian.lane.nodes)
        ]
    return problems


# iris reads --memory/--disk with humanfriendly.parse_size(binary=True) (lib/iris/src/iris/cluster/
# types.py parse_memory_string). That parser is lenient ("4Gxyz" is 4 GiB, "5 bananas" fails late,
# on the cluster); the site takes the plain subset a person means, which iris reads the same way.
_SIZE = re.compile(
    r"^(\d+(?:\.\d+)?)\s*(b|bytes?|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)?$", re.IGNORECASE
)
_SIZE_FACTOR = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def size_bytes(kind: str, value: object) -> int:
    """`"64GB"` -> 68719476736, as iris reads it (binary multiples for K/M/G/T)."""
    m = _SIZE.match(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise NameRefused(
            f"{kind} {value!r} is not a size iris accepts: a number and a unit, e.g. '64GB' or "
            "'512MiB'"
        )
    unit = (m.group(2) or "").lower()
    number = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    result = int(number * _SIZE_FACTOR["b" if unit.startswith("b") else unit[:1]])
    if result <= 0:
        raise NameRefused(f"{kind} {value!r} is zero: give the size the job needs, e.g. '64GB'")
    return result


def check_size(kind: str, value: object) -> str:
    size_bytes(kind, value)
    return str(value)


# A DNS name or an IP address (v6 without brackets): what paramiko connects to.
_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*\.?|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)\Z"
)
# A login name as useradd takes it.
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
# What versions.env and a profile hold: shell variable names.
ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")


def check_host(kind: str, value: object) -> str:
    if not isinstance(value, str) or not _HOST.match(value) or len(value) > 253:
        raise NameRefused(f"{kind} {value!r} is not a host name or IP address")
    return value


def check_user(kind: str, value: object) -> str:
    if not isinstance(value, str) or not _USER.match(value):
        raise NameRefused(
            f"{kind} {value!r} is not a login name (letters, digits, '_', '.', '-'; not starting "
            "with '-')"
        )
    return value


def check_env_key(kind: str, value: object) -> str:
    if not isinstance(value, str) or not ENV_KEY.match(value):
        raise NameRefused(
            f"{kind} {value!r} is not a variable name (A-Z, 0-9, '_', not starting with a digit)"
        )
    return value


def check_image_repository(kind: str, value: str) -> str:
    """`host[:port]/name`: where the pushes go. A tag
    or digest here would be a second floating tag."""
    from resources.registry.refs import ImageRef, RegistryError

    try:
        ref = ImageRef.parse(value)
    except RegistryError as exc:
        raise NameRefused(f"{kind} {value!r}: {exc}") from None
    if not check_host_port(ref.registry):
        raise NameRefused(
            f"{kind} {value!r} starts with {ref.registry!r}, which is not a registry host[:port]"
        )
    if ref.tag or ref.digest or value != value.strip():
        raise NameRefused(
            f"{kind} {value!r} must be a repository without tag or digest, e.g. ghcr.io/org/image"
        )
    return value


def check_oci_tag(kind: str, value: str) -> str:
    from resources.registry.refs import RegistryError, check_tag

    try:
        check_tag(value)
    except RegistryError:
        raise NameRefused(
            f"{kind} {value!r} is not an OCI tag: up to 128 letters, digits, '_', '.', '-', not "
            "starting with '.' or '-'"
        ) from None
    return value


def check_local_image_tag(kind: str, value: str, shown: str | None = None) -> str:
    """A `docker build -t` name: `[host[:port]/]name[:tag]`, as docker's reference grammar reads it.
    `shown`: what the message calls the value (the template a person wrote, not its rendering)."""
    from resources.registry.refs import RegistryError, check_repository, check_tag

    said = f"{kind} {shown or repr(value)}"
    name, _, tag = value.rpartition(":") if ":" in value.rsplit("/", 1)[-1] else (value, "", "")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host_ok = check_host_port(first)
        name = rest
    else:
        host_ok = True
    try:
        check_repository(name)
        if tag:
            check_tag(tag)
    except RegistryError as exc:
        raise NameRefused(f"{said} is not a docker image name: {exc}") from None
    if not host_ok:
        raise NameRefused(f"{said} starts with {first!r}, which is not a registry host[:port]")
    return value


def check_host_port(text: str) -> bool:
    host, _, port = text.partition(":")
    return bool(_HOST.match(host)) and (not port or port.isdigit())


# A path on a node that becomes an OpenSSH option value (ssh expands '%' tokens and '~' in them):
# absolute, and every part a plain name.
_NODE_PATH_PART = re.compile(r"^[A-Za-z0-9._-]+\Z")


def check_node_path(kind: str, value: object) -> str:
    """An absolute path on a node whose every part is
    a plain name (no '..', '.', '%', '~' or spaces)."""
    parts = value[1:].split("/") if isinstance(value, str) and value.startswith("/") else None
    if not parts or any(p in ("", ".", "..") or not _NODE_PATH_PART.match(p) for p in parts):
        raise NameRefused(
            f"{kind} {value!r} is not a plain absolute path on the node: it must start with '/' "
            "and each part be "
            "letters, digits, '.', '_', '-' (no '..', no empty part, no '~' or '%': ssh would "
            "expand them)"
        )
    return value
