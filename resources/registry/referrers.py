"""Attestations attached to an image in its registry, in cosign's layout: pushing and finding them.

Two ways, as cosign has them (sigstore/cosign at d6d86c224e5899b54f56cbb063b79dc43abc11c2):

- **referrers** (OCI 1.1), where the registry has the API: an artifact manifest whose `subject` is
  the image, `artifactType` application/vnd.in-toto+json, config the empty descriptor `{}`
  (application/vnd.oci.empty.v1+json), one DSSE-envelope layer — pkg/oci/remote/write.go
  `WriteReferrer` / `WriteAttestationsReferrer`;
- **the `.att` tag**, where it has none (distribution 2.8, Debian's docker-registry): an image
  tagged `sha256-<hex>.att` in the image's repository (pkg/oci/remote/remote.go `normalize`,
  `AttestationTag`) whose layers are DSSE envelopes, each annotated `predicateType` and an empty
  `dev.cosignproject.cosign/signature` (pkg/oci/static/signature.go,
  cmd/cosign/cli/attest/attest.go), config an OCI image config over those layers
  (pkg/oci/empty/empty.go on go-containerregistry's empty image, layers appended by
  pkg/oci/mutate/signatures.go `AppendSignatures`). A second attestation of the same image is one
  more layer, as cosign appends it.

The layer is the envelope's JSON itself (media type application/vnd.dsse.envelope.v1+json), which
is what `cosign verify-attestation --key` reads back (the `.att` tag unless told
`--experimental-oci11`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal
from urllib.parse import urljoin

from resources.registry.refs import (
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    RegistryError,
    descriptor_of,
)

if TYPE_CHECKING:
    from resources.registry.base import Registry

DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
INTOTO_ARTIFACT = "application/vnd.in-toto+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
COSIGN_SIGNATURE = "dev.cosignproject.cosign/signature"
CREATED = "org.opencontainers.image.created"
MAX_REFERRER_PAGES = 20
MAX_ENVELOPE_BYTES = 1024 * 1024
_ZERO_TIME = "0001-01-01T00:00:00Z"  # go-containerregistry's empty image: no creation time


def attestation_tag(digest: str) -> str:
    """cosign's tag for a digest's attestations: sha256:abc... -> sha256-abc....att"""
    algorithm, _, hexpart = digest.partition(":")
    return f"{algorithm}-{hexpart}.att"


def parse_referrers(raw: bytes, where: str) -> list[Descriptor]:
    """The referrers API's answer: an OCI image index
    of descriptors (each with its artifactType)."""
    try:
        doc = json.loads(raw)
        if (
            not isinstance(doc, dict)
            or doc.get("schemaVersion") != 2
            or not isinstance(doc.get("manifests", []), list)
        ):
            raise ValueError("not an OCI image index")
        if doc.get("mediaType", OCI_INDEX) != OCI_INDEX:
            raise ValueError(f"mediaType {doc.get('mediaType')!r}")
        return [descriptor_of(m) for m in doc.get("manifests", [])]
    except (ValueError, KeyError, TypeError) as exc:
        raise RegistryError(
            f"{where}: the answer is not an OCI image index of referrers ({exc})"
        ) from None


def next_page(link: str | None, base_url: str) -> str | None:
    """The `Link: <url>; rel="next"` of a paged referrers
    answer, made absolute; None on the last page."""
    for part in (link or "").split(","):
        target, _, params = part.partition(";")
        if target.strip().startswith("<") and 'rel="next"' in params.replace(" ", ""):
            return urljoin(base_url + "/", target.strip()[1:-1])
    return None


def _layer(desc: Descriptor, predicate_type: str) -> dict[str, object]:
    return {
        "mediaType": DSSE_MEDIA_TYPE,
        "size": desc.size,
        "digest": desc.digest,
        "annotations": {COSIGN_SIGNATURE: "", "predicateType": predicate_type},
    }


def _descriptor(desc: Descriptor) -> dict[str, object]:
    out: dict[str, object] = {
        "mediaType": desc.media_type,
        "size": desc.size,
        "digest": desc.digest,
    }
    if desc.annotations:
        out["annotations"] = dict(desc.annotations)
    return out


def att_config(layers: list[dict[str, object]]) -> bytes:
    """The image config cosign's `.att` image carries:
    go-containerregistry's empty image plus the layers."""
    return json.dumps(
        {
            "architecture": "",
            "created": _ZERO_TIME,
            "history": [{"created": _ZERO_TIME} for _ in layers],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
            "config": {},
        },
        separators=(",", ":"),
    ).encode()


def att_manifest(config: Descriptor, layers: list[dict[str, object]]) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": _descriptor(config),
            "layers": layers,
        },
        separators=(",", ":"),
    ).encode()


