"""The images a live deployment test needs, made offline: no registry is reachable from the sandbox.

``deploy/Dockerfile`` and ``deploy/docker/docker-compose.yml`` name production's images as build
arguments and variables (``python:3.11-slim``, ``ghcr.io/astral-sh/uv``, ``postgres:15``); here each
is replaced by a base made from this machine's own files (``sandbox/base_image.py``):

- ``lockstep-sandbox/deploy-base:3.11``: the Python
  base plus what the Dockerfile's apt step would bring
  (the SSH client, CA certificates) and the C++ runtime python:3.11-slim carries and uv's own image
  layout (``/uv``, ``/uvx``), so it serves as both ``BASE_IMAGE`` (``SYSTEM_PACKAGES=ready``) and
  ``UV_IMAGE``; and what the sandbox's iris stand-in runs inside a run container (Debian's docker
  client and skopeo, for its kaniko stand-in).
- ``lockstep-sandbox/postgres:15``: Debian's PostgreSQL
  15 server with an entry point that follows the
  official image's contract (``POSTGRES_USER``, ``POSTGRES_PASSWORD``, ``POSTGRES_DB``; ``PGPORT``;
  initialise an empty ``PGDATA`` once; ``pg_isready``, ``pg_dump``, ``pg_restore`` and ``psql`` on
  PATH), from docker-library/postgres ``docker-entrypoint.sh`` (the 15/bookworm variant).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from sandbox.base_image import BaseSpec, ExtraFile, _uv_binary
from sandbox.engines import DOCKER, Engine, EngineError

DEPLOY_BASE = "lockstep-sandbox/deploy-base:3.11"
POSTGRES_IMAGE = "lockstep-sandbox/postgres:15"
PG_ROOT = Path("/usr/lib/postgresql/15")
PG_SHARE = Path("/usr/share/postgresql/15")
# this machine's, proxy CA included: uv needs it to reach the index
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PG_UID = 999  # the official image's postgres user

POSTGRES_ENTRYPOINT = f'''#!/usr/bin/python3
"""The official postgres image's contract, minimal: initialise PGDATA once from POSTGRES_*, then serve."""
import os, subprocess, sys, tempfile
BIN = "{PG_ROOT}/bin"
data = os.environ.get("PGDATA", "/var/lib/postgresql/data")
user = os.environ.get("POSTGRES_USER", "postgres")
password = os.environ.get("POSTGRES_PASSWORD", "")
db = os.environ.get("POSTGRES_DB", user)
if not password:
    sys.exit("Database is uninitialized and superuser password is not specified: set POSTGRES_PASSWORD")
for d in (data, "/var/run/postgresql"):
    os.makedirs(d, exist_ok=True)
    os.chown(d, {PG_UID}, {PG_UID})
os.chmod(data, 0o700)
os.setgid({PG_UID})
os.setuid({PG_UID})
os.environ["HOME"] = "/var/lib/postgresql"
if not os.path.exists(os.path.join(data, "PG_VERSION")):
    with tempfile.NamedTemporaryFile("w", dir="/tmp", delete=False) as pw:
        pw.write(password)
    subprocess.run([f"{{BIN}}/initdb", "-D", data, "-U", user, "--pwfile", pw.name, "--auth-local=trust",
                    "--auth-host=scram-sha-256", "--locale=C", "--encoding=UTF8"], check=True, stdout=subprocess.DEVNULL)
    os.unlink(pw.name)
    with open(os.path.join(data, "pg_hba.conf"), "a") as hba:
        hba.write("host all all all scram-sha-256\\n")
    if db != "postgres":
        single = subprocess.run([f"{{BIN}}/postgres", "--single", "-D", data, "postgres"],
                                input=f'CREATE DATABASE "{{db}}" OWNER "{{user}}";\\n', text=True,
                                stdout=subprocess.DEVNULL, check=True)
os.execv(f"{{BIN}}/postgres", [f"{{BIN}}/postgres", "-D", data, "-c", "listen_addresses=*"])
'''  # noqa: E501


def deploy_base() -> BaseSpec:
    uv = _uv_binary()
    uvx = uv.with_name("uvx")
    return BaseSpec(
        tags=(DEPLOY_BASE,),
        extra={"uv": ExtraFile(uv.read_bytes()), "uvx": ExtraFile(uvx.read_bytes())},
        # libstdc++ and libgcc_s: python:3.11-slim has them,
        # and wheels with C++ inside (grpcio) need them.
        host_paths=(
            Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
            Path("/usr/lib/x86_64-linux-gnu/libgcc_s.so.1"),
            Path("/usr/bin/ssh"),
            Path(CA_BUNDLE),
            DOCKER,
            Path("/usr/bin/skopeo"),
            Path("/etc/containers/policy.json"),
        ),
    )


def postgres_base() -> BaseSpec:
    return BaseSpec(
        tags=(POSTGRES_IMAGE,),
        extra={
            "usr/local/bin/docker-entrypoint.py": ExtraFile(POSTGRES_ENTRYPOINT.encode()),
            # On PATH as in the official image: the healthcheck
            # and the backups docs/operations.md shows.
            **{
                f"usr/local/bin/{tool}": ExtraFile(
                    f'#!/bin/sh\nexec {PG_ROOT}/bin/{tool} "$@"\n'.encode()
                )
                for tool in ("pg_isready", "pg_dump", "pg_restore", "psql")
            },
        },
        host_paths=(PG_ROOT, PG_SHARE, Path("/usr/share/zoneinfo")),
        users=(f"postgres:x:{PG_UID}:{PG_UID}::/var/lib/postgresql:/bin/sh",),
        groups=(f"postgres:x:{PG_UID}:",),
        env=("PGDATA=/var/lib/postgresql/data",),
        cmd=("/usr/local/bin/docker-entrypoint.py",),
    )


def build_lockstep_image(engine: Engine, *, repo: Path, tag: str, timeout_s: float = 1200) -> str:
    """`docker build -f deploy/Dockerfile` of `repo` on
    `engine` from the offline bases; returns the image ID.

    ``--network=host``: uv reaches the package index as it would on a build machine (the only
    network this machine has); ``WITH_IRIS=0``: the sandbox site runs its own iris stand-in.
    """
    engine.ensure_bases(["deploy"])
    argv = [
        str(DOCKER),
        "build",
        "-q",
        "--network=host",
        "-f",
        str(repo / "deploy" / "Dockerfile"),
        "-t",
        tag,
        "--build-arg",
        f"BASE_IMAGE={DEPLOY_BASE}",
        "--build-arg",
        f"UV_IMAGE={DEPLOY_BASE}",
        "--build-arg",
        "SYSTEM_PACKAGES=ready",
        "--build-arg",
        "WITH_IRIS=0",
        "--build-arg",
        f"SSL_CERT_FILE={CA_BUNDLE}",
        str(repo),
    ]
    proc = subprocess.run(
        argv, env=engine.env(), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise EngineError(f"building {tag} from deploy/Dockerfile failed:\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]
