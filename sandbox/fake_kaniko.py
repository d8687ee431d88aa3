"""The sandbox's `/kaniko/executor`: kaniko's command
line, a real Docker engine's build, a real push.

kaniko itself cannot be had here (its image lives on gcr.io, and it wants to own a container's root
filesystem); a real Docker engine can. This takes the flags the consumer's script passes, as the
executor names them (GoogleContainerTools/kaniko ``cmd/executor/cmd/root.go``; the maintained fork
osscontainertools/kaniko ``cmd/executor/cmd/root.go`` at 6bcc934434e351c80b979d8bf34828810e22bae1):
``--context`` (``dir://`` only), ``--dockerfile`` (relative to the context), ``--destination``
(repeatable), ``--cache``, ``--cache-repo``, ``--single-snapshot``, ``--skip-unused-stages``,
``--compressed-caching``; booleans as pflag takes them (``--flag`` or ``--flag=<bool>``). Like the
fork it prints ``WARN[0000] Flag --skip-unused-stages is deprecated. ...`` for
``--skip-unused-stages`` (a no-op there since v1.27.0: skipping unused stages is the default).

It BUILDS the consumer's own Dockerfile from the context with the sandbox's TPU build engine
(sandbox/kaniko_build.py: BuildKit, its layer cache, ``--network=host`` to the sandbox's git
daemon), and pushes ONLY to its destinations, authenticated from ``$DOCKER_CONFIG/config.json``: a
destination whose registry has no ``auths`` entry there is refused, as a registry refuses an
anonymous push, and an HTTP registry gets that entry's user and password (so the push token the job
was given is what the registry checks). A destination on a registry the sandbox does not hold
(ghcr.io, from a script that hard-codes it) fails the way a push there would from here.

``--cache-repo``: kaniko pushes cached layers there and pulls them on the next build. Here the cache
is the build engine's own layer cache (one engine per sandbox, kept between builds), so the cache
repo is validated (a repository reference on the destinations' registry, never a tag or digest, the
way the consumer's script names it) and reported, but nothing is pushed to it: ``--cache=false`` is
what turns the cache off.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import os
import sys
from pathlib import Path

from resources.registry import HttpRegistry, ImageRef, LayoutRegistry, RegistryError, registry_for
from resources.site.load import load_site
from sandbox import kaniko_build
from sandbox.engines import EngineError
from sandbox.git_server import GitServer

# osscontainertools/kaniko cmd/executor/cmd/root.go
# (6bcc9344), checkNoDeprecatedFlags: logrus.Warn(...)
SKIP_UNUSED_STAGES_WARNING = (
    "Flag --skip-unused-stages is deprecated. This is the new default behaviour. "
    "If you want to build multiple independent stages pass them as --target instead"
)
BOOL_FLAGS = ("--cache", "--single-snapshot", "--skip-unused-stages", "--compressed-caching")
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}  # Go's strconv.ParseBool, which pflag uses
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(
        f'invalid argument "{text}": strconv.ParseBool: parsing "{text}": invalid syntax'
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="/kaniko/executor", description="kaniko's executor (lockstep sandbox)"
    )
    p.add_argument(
        "--site",
        required=True,
        type=Path,
        help="(sandbox) the site whose registry receives the push",
    )
    p.add_argument("--context", "-c", default="/workspace/")
    p.add_argument("--dockerfile", "-f", default="Dockerfile")
    p.add_argument("--destination", "-d", action="append", default=[])
    p.add_argument("--cache", type=_bool, default=False)
    p.add_argument("--cache-repo", default="")
    p.add_argument("--single-snapshot", type=_bool, default=False)
    p.add_argument("--skip-unused-stages", type=_bool, default=False)
    p.add_argument("--compressed-caching", type=_bool, default=True)
    return p


def _normalize(argv: list[str]) -> list[str]:
    """pflag's bool flags take no separate value: a bare ``--cache`` means ``--cache=true``."""
    return [f"{a}=true" if a in BOOL_FLAGS else a for a in argv]


def _auth_for(host: str) -> str | None:
    """config.json's base64 `user:password` for `host`, when it decodes to a user and a password."""
    config = Path(os.environ.get("DOCKER_CONFIG", "/kaniko/.docker")) / "config.json"
    try:
        auth = json.loads(config.read_text(encoding="utf-8")).get("auths", {})[host]["auth"]
        user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None
    return auth if sep and user and password else None


