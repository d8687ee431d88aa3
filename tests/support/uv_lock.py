"""A small uv.lock with one git source (harbor, pinned
by branch and commit) and one registry package."""

from __future__ import annotations

SHA = "2dde0bbf11d48a4e44df6ad0a56cee31e7ab609e"


LOCK = f"""version = 1
revision = 3
requires-python = ">=3.11"

[[package]]
name = "Harbor_X"
version = "0.8.1"
source = {{ git = "file:///r/harbor.git?branch=main#{SHA}" }}

[[package]]
name = "six"
version = "1.16.0"
source = {{ registry = "https://pypi.org/simple" }}
"""
