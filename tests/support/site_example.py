"""deploy/site.example.toml, copied where a test can load it.

The example names its trusted public key by a path beside the site file
(`keys/lockstep-attest.pub`), and the repository holds no key a person could copy blindly: each copy
gets a freshly generated one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "site.example.toml"
# as the example's [attest] trusted_keys names it
EXAMPLE_KEY = Path("keys") / "lockstep-attest.pub"


def example_site(directory: Path, text: str | None = None) -> Path:
    """The example (or `text`, an edit of it) as
    `directory/site.toml`, with a new public key where it says."""
    directory.mkdir(parents=True, exist_ok=True)
    site = directory / "site.toml"
    if text is None:
        shutil.copyfile(EXAMPLE, site)
    else:
        site.write_text(text, encoding="utf-8")
    key = directory / EXAMPLE_KEY
    key.parent.mkdir(parents=True, exist_ok=True)
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    key.write_bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return site