def _err(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 1


def _within(root: Path, rel: str) -> Path | None:
    """`rel` under `root` (kaniko resolves --dockerfile
    against the context); None when it escapes it."""
    path = (root / rel).resolve()
    return path if path.is_relative_to(root.resolve()) else None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(_normalize(list(sys.argv[1:] if argv is None else argv)))
    if args.skip_unused_stages:
        print(f"WARN[0000] {SKIP_UNUSED_STAGES_WARNING}", file=sys.stderr, flush=True)
    if not args.destination:
        return _err("you must provide --destination, or use --no-push")
    if not args.context.startswith("dir://"):
        return _err(f"context {args.context}: the sandbox kaniko reads dir:// contexts only")
    # The iris bundle is /app in the task; in the sandbox it is the job's app/ directory, and the
    # task's only files: a context elsewhere would be the host's.
    context = args.context.removeprefix("dir://").rstrip("/")
    if context != "/app" and not context.startswith("/app/"):
        return _err(
            f"error resolving source context: {args.context}: the task's files are under /app"
        )
    app = _within(Path(os.environ["APP_DIR"]), context.removeprefix("/app").lstrip("/") or ".")
    if app is None or not app.is_dir():
        return _err(f"error resolving source context: {args.context} is not a directory")
    dockerfile = _within(app, args.dockerfile)
    if dockerfile is None or not dockerfile.is_file():
        return _err(
            f"error resolving dockerfile path: {args.dockerfile} is not a file in the context"
        )
    site = load_site(args.site)
    registry = registry_for(site)
    home = ImageRef.parse(site.tpu.image).registry
    refs: list[tuple[ImageRef, str]] = []
    for destination in args.destination:
        try:
            ref = ImageRef.parse(destination)
        except (RegistryError, ValueError) as exc:
            return _err(f"invalid --destination {destination!r}: {exc}")
        if ref.registry != home:
            return _err(
                f"pushing to {destination}: dial tcp: lookup {ref.registry}: no such host "
                f"(the sandbox registry is {home})"
            )
        auth = _auth_for(ref.registry)
        if auth is None:
            return _err(
                f"pushing to {destination}: UNAUTHORIZED: no credentials for {ref.registry} in "
                "$DOCKER_CONFIG/config.json"
            )
        if ref.tag is None or ref.digest is not None:
            return _err(
                f"pushing to {destination}: a destination is a tag (kaniko cannot push to a digest)"
            )
        refs.append((ref, auth))
    if args.cache_repo:
        try:
            cache = ImageRef.parse(args.cache_repo)
        except (RegistryError, ValueError) as exc:
            return _err(f"cache flags invalid: --cache-repo {args.cache_repo!r}: {exc}")
        if cache.registry != home or cache.tag is not None or cache.digest is not None:
            return _err(
                f"cache flags invalid: --cache-repo {args.cache_repo} must be a repository on "
                f"{home}"
            )
        print(
            f"INFO[0000] Using cache repo {args.cache_repo}: the build engine's layer cache "
            f"({'on' if args.cache else 'off: --cache=false'})",
            flush=True,
        )
    sandbox_root = args.site.resolve().parent
    try:
        GitServer(sandbox_root).ensure()  # the Dockerfile's harbor URL is fetched through it
        engine = kaniko_build.prepare(sandbox_root)
        local = (
            "lockstep-kaniko/"
            + hashlib.sha256(str(app.resolve()).encode()).hexdigest()[:16]
            + ":build"
        )
        image = kaniko_build.build(
            engine, context=app, dockerfile=dockerfile, tag=local, cache=args.cache
        )
        if args.single_snapshot:
            print("INFO[0000] Taking snapshot of full filesystem...", flush=True)
            image = kaniko_build.single_snapshot(engine, image=image, tag=local + "-snapshot")
        for ref, auth in refs:
            print(f"INFO Pushing image to {ref}", flush=True)
            if isinstance(registry, LayoutRegistry):
                digest = kaniko_build.push_layout(
                    engine, image=image, destination=ref, registry=registry
                )
            elif isinstance(registry, HttpRegistry):
                digest = kaniko_build.push_http(engine, image=image, destination=ref, auth=auth)
            else:
                return _err(
                    f"pushing to {ref}: the sandbox kaniko pushes to layout and http registries "
                    "only"
                )
            print(f"INFO Pushed {ref}@{digest}", flush=True)
    except (kaniko_build.BuildError, EngineError, RegistryError, OSError) as exc:
        return _err(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