def referrer_manifest(
    *, subject: Descriptor, config: Descriptor, layer: dict[str, object], created: str
) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {**_descriptor(config), "artifactType": INTOTO_ARTIFACT},
            "layers": [layer],
            "subject": _descriptor(subject),
            "annotations": {CREATED: created},
            "artifactType": INTOTO_ARTIFACT,
        },
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True)
class Attached:
    """Where an attestation went: `how` is the way,
    `reference` the manifest digest or the `.att` tag."""

    how: Literal["referrer", "tag"]
    manifest_digest: str
    reference: str
    envelope_digest: str


def attach(
    registry: Registry,
    *,
    repository: str,
    subject_digest: str,
    envelope: bytes,
    predicate_type: str,
) -> Attached:
    """Push `envelope` as an attestation of `subject_digest`:
    a referrer where the registry has the API,
    else a layer more on cosign's `.att` tag. Read back before it returns."""
    stored = registry.stored(repository=repository, reference=subject_digest)
    if stored is None:
        raise RegistryError(
            f"{repository}@{subject_digest}: no such manifest to attach an attestation to"
        )
    subject = Descriptor(media_type=stored.media_type, digest=stored.digest, size=len(stored.raw))
    blob = registry.push_blob(repository=repository, data=envelope, media_type=DSSE_MEDIA_TYPE)
    layer = _layer(blob, predicate_type)
    if (
        registry.referrers(
            repository=repository, digest=subject_digest, artifact_type=INTOTO_ARTIFACT
        )
        is not None
    ):
        config = registry.push_blob(repository=repository, data=b"{}", media_type=OCI_EMPTY)
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        raw = referrer_manifest(subject=subject, config=config, layer=layer, created=created)
        pushed = registry.push_manifest(
            repository=repository, raw=raw, media_type=OCI_MANIFEST, tag=None
        )
        listed = (
            registry.referrers(
                repository=repository, digest=subject_digest, artifact_type=INTOTO_ARTIFACT
            )
            or []
        )
        if pushed not in {d.digest for d in listed}:
            raise RegistryError(
                f"{repository}@{subject_digest}: the attestation manifest {pushed} was pushed but "
                "the referrers API does not list it: the registry ignored its subject"
            )
        return Attached(
            how="referrer", manifest_digest=pushed, reference=pushed, envelope_digest=blob.digest
        )
    tag = attestation_tag(subject_digest)
    before = registry.manifest(repository=repository, reference=tag)
    layers = [_descriptor(d) for d in before.layers] if before else []
    if blob.digest not in {entry["digest"] for entry in layers}:
        layers.append(layer)
    config_bytes = att_config(layers)
    config = registry.push_blob(repository=repository, data=config_bytes, media_type=OCI_CONFIG)
    pushed = registry.push_manifest(
        repository=repository, raw=att_manifest(config, layers), media_type=OCI_MANIFEST, tag=tag
    )
    if registry.resolve(repository=repository, reference=tag) != pushed:
        raise RegistryError(
            f"{repository}:{tag} does not point at the attestation image {pushed} just pushed: "
            "another writer moved it; run again"
        )
    return Attached(how="tag", manifest_digest=pushed, reference=tag, envelope_digest=blob.digest)


@dataclass(frozen=True)
class FoundEnvelope:
    where: str  # e.g. ":sha256-<hex>.att layer 1" or "referrer sha256:..."
    raw: bytes


def find_envelopes(
    registry: Registry, *, repository: str, digest: str
) -> tuple[list[FoundEnvelope], list[str]]:
    """Every DSSE envelope attached to `digest` (referrers,
    then the `.att` tag), and what could not be read."""
    sources: list[tuple[str, str]] = []
    listed = registry.referrers(repository=repository, digest=digest, artifact_type=INTOTO_ARTIFACT)
    sources += [(f"referrer {d.digest}", d.digest) for d in listed or []]
    tag = attestation_tag(digest)
    sources.append((f":{tag}", tag))
    found, unreadable = [], []
    for where, reference in sources:
        try:
            image = registry.manifest(repository=repository, reference=reference)
            if image is None:
                continue
            envelopes = [d for d in image.layers if d.media_type == DSSE_MEDIA_TYPE]
            if not envelopes:
                unreadable.append(f"{where}: no {DSSE_MEDIA_TYPE} layer")
            for n, desc in enumerate(envelopes, start=1):
                raw = registry.read_blob(
                    repository=repository, descriptor=desc, limit=MAX_ENVELOPE_BYTES
                )
                found.append(FoundEnvelope(where=f"{where} layer {n}", raw=raw))
        except RegistryError as exc:
            unreadable.append(f"{where}: {exc}")
    return found, unreadable
