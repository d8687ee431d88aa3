"""OCI registries: resolve, fetch, retag by exact bytes,
compare-and-swap tag moves, read files from layers.

Written by hand on purpose: oras-py re-serialises a manifest on retag (the digest changes) and
python-dxf reports the config digest as the image digest; a retag must PUT the exact bytes.

Two backends behind one interface (the `project_fully_featured` pattern): `HttpRegistry` speaks the
distribution API (ghcr with a bearer token exchanged from an env var; anonymous plain HTTP for a
registry on 127.0.0.1/localhost), `LayoutRegistry` is an OCI image-layout directory per repository
for the embedded sandbox.

    refs.py       names, digests, media types, manifests
    layers.py     the pure layer walk: one scan answers many paths and globs
    cache.py      the on-disk blob cache (digest-keyed, LRU-bounded)
    base.py       the abstract Registry and its public operations
    transport.py  retries, resumable bodies, challenge and error parsing
    http.py       HttpRegistry
    layout.py     LayoutRegistry
    backends.py   registry_for(site)

Each name here loads its module when first asked for, so loading a location imports only what its
definitions use (tpu: `backends`, `base` and what `base` imports; jovian: none of it): the HTTP
client and the layer walk load with the first registry call that needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from resources.registry.backends import registry_for
    from resources.registry.base import ImageScan, PushCheck, Registry
    from resources.registry.cache import BlobCache
    from resources.registry.http import HttpRegistry
    from resources.registry.layers import MAX_SYMLINK_HOPS, GlobQuery
    from resources.registry.layout import LayoutRegistry
    from resources.registry.refs import (
        DOCKER_LAYER_GZIP,
        DOCKER_LIST,
        DOCKER_MANIFEST,
        IMAGE_MANIFESTS,
        INDEXES,
        MAX_CONFIG_BYTES,
        MAX_MANIFEST_BYTES,
        OCI_CONFIG,
        OCI_INDEX,
        OCI_LAYER_GZIP,
        OCI_LAYER_TAR,
        OCI_LAYER_ZSTD,
        OCI_MANIFEST,
        REF_NAME,
        Descriptor,
        FileRead,
        ImageRef,
        Manifest,
        PinnedTagTaken,
        RawManifest,
        RegistryError,
        TagGuard,
        TagMoved,
        digest_of,
        is_digest,
    )

__all__ = [
    "DOCKER_LAYER_GZIP",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "IMAGE_MANIFESTS",
    "INDEXES",
    "MAX_CONFIG_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_SYMLINK_HOPS",
    "OCI_CONFIG",
    "OCI_INDEX",
    "OCI_LAYER_GZIP",
    "OCI_LAYER_TAR",
    "OCI_LAYER_ZSTD",
    "OCI_MANIFEST",
    "REF_NAME",
    "BlobCache",
    "Descriptor",
    "FileRead",
    "GlobQuery",
    "HttpRegistry",
    "ImageRef",
    "ImageScan",
    "LayoutRegistry",
    "Manifest",
    "PinnedTagTaken",
    "PushCheck",
    "RawManifest",
    "Registry",
    "RegistryError",
    "TagGuard",
    "TagMoved",
    "digest_of",
    "is_digest",
    "registry_for",
]

_MODULE_OF = {
    name: module
    for module, names in {
        "backends": ["registry_for"],
        "base": ["ImageScan", "PushCheck", "Registry"],
        "cache": ["BlobCache"],
        "http": ["HttpRegistry"],
        "layers": ["MAX_SYMLINK_HOPS", "GlobQuery"],
        "layout": ["LayoutRegistry"],
        "refs": [
            "DOCKER_LAYER_GZIP",
            "DOCKER_LIST",
            "DOCKER_MANIFEST",
            "IMAGE_MANIFESTS",
            "INDEXES",
            "MAX_CONFIG_BYTES",
            "MAX_MANIFEST_BYTES",
            "OCI_CONFIG",
            "OCI_INDEX",
            "OCI_LAYER_GZIP",
            "OCI_LAYER_TAR",
            "OCI_LAYER_ZSTD",
            "OCI_MANIFEST",
            "REF_NAME",
            "Descriptor",
            "FileRead",
            "ImageRef",
            "Manifest",
            "PinnedTagTaken",
            "RawManifest",
            "RegistryError",
            "TagGuard",
            "TagMoved",
            "digest_of",
            "is_digest",
        ],
    }.items()
    for name in names
}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value
