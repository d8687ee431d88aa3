"""Unpack an image's layers into a directory (the
sandbox's stand-in for a container runtime pulling it).

Run by the fake iris before a non-build job: TASK_IMAGE names the image, IMAGE_ROOT the target.
Layers are applied bottom-up with OCI whiteouts honoured, so the job sees exactly the image.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from resources.registry import ImageRef, Registry, registry_for
from resources.site.load import load_site


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def unpack(registry: Registry, *, repository: str, reference: str, root: Path) -> int:
    """Apply every layer of the image to `root`; returns the number of layers."""
    manifest = registry.manifest(repository=repository, reference=reference)
    if manifest is None:
        raise SystemExit(f"{repository}@{reference}: not in the registry")
    root.mkdir(parents=True, exist_ok=True)
    for layer in manifest.layers:
        # A seekable copy of the layer: a hard link whose target cannot be linked is extracted again
        # from the archive, which a stream cannot do.
        with (
            registry.open_blob(repository=repository, digest=layer.digest) as blob,
            tempfile.TemporaryFile() as copy,
        ):
            shutil.copyfileobj(blob, copy)
            copy.seek(0)
            with tarfile.open(fileobj=copy, mode="r:*") as tar:
                _apply(tar, root)
    return len(manifest.layers)


def _apply(tar: tarfile.TarFile, root: Path) -> None:
    """One layer over `root`: OCI whiteouts remove,
    everything else is extracted (tar filter: nothing
    lands outside `root`; absolute symlink targets are kept, as a container runtime keeps them)."""
    with tar:
        for member in tar:
            rel = Path(member.name.lstrip("./"))
            # a whiteout must not remove anything outside root
            if rel.is_absolute() or ".." in rel.parts:
                raise SystemExit(f"layer member {member.name!r} leaves the image root")
            if rel.name == ".wh..wh..opq":
                for child in (root / rel.parent).glob("*"):
                    _remove(child)
                continue
            if rel.name.startswith(".wh."):
                _remove(root / rel.parent / rel.name.removeprefix(".wh."))
                continue
            tar.extract(member, root, filter="tar")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--site", required=True, type=Path)
    args = parser.parse_args(argv)
    ref = ImageRef.parse(os.environ["TASK_IMAGE"])
    root = Path(os.environ["IMAGE_ROOT"])
    count = unpack(
        registry_for(load_site(args.site)),
        repository=ref.repository,
        reference=ref.reference,
        root=root,
    )
    print(f"unpacked {count} layers of {ref} into {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
