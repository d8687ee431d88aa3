"""The sandbox's `/kaniko/executor`: takes kaniko's own command line and pushes a real image.

kaniko cannot run on one machine without a container runtime; everything around it can. This reads
the flags the consumer's script passes, as the real executor names them (GoogleContainerTools/kaniko
`cmd/executor/cmd/root.go`: ``--context``, ``--dockerfile``, ``--destination`` (repeatable), ``--cache``,
``--cache-repo``, ``--single-snapshot``, ``--skip-unused-stages``, ``--compressed-caching``), and,
like the real one, pushes ONLY to the destinations it was given and authenticates with
``$DOCKER_CONFIG/config.json``: a destination whose registry has no ``auths`` entry there is refused,
as a registry would refuse an anonymous push, and a registry server that wants a login gets that
entry's user and password (so the push token the job was given is what the registry checks). The image itself is built by sandbox/image_builder.py.
A destination on a registry the sandbox does not hold (ghcr.io, from a script that hard-codes it)
fails the way a push there would from here.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import sys
from pathlib import Path

from resources.registry import HttpRegistry, ImageRef, Registry, RegistryError, registry_for
from resources.site import load_site
from sandbox.image_builder import build_and_push


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="/kaniko/executor", description=__doc__)
    p.add_argument("--site", required=True, type=Path, help="(sandbox) the site whose registry receives the push")
    p.add_argument("--context", required=True)
    p.add_argument("--dockerfile", default="Dockerfile")
    p.add_argument("--destination", action="append", default=[])
    p.add_argument("--cache", default="false")
    p.add_argument("--cache-repo", default="")
    p.add_argument("--single-snapshot", action="store_true")
    p.add_argument("--skip-unused-stages", action="store_true")
    p.add_argument("--compressed-caching", default="true")
    return p


def _auth_for(host: str) -> str | None:
    """The `user:password` kaniko would send to `host`, from $DOCKER_CONFIG/config.json."""
    config = Path(os.environ.get("DOCKER_CONFIG", "/kaniko/.docker")) / "config.json"
    try:
        auths = json.loads(config.read_text(encoding="utf-8")).get("auths", {})
        return base64.b64decode(auths[host]["auth"], validate=True).decode()
    except (OSError, ValueError, KeyError, TypeError, binascii.Error):
        return None


def _as_pusher(registry: Registry, auth: str) -> Registry:
    """The registry as kaniko reaches it: logged in with the config.json credentials, never the site's
    own token (which the job's environment does not hold, as on a real cluster)."""
    if not isinstance(registry, HttpRegistry):
        return registry
    user, password = auth.split(":", 1)
    return HttpRegistry(host=registry.host, username=user, token=password, timeout_s=registry.timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.destination:
        print("error: no --destination given (kaniko would need --no-push)", file=sys.stderr)
        return 1
    if not args.context.startswith("dir://"):
        print(f"error: context {args.context}: the sandbox kaniko reads dir:// contexts only", file=sys.stderr)
        return 1
    context = args.context.removeprefix("dir://")
    # The iris bundle is /app in the task; in the sandbox it is the job's app/ directory.
    app = Path(os.environ["APP_DIR"]) if context.rstrip("/") == "/app" else Path(context)
    site = load_site(args.site)
    registry = registry_for(site)
    home = ImageRef.parse(site.tpu.image).registry
    for destination in args.destination:
        ref = ImageRef.parse(destination)
        if ref.registry != home:
            print(f"error: pushing to {destination}: dial tcp: lookup {ref.registry}: no such host "
                  f"(the sandbox registry is {home})", file=sys.stderr)  # fmt: skip
            return 1
        auth = _auth_for(ref.registry)
        if not auth or ":" not in auth or not auth.split(":", 1)[1]:
            print(f"error: pushing to {destination}: UNAUTHORIZED: no credentials for {ref.registry} in "
                  f"$DOCKER_CONFIG/config.json", file=sys.stderr)  # fmt: skip
            return 1
        print(f"INFO Pushing image to {destination}", flush=True)
        try:
            digest = build_and_push(app_dir=app, destination=destination, site=site,
                                    registry=_as_pusher(registry, auth), single_snapshot=args.single_snapshot)  # fmt: skip
        except RegistryError as exc:
            print(f"error: pushing to {destination}: {exc}", file=sys.stderr)
            return 1
        print(f"INFO Pushed {destination}@{digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
