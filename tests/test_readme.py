"""The README's real-site example must stay a valid site file."""

from __future__ import annotations

import tomllib
from pathlib import Path

from resources.site import SiteConfig

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_site_example_validates() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("```toml\n[site]") + len("```toml\n")
    config = SiteConfig.model_validate(tomllib.loads(text[start:text.index("```", start)]))
    assert config.tpu.harbor_branch == "penfever/working" and config.registry.token_env == "GHCR_TOKEN"
    assert config.spark is not None and {n.name for n in config.spark.nodes} == {"dgx4", "dgx1"}
