#!/usr/bin/env bash
# build_tpu_kaniko.sh: in-cluster kaniko build of the :tpu image (lockstep sandbox copy).
#
# Runs INSIDE an iris job whose task image is docker.io/library/ubuntu:22.04 (kaniko's executor is
# distroless, no bash): crane-export the executor rootfs over / and run /kaniko/executor.
#
# Required env (passed by the iris launch as -e):
#   DOCKER_USER_ID  registry user
#   DOCKER_TOKEN    push token (ghcr: a GitHub PAT with write:packages, NOT a Docker Hub dckr_pat_)
#   GITSHA          consumer commit (git rev-parse --short HEAD): the immutable :tpu-<gitsha> tag
#
# PINNED-FIRST: pushes ONLY :tpu-<gitsha>; the floating :tpu is promoted after a smoke.
set -euo pipefail

: "${DOCKER_USER_ID:?}"
: "${DOCKER_TOKEN:?}"
: "${GITSHA:?}"
set -x   # traced from here on: nothing below expands the token while tracing

SINGLE_SNAPSHOT="${SINGLE_SNAPSHOT:-0}"
if [ "$SINGLE_SNAPSHOT" = "1" ]; then SNAPSHOT_FLAG="--single-snapshot"; else SNAPSHOT_FLAG=""; fi

DOCKERFILE="${DOCKERFILE:-docker/Dockerfile.tpu}"
CACHE_REPO=@IMAGE@/cache-tpu
DEST_PINNED=@IMAGE@:tpu-${GITSHA}

# --- 1. fetch crane (static binary) ---
apt-get update -y && apt-get install -y --no-install-recommends ca-certificates curl tar
cd /tmp
CRANE_VER=v0.20.2
curl -fsSL "https://github.com/google/go-containerregistry/releases/download/${CRANE_VER}/go-containerregistry_Linux_x86_64.tar.gz" -o crane.tgz
tar -xzf crane.tgz crane
install -m 0755 crane /usr/local/bin/crane

# --- 2. crane-export the kaniko executor rootfs over / (a pinned release, not :latest) ---
crane export gcr.io/kaniko-project/executor:v1.23.2 - | tar -xf - -C /

# --- 3. the registry auth, AFTER the overlay (kaniko clobbers /kaniko otherwise), untraced ---
export DOCKER_CONFIG=/kaniko/.docker
mkdir -p "$DOCKER_CONFIG"
{ set +x; } 2>/dev/null
AUTH=$(printf '%s:%s' "$DOCKER_USER_ID" "$DOCKER_TOKEN" | base64 | tr -d '\n')
cat > "$DOCKER_CONFIG/config.json" <<EOF
{"auths":{"@HOST@":{"auth":"${AUTH}"}}}
EOF
set -x

# --- 4. run kaniko (the pinned tag ONLY) ---
exec /kaniko/executor \
  --context dir:///app \
  --dockerfile "${DOCKERFILE}" \
  --skip-unused-stages \
  $SNAPSHOT_FLAG \
  --compressed-caching=false \
  --cache=true \
  --cache-repo="${CACHE_REPO}" \
  --destination "${DEST_PINNED}"
