"""The sandbox's consumer repo, shaped like
OpenThoughts-Agent: it locks harbor by branch and bakes it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

# How the consumer declares harbor. The real one (open-thoughts/OpenThoughts-Agent pyproject.toml at
# 53265d2f) has a PEP 508 direct reference that follows a branch, which uv locks as `?rev=<branch>`;
# `[tool.uv.sources]` with `branch =` (locked as `?branch=`) is the other shape in the field.
ConsumerShape = Literal["direct_reference", "uv_source"]
CONSUMER_SHAPES: tuple[ConsumerShape, ...] = ("direct_reference", "uv_source")


def pyproject(
    harbor_url: str, harbor_branch: str, shape: ConsumerShape = "direct_reference"
) -> str:
    if shape == "direct_reference":
        return f"""[project]
name = "openthoughts-agent"
version = "0.1.0"
description = "Datagen and eval launchers (lockstep sandbox copy)"
requires-python = ">=3.11"
dependencies = [
    "harbor[daytona] @ git+{harbor_url}@{harbor_branch}",
]

[tool.uv]
package = false
"""
    return f"""[project]
name = "openthoughts-agent"
version = "0.1.0"
description = "Datagen and eval launchers (lockstep sandbox copy)"
requires-python = ">=3.11"
dependencies = ["harbor[daytona]"]

[tool.uv]
package = false

[tool.uv.sources]
harbor = {{ git = "{harbor_url}", branch = "{harbor_branch}" }}
"""


# sandbox/engines.py's offline python base (python_base)
BASE_IMAGE = "lockstep-sandbox/python:3.11"
VENV_PYTHON = "python3.11"  # the base's python: the venv's site-packages is lib/python3.11


def dockerfile(harbor_url: str, harbor_commit: str, *, git_daemon: str, repos_uri: str) -> str:
    """The sandbox consumer's docker/Dockerfile.tpu, shaped
    like open-thoughts/OpenThoughts-Agent's (53265d2f).

    `harbor_url` is harbor's URL as uv.lock has it (a file:// URL under `repos_uri`); inside the
    build, git fetches it from the sandbox's git daemon `git_daemon` (``git://127.0.0.1:PORT/``),
    because a container cannot see the host's files and uv speaks git only over https, ssh and file.
    """
    return f"""# The Iris TPU datagen + eval runtime (lockstep sandbox copy of docker/Dockerfile.tpu).
# (sandbox) The real image starts FROM python:3.12-slim; nothing can be pulled here, so the base is
# the sandbox's offline python image (python 3.11, git, uv), already loaded in the build's engine.
FROM {BASE_IMAGE}

# (sandbox) Harbor's URL below is the one uv.lock names; in the build, git fetches it from the
# sandbox's git daemon, as a real build fetches github.com. No package index: nothing else is needed.
RUN git config --system url."{git_daemon}".insteadOf "{repos_uri}"
ENV UV_NO_INDEX=1

RUN uv venv /opt/openthoughts/.venv

ENV VIRTUAL_ENV=/opt/openthoughts/.venv
ENV PATH="$VIRTUAL_ENV/bin:$PATH"

WORKDIR /opt/openthoughts
COPY pyproject.toml ./

# The base install brings harbor from the FLOATING branch pyproject.toml follows; its layer is cached
# by the (unchanged) COPYed pyproject.toml + RUN string, so a harbor move does not bust it (runbook §2).
# (sandbox) The real line is `uv pip install -e ".[datagen-tpu,cloud]"`; offline, only the dependencies.
RUN . /opt/openthoughts/.venv/bin/activate && \\
    uv pip install -r pyproject.toml

# Harbor is canonical and fast-moving: install it FRESH from the pinned commit (runbook §2).
# Keep this aligned with the Harbor pin in uv.lock; the worker's frozen sync is the runtime authority.
ENV HARBOR_COMMIT={harbor_commit}
RUN . /opt/openthoughts/.venv/bin/activate && \\
    uv pip install --no-deps --force-reinstall \\
        "harbor[daytona] @ git+{harbor_url}@${{HARBOR_COMMIT}}" && \\
    python -c "import harbor, importlib.metadata as m; print('baked harbor', m.version('harbor'))" && \\
    echo "baked harbor commit: ${{HARBOR_COMMIT}}"

COPY . /app
"""  # noqa: E501


# Shaped like open-thoughts/OpenThoughts-Agent's docker/build_tpu_kaniko.sh (7951edcd; be1aaff6 only
# adds `set +x` around the auth line):
# the destination and cache repo are literals (written for the sandbox's registry at `sandbox up`),
# DOCKER_TOKEN is required, the crane-export-over-ubuntu recipe. Unlike that script, xtrace goes on
# only after the token was last expanded and is off around the auth line: lockstep's pre-flight
# refuses the real script's order (`set -euxo pipefail` first).
_TEMPLATE = Path(__file__).resolve().parent / "templates" / "build_tpu_kaniko.sh"


def build_script(image: str) -> str:
    """The sandbox consumer's docker/build_tpu_kaniko.sh,
    pushing to `image` (a repository, no tag)."""
    text = _TEMPLATE.read_text(encoding="utf-8")
    return text.replace("@IMAGE@", image).replace("@HOST@", image.split("/", 1)[0])


README = """# OpenThoughts-Agent (lockstep sandbox copy)

The runtime gate for harbor is `uv.lock`: iris workers `uv sync --frozen --reinstall` from it.
`docker/Dockerfile.tpu` keeps `ENV HARBOR_COMMIT` in lockstep with the lock.
"""
