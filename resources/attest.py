"""Signed attestations: in-toto Statement v1 in a
DSSE envelope, signed with ECDSA P-256 (pure; no I/O).

The envelope is the DSSE spec's (github.com/secure-systems-lab/dsse, protocol.md): the signature is
over PAE(payloadType, payload) = "DSSEv1 <len type> <type> <len body> <body>", the payload and
signatures base64 (standard alphabet) in JSON. That is what `cosign verify-attestation --key` and
securesystemslib's `dsse.Envelope.verify` check, so a signature made here verifies there.

A key is always an ECDSA P-256 key (cosign's default, and what `cosign generate-key-pair` makes);
a key id is the sha256 of the public key's DER SubjectPublicKeyInfo, in hex. The private key's PEM
comes from an env var and is never put in a message: a key that does not load is refused naming
the variable, never the value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, ValidationError

from resources.errors import LockstepError
from resources.model import Model

# cryptography loads with the first key, not with a code location.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

STATEMENT_V1 = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_ENVELOPE_BYTES = 1024 * 1024


class AttestError(LockstepError):
    """A key or an envelope lockstep cannot use; the message never holds a private key."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's Pre-Authentication Encoding: what is signed,
    so the type cannot be swapped under a signature."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def keyid_of(public: ec.EllipticCurvePublicKey) -> str:
    from cryptography.hazmat.primitives import serialization

    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


@dataclass(frozen=True)
class TrustedKey:
    """A public key promotion trusts; `source` says
    where the site named it (a path, or "inline #N")."""

    public: ec.EllipticCurvePublicKey = field(repr=False)
    source: str

    @property
    def keyid(self) -> str:
        return keyid_of(self.public)

    def verifies(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            self.public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True

    def pem(self) -> str:
        from cryptography.hazmat.primitives import serialization

        return self.public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()


class SigningKey:
    """The private key attestations are signed with. Its repr and str never show the key."""

    def __init__(self, private: ec.EllipticCurvePrivateKey, source: str) -> None:
        self._private = private
        self.source = source

    def __repr__(self) -> str:
        return f"SigningKey({self.source}, keyid={self.keyid[:16]})"

    __str__ = __repr__

    @property
    def public(self) -> TrustedKey:
        return TrustedKey(public=self._private.public_key(), source=self.source)

    @property
    def keyid(self) -> str:
        return keyid_of(self._private.public_key())

    def sign(self, data: bytes) -> bytes:
        """An ASN.1 DER ECDSA signature over sha256(data), as DSSE's ecdsa signers write it."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._private.sign(data, ec.ECDSA(hashes.SHA256()))


def _p256(key: object, what: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    if (
        not isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey)
        or key.curve.name != "secp256r1"
    ):
        kind = getattr(getattr(key, "curve", None), "name", None) or type(
            key
        ).__name__.removeprefix("_")
        raise AttestError(
            f"{what} is a {kind} key; lockstep signs and verifies with ECDSA P-256 keys only "
            "(`cosign generate-key-pair` or `openssl ecparam -name prime256v1 -genkey` make one)"
        )


def load_signing_key(pem: str, *, env: str) -> SigningKey:
    """The PEM private key from $`env` (PKCS#8 or SEC1,
    unencrypted). Errors name `env`, never the value.

    A one-line form with literal `\\n` between the PEM's lines is read too: an env file (docker
    compose's `.env`, a Kubernetes `--from-env-file`) holds one line per variable.
    """
    from cryptography.hazmat.primitives import serialization

    if "\n" not in pem.strip() and "\\n" in pem:
        pem = pem.replace("\\n", "\n")
    if not pem.strip():
        raise AttestError(
            f"${env} is unset or empty: export it with the ECDSA P-256 private key (PEM) that "
            "signs attestations ([attest] key_env)"
        )
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):
        # cryptography's message can quote the input's framing: say what is wrong in our words only.
        raise AttestError(
            f"${env} does not hold an unencrypted PEM private key: export the key file's "
            "whole text (-----BEGIN PRIVATE KEY----- or -----BEGIN EC PRIVATE KEY-----)"
        ) from None
    _p256(key, f"${env}")
    return SigningKey(key, f"${env}")  # type: ignore[arg-type]


def load_public_key(pem: bytes, *, source: str) -> TrustedKey:
    """A PEM public key (SubjectPublicKeyInfo, as `cosign.pub`); AttestError naming `source`."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise AttestError(
            f"{source} is not a PEM public key (-----BEGIN PUBLIC KEY-----): {exc}"
        ) from None
    _p256(key, source)
    return TrustedKey(public=key, source=source)  # type: ignore[arg-type]


