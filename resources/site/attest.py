"""``[attest]``: signed attestations — the key that
signs `tpu/verified_image`, the keys promotion trusts.

With the table, every verified build gets an in-toto statement signed with $key_env pushed beside
it in the registry, and promote/rollback refuse a target without a valid one by a trusted key.
Without it nothing is signed or checked, and both say so in their logs and metadata: the record of
"verified" is then only as safe as write access to the Dagster instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from resources.errors import FileFormatError
from resources.site.fields import Table, site_relative
from resources.tomlfile import key_line

# The key parsers (resources.attest, and cryptography
# behind it) load when a site names a trusted key.
if TYPE_CHECKING:
    from resources.attest import TrustedKey

_PEM = "-----BEGIN"
MAX_KEY_FILE_BYTES = 64 * 1024


class AttestSection(Table):
    """``[attest]``: see the module docstring."""

    key_env: str = Field(
        description=(
            "NAME of the env var holding the ECDSA P-256 private key (PEM) that signs attestations."
        )
    )
    trusted_keys: list[str] = Field(
        min_length=1,
        description="Public keys (PEM) promotion accepts signatures of: a path (relative to the "
        "site file), "
        "or the PEM text itself.",
    )

    @field_validator("trusted_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        from resources.attest import AttestError, load_public_key

        for n, entry in enumerate(value, start=1):
            text = entry.strip()
            if not text:
                raise ValueError(
                    f"entry #{n} is empty: give a public key file's path or its PEM text"
                )
            if text.startswith(_PEM):
                try:
                    load_public_key(text.encode(), source=f"entry #{n}")
                except AttestError as exc:
                    raise ValueError(str(exc)) from None
            elif "\n" in text or "\0" in text:
                raise ValueError(
                    f"entry #{n} is neither a PEM (-----BEGIN PUBLIC KEY-----) nor a file path"
                )
        return value


def key_files(attest: AttestSection, site_path: Path) -> list[Path]:
    """The key files `attest` names (relative to the site file at `site_path`): what loads read."""
    # An inline PEM key is part of the site file itself; every other entry is a key file.
    entries = [e.strip() for e in attest.trusted_keys]
    return [site_relative(site_path, e) for e in entries if not e.startswith(_PEM)]


def read_trusted_keys(
    attest: AttestSection, site_path: Path
) -> tuple[list[TrustedKey], list[FileFormatError]]:
    """Every key `attest` names (paths relative to the
    site file at `site_path`), and every one that is not
    a usable public key as a FileFormatError at the site file's line."""
    from resources.attest import AttestError, load_public_key

    keys, problems = [], []
    for n, entry in enumerate(attest.trusted_keys, start=1):
        text = entry.strip()
        try:
            if text.startswith(_PEM):
                keys.append(
                    load_public_key(text.encode(), source=f"[attest] trusted_keys #{n} (inline)")
                )
                continue
            path = site_relative(site_path, text)
            keys.append(load_public_key(_read_key_file(path), source=str(path)))
        except AttestError as exc:
            problems.append(
                FileFormatError(site_path, _line(site_path), f"[attest] trusted_keys #{n}: {exc}")
            )
    return keys, problems


def _read_key_file(path: Path) -> bytes:
    from resources.attest import AttestError

    try:
        if not path.is_file():
            raise AttestError(f"{path} is not a file (a public key PEM, e.g. cosign.pub)")
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise AttestError(f"{path} is over {MAX_KEY_FILE_BYTES} bytes: not a public key")
        return path.read_bytes()
    except OSError as exc:
        raise AttestError(f"{path} cannot be read ({exc.strerror})") from None


def _line(site_path: Path) -> int | None:
    try:
        return key_line(site_path.read_text(encoding="utf-8"), ("attest",), "trusted_keys")
    except OSError:
        return None
