"""Reading the site file: which file (``LOCKSTEP_SITE``, else the embedded sandbox's
``.sandbox/site.toml``), validated into a SiteConfig, kept while it is unchanged, and the one
error a bad file raises (its file, line and key).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from resources.errors import FileFormatError, LockstepError, decode_utf8
from resources.reader import read_bytes
from resources.site.attest import key_files, read_trusted_keys
from resources.site.cache import SiteCache, stamp_of
from resources.site.errors import first_problem
from resources.site.schema import SiteConfig
from resources.tomlfile import load_toml

# The key parsers (resources.attest, cryptography behind it) load when a site names a trusted key.
if TYPE_CHECKING:
    from resources.attest import TrustedKey

DEFAULT_SITE = Path(".sandbox") / "site.toml"
SITE_ENV = "LOCKSTEP_SITE"


def _explain(exc: ValidationError, path: Path, text: str) -> FileFormatError:
    """The one error a load raises (`lockstep site check` lists them all: site/check.py)."""
    return first_problem(exc.errors(), path, text).error()


_SITE_CACHE: SiteCache[SiteConfig] = SiteCache()


def load_site(path: Path | str | None = None) -> SiteConfig:
    """Read and validate a site file. Errors name the file, the line, the key and what is wrong.

    A file unchanged since it was last read here is not parsed again (resources/site/cache.py):
    every sensor tick loads the site, and parsing and validating it cost more than the ls-remote
    the tick is for.
    """
    site_path = Path(path or os.environ.get(SITE_ENV) or DEFAULT_SITE)
    stamp = stamp_of(site_path)
    if stamp is None:
        hint = (
            "check the path"
            if path
            else f"check {SITE_ENV}"
            if os.environ.get(SITE_ENV)
            else "run `lockstep sandbox up` to create the embedded sandbox"
        )
        raise LockstepError(f"{site_path}: no site file here ({hint})")
    if (config := _SITE_CACHE.get(site_path, stamp)) is not None:
        return config
    started = time.time_ns()
    config = _read_site(site_path)
    deps = key_files(config.attest, config.path) if config.attest is not None else []
    _SITE_CACHE.put(site_path, stamp, config, started, deps)
    return config


def site_names_only(path: Path) -> SiteConfig:
    """A site file checked as a load checks it, without reading the files it names (trusted keys).

    For what only needs the names in it (`lockstep deploy env`): the deployment's env is made before
    the key files exist where the site file will live,
    e.g. from deploy/site.example.toml in the repo.
    """
    return _read_site(path, read_keys=False)


def _read_site(site_path: Path, *, read_keys: bool = True) -> SiteConfig:
    # a directory or FIFO named by $LOCKSTEP_SITE is refused, never read
    raw = read_bytes(site_path)
    text = decode_utf8(raw, site_path)
    data = load_toml(site_path, text)
    try:
        config = SiteConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, site_path, text) from None
    # Absolute, not resolved: the path stays the one the deployment named. A Kubernetes ConfigMap
    # mounted as a directory is symlinks into a timestamped directory that the next update deletes;
    # a code server holding the resolved path would find no
    # file there instead of seeing that the site changed.
    config._path = Path(os.path.abspath(site_path))
    config._digest = hashlib.sha256(raw).hexdigest()
    # a key file that is missing or wrong fails the load, not a promotion
    if read_keys and config.attest is not None:
        trusted_keys(config)
    return config


def site_at_load() -> SiteConfig | None:
    """The site file as a code location loads: owners and node pools are part of the definitions.

    No site file yet (a fresh checkout before `lockstep sandbox up`): None, and the runs say what is
    missing when they need the site. A site file that is there but wrong fails the load, naming file
    and line, so a typo cannot quietly drop owners or pools from the definitions.
    """
    explicit = os.environ.get(SITE_ENV)
    if not explicit and not DEFAULT_SITE.exists():
        return None
    return load_site(explicit or None)


def trusted_keys(site: SiteConfig) -> list[TrustedKey]:
    """The keys `[attest] trusted_keys` names, read and checked; FileFormatError names the site
    file's line."""
    assert site.attest is not None
    keys, problems = read_trusted_keys(site.attest, site.path)
    if problems:
        raise problems[0]
    return keys