# -- the envelope ----------------------------------------------------------------------------------


class DsseSignature(Model):
    model_config = ConfigDict(extra="ignore")
    keyid: str = ""
    sig: str


class Envelope(Model):
    """A DSSE envelope as JSON carries it (payload and sig base64)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    payload_type: str = Field(alias="payloadType")
    payload: str
    signatures: list[DsseSignature]

    def to_json(self) -> bytes:
        return json.dumps(self.model_dump(by_alias=True), separators=(",", ":")).encode()

    def body(self) -> bytes:
        return base64.b64decode(self.payload, validate=True)


def statement(*, subject_name: str, digest: str, predicate: dict[str, Any]) -> dict[str, Any]:
    """An in-toto Statement v1 about one image digest with a SLSA provenance v1 predicate."""
    return {
        "_type": STATEMENT_V1,
        "subject": [{"name": subject_name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": SLSA_PROVENANCE_V1,
        "predicate": predicate,
    }


def sign_statement(doc: dict[str, Any], key: SigningKey) -> Envelope:
    payload = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    sig = key.sign(pae(INTOTO_PAYLOAD_TYPE, payload))
    return Envelope(
        payloadType=INTOTO_PAYLOAD_TYPE,
        payload=base64.b64encode(payload).decode(),
        signatures=[DsseSignature(keyid=key.keyid, sig=base64.b64encode(sig).decode())],
    )


@dataclass(frozen=True)
class Verified:
    """An envelope whose signature a trusted key
    verified and whose statement is about the digest."""

    keyid: str
    key_source: str
    statement: dict[str, Any]

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement.get("predicate") or {}


def verify_envelope(raw: bytes, *, trusted: list[TrustedKey], digest: str) -> Verified:
    """Check one envelope: DSSE signature by a trusted key first, then the statement it signs.

    Raises AttestError saying what is wrong. Nothing in the payload is read before the signature
    holds: an unsigned claim is never parsed into a decision.
    """
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise AttestError(f"the envelope is {len(raw)} bytes, over {MAX_ENVELOPE_BYTES}")
    try:
        env = Envelope.model_validate_json(raw)
        body = env.body()
    except (ValidationError, ValueError, binascii.Error):
        raise AttestError(
            "not a DSSE envelope (payloadType, payload, signatures as base64 JSON)"
        ) from None
    if env.payload_type != INTOTO_PAYLOAD_TYPE:
        raise AttestError(f"payloadType is {env.payload_type!r}, not {INTOTO_PAYLOAD_TYPE}")
    signed = pae(env.payload_type, body)
    seen = []
    for s in env.signatures:
        try:
            sig = base64.b64decode(s.sig, validate=True)
        except (ValueError, binascii.Error):
            continue
        seen.append(s.keyid[:16] or "(no keyid)")
        # The keyid is a hint nobody signed: every trusted key is tried on every signature.
        for key in trusted:
            if key.verifies(sig, signed):
                return _about(body, digest, key)
    if not seen:
        raise AttestError("the envelope has no signature")
    raise AttestError(
        f"no signature verifies with a trusted key (signatures by keyid {', '.join(seen)}; "
        "trusted: "
        f"{', '.join(k.keyid[:16] for k in trusted)}): signed by another key, or changed after "
        "signing"
    )


def _about(body: bytes, digest: str, key: TrustedKey) -> Verified:
    try:
        doc = json.loads(body)
    except ValueError:
        raise AttestError(f"signed by {key.keyid[:16]}, but the payload is not JSON") from None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_V1:
        raise AttestError(
            f"signed by {key.keyid[:16]}, but the payload is not an in-toto Statement v1"
        )
    if doc.get("predicateType") != SLSA_PROVENANCE_V1:
        raise AttestError(
            f"signed by {key.keyid[:16]}, but its predicateType is {doc.get('predicateType')!r}, "
            f"not {SLSA_PROVENANCE_V1}"
        )
    want = digest.removeprefix("sha256:")
    subjects = [
        s.get("digest", {}).get("sha256") for s in doc.get("subject") or [] if isinstance(s, dict)
    ]
    if want not in subjects:
        named = ", ".join(f"sha256:{s}" for s in subjects if isinstance(s, str)) or "nothing"
        raise AttestError(
            f"signed by {key.keyid[:16]}, but it attests {named}, not {digest}: an envelope "
            "made for another image"
        )
    return Verified(keyid=key.keyid, key_source=key.source, statement=doc)
