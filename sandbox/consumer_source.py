"""The sandbox's consumer repo, shaped like OpenThoughts-Agent: it locks harbor by branch and bakes it."""

from __future__ import annotations


def pyproject(harbor_url: str, harbor_branch: str) -> str:
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


def dockerfile(harbor_url: str, harbor_commit: str) -> str:
    return f"""# The Iris TPU datagen + eval runtime (lockstep sandbox copy of docker/Dockerfile.tpu).
FROM python:3.12-slim

RUN apt-get update && apt-get install -y --no-install-recommends git curl && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir uv

WORKDIR /opt/openthoughts
COPY pyproject.toml uv.lock ./
RUN uv venv /opt/openthoughts/.venv && . /opt/openthoughts/.venv/bin/activate && \\
    uv pip install -e ".[datagen-tpu,cloud]"

# Harbor is canonical and fast-moving: install it FRESH from the pinned commit (runbook §2).
ENV HARBOR_COMMIT={harbor_commit}
RUN . /opt/openthoughts/.venv/bin/activate && \\
    uv pip install --no-deps --force-reinstall \\
        "harbor[daytona] @ git+{harbor_url}@${{HARBOR_COMMIT}}" && \\
    python -c "import harbor, importlib.metadata as m; print('baked harbor', m.version('harbor'))"

COPY . /app
"""


BUILD_SCRIPT = r"""#!/usr/bin/env bash
# Kaniko build of the :tpu image, run as an iris job on ubuntu:22.04 (lockstep sandbox copy).
set -euo pipefail
: "${GITSHA:?GITSHA is required: it names the immutable :tpu-<gitsha> tag}"
: "${DOCKER_USER_ID:?}"
IMAGE="${IMAGE:-ghcr.io/open-thoughts/openthoughts-agent}"
DOCKERFILE="${DOCKERFILE:-docker/Dockerfile.tpu}"
SINGLE_SNAPSHOT="${SINGLE_SNAPSHOT:-0}"

apt-get update && apt-get install -y --no-install-recommends ca-certificates curl
curl -sL "https://github.com/google/go-containerregistry/releases/latest/download/go-containerregistry_Linux_x86_64.tar.gz" | tar -xz -C /usr/local/bin crane
crane export gcr.io/kaniko-project/executor:latest - | tar -x -C /

# Written AFTER the overlay: kaniko's export would clobber /kaniko otherwise. No token: an anonymous
# push (a registry on the build host); ghcr needs a GitHub PAT here, not the Docker Hub token.
export DOCKER_CONFIG=/kaniko/.docker
mkdir -p "$DOCKER_CONFIG"
if [ -n "${DOCKER_TOKEN:-}" ]; then
  AUTH=$(printf '%s:%s' "$DOCKER_USER_ID" "$DOCKER_TOKEN" | base64 -w0)
  printf '{"auths":{"%s":{"auth":"%s"}}}' "${IMAGE%%/*}" "$AUTH" > "$DOCKER_CONFIG/config.json"
fi

snapshot=()
[ "$SINGLE_SNAPSHOT" = "1" ] && snapshot=(--single-snapshot)
exec /kaniko/executor --context dir:///app --dockerfile "$DOCKERFILE" --skip-unused-stages \
  --compressed-caching=false --cache=true --cache-repo="${IMAGE}/cache-tpu" "${snapshot[@]}" \
  --destination "${IMAGE}:tpu-${GITSHA}"
"""

README = """# OpenThoughts-Agent (lockstep sandbox copy)

The runtime gate for harbor is `uv.lock`: iris workers `uv sync --frozen --reinstall` from it.
`docker/Dockerfile.tpu` keeps `ENV HARBOR_COMMIT` in lockstep with the lock.
"""
