"""Signed attestations of verified builds: written when `tpu/verified_image` materializes, required
before `tpu/floating_tag` moves to a build.

The Dagster record of "verified" can be written by whoever can write the instance; the attestation
cannot be made without the site's signing key. So a move of the floating tag is judged on the
registry's copy of the signed statement, not on the record: the statement must be signed by a key
of `[attest] trusted_keys`, be about the target digest, say every verification passed, and name
the same consumer and harbor commits as the record the move was chosen from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg

from resources.attest import (
    SLSA_PROVENANCE_V1,
    AttestError,
    SigningKey,
    sign_statement,
    verify_envelope,
)
from resources.registry import Registry
from resources.registry.referrers import attach, attestation_tag, find_envelopes
from resources.site.load import trusted_keys
from resources.site.schema import SiteConfig
from tpu_assets.promotion import PromotionRefused
from tpu_assets.provenance import CONSUMER_DEPENDENCY, dependency_commit
from tpu_assets.rollback import VerifiedBuild

UNSIGNED = (
    "none: the site has no [attest] table, so nothing is signed and promotion checks no signature "
    "(anyone who can write the Dagster instance can mark a build verified)"
)


class AttestationRefused(PromotionRefused):
    """The target has no attestation promotion can trust; the floating tag was not touched."""


@dataclass(frozen=True)
class Attestation:
    """What `tpu/verified_image` pushed, for its metadata."""

    keyid: str
    how: str
    reference: str
    manifest_digest: str

    def metadata(self) -> dict[str, dg.MetadataValue]:
        way = "referrers API" if self.how == "referrer" else f"cosign tag :{self.reference}"
        return {
            "attestation": dg.MetadataValue.text(
                f"signed by key {self.keyid[:16]}, attached via {way}"
            ),
            "attestation_manifest": dg.MetadataValue.text(self.manifest_digest),
            "attestation_keyid": dg.MetadataValue.text(self.keyid),
        }


def attest(
    site: SiteConfig,
    registry: Registry,
    key: SigningKey,
    *,
    repository: str,
    digest: str,
    statement: dict[str, Any],
) -> Attestation:
    """Sign `statement` and attach it to the image; refuse a key promotion would not trust."""
    trusted = trusted_keys(site)
    if key.keyid not in {k.keyid for k in trusted}:
        raise AttestError(
            f"the key in {key.source} (keyid {key.keyid[:16]}) is not one of [attest] trusted_keys "
            f"({', '.join(k.keyid[:16] for k in trusted)}): promotion would refuse what it "
            "signs. Add its "
            "public key to trusted_keys, or export the right key"
        )
    envelope = sign_statement(statement, key).to_json()
    put = attach(
        registry,
        repository=repository,
        subject_digest=digest,
        envelope=envelope,
        predicate_type=SLSA_PROVENANCE_V1,
    )
    return Attestation(
        keyid=key.keyid, how=put.how, reference=put.reference, manifest_digest=put.manifest_digest
    )


def _record_disagrees(
    predicate: dict[str, Any], target: VerifiedBuild | None, harbor_package: str
) -> str | None:
    failed = [
        name
        for name, v in (predicate.get("verification") or {}).items()
        if not (isinstance(v, dict) and v.get("passed") is True)
    ]
    if not predicate.get("verification"):
        return "it records no verification results"
    if failed:
        return f"it records failed verifications: {', '.join(failed)}"
    if target is None:
        return None
    consumer = dependency_commit(predicate, CONSUMER_DEPENDENCY)
    if consumer != target.build:
        return (
            f"it attests consumer commit {consumer or 'none'}, but the verified record says "
            f"{target.build}"
        )
    harbor = dependency_commit(predicate, harbor_package)
    if harbor != target.harbor_commit:
        return (
            f"it attests harbor {harbor or 'none'}, but the verified record says "
            f"{target.harbor_commit}"
        )
    return None


def require_attestation(
    site: SiteConfig,
    registry: Registry,
    *,
    repository: str,
    digest: str,
    target: VerifiedBuild | None,
) -> str:
    """Why the floating tag may move to `digest` (a line
    for the log and the metadata); AttestationRefused
    with every envelope's reason when none holds. Without
    [attest]: UNSIGNED, and nothing is checked."""
    if site.attest is None:
        return UNSIGNED
    keys = trusted_keys(site)
    envelopes, unreadable = find_envelopes(registry, repository=repository, digest=digest)
    reasons = list(unreadable)
    for found in envelopes:
        try:
            verified = verify_envelope(found.raw, trusted=keys, digest=digest)
        except AttestError as exc:
            reasons.append(f"{found.where}: {exc}")
            continue
        if why := _record_disagrees(verified.predicate, target, site.tpu.harbor_package):
            reasons.append(f"{found.where}: signed by {verified.keyid[:16]}, but {why}")
            continue
        return (
            f"attested: {found.where} signed by trusted key {verified.keyid[:16]} "
            f"({verified.key_source})"
        )
    tag = site.tpu.floating_tag
    if not envelopes and not unreadable:
        reasons.append(
            f"no attestation is attached to it (no referrer, no :{attestation_tag(digest)})"
        )
    raise AttestationRefused(
        f"refused to move :{tag} to {digest}: no valid attestation by a trusted key ([attest] "
        "trusted_keys); "
        f":{tag} was not touched.\n"
        + "\n".join(f"  - {r}" for r in reasons)
        + "\nRe-run tpu/verified_image for the build to verify and sign it again"
    )
