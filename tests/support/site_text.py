"""The minimal valid site file every site test starts from, and writing a site file's text."""

from __future__ import annotations

from pathlib import Path

GOOD = """\
[site]
name = "test"

[tpu]
harbor_repo = "https://github.com/marin-community/harbor.git"
harbor_branch = "penfever/working"
consumer_repo = "https://github.com/open-thoughts/OpenThoughts-Agent.git"
consumer_branch = "penfever/working"
image = "ghcr.io/open-thoughts/openthoughts-agent"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "site.toml"
    p.write_text(text)
    return p
