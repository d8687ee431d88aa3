"""The attestation signer: the site's `[attest]
key_env` key, wired as a dg.EnvVar in Definitions."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

if TYPE_CHECKING:
    from resources.attest import SigningKey
    from resources.site.schema import SiteConfig


class AttestSigner(dg.ConfigurableResource):
    """Signs `tpu/verified_image`'s statement. Empty
    `key_env`: the site has no [attest], nothing is signed."""

    key_env: str = Field(
        default="", description="NAME of the env var with the ECDSA P-256 private key (PEM)."
    )
    key: str | None = Field(
        default=None,
        description=(
            "The key itself, as a dg.EnvVar of key_env when wired in Definitions; unset: read "
            "$key_env when signing."
        ),
    )

    def signing_key(self) -> SigningKey | None:
        """The key (None without [attest]); AttestError
        naming the variable when it is unset or not a key."""
        from resources.attest import load_signing_key

        if not self.key_env:
            return None
        value = self.key if self.key is not None else os.environ.get(self.key_env, "")
        return load_signing_key(value, env=self.key_env)


def signer_for(site: SiteConfig | None, *, env_vars: bool = False) -> AttestSigner:
    """The signer a site names. `env_vars`: the key as
    dg.EnvVar (Definitions: Dagster resolves it per run)."""
    if site is None or site.attest is None:
        return AttestSigner()
    env = site.attest.key_env
    return AttestSigner(key_env=env, key=dg.EnvVar(env) if env_vars else None)  # type: ignore[arg-type]
