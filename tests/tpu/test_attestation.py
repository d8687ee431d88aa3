"""Signed attestations: `tpu/verified_image` signs an in-toto statement (DSSE, ECDSA P-256) and
attaches it to the image in cosign's layout; `promote_tpu`
refuses a target without a valid one by a trusted key.

The registry is a real docker-registry (distribution 2.8: no referrers API, so cosign's `.att` tag
is what it holds); the independent verifier is securesystemslib's DSSE Envelope.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from resources.attest import (
    INTOTO_PAYLOAD_TYPE,
    SLSA_PROVENANCE_V1,
    AttestError,
    Envelope,
    SigningKey,
    load_signing_key,
    pae,
    sign_statement,
    statement,
    verify_envelope,
)
from resources.errors import FileFormatError
from resources.registry import HttpRegistry, RegistryError
from resources.registry.referrers import (
    COSIGN_SIGNATURE,
    DSSE_MEDIA_TYPE,
    att_config,
    att_manifest,
    attestation_tag,
    next_page,
    parse_referrers,
)
from resources.registry.refs import OCI_CONFIG, OCI_MANIFEST
from resources.site.load import load_site
from resources.site.resource import SiteResource
from sandbox.world import SANDBOX_ATTEST_KEY_ENV, Sandbox, advance_harbor, sandbox_attest_key, up
from tests.conftest import sandbox_resources, stop_sandbox
from tests.support.registry_server import RegistryServer
from tests.support.runs import Pipeline, failure_message, metadata
from tpu_assets.history import VERIFIED_IMAGE

pytestmark = pytest.mark.heavy(70)  # seconds, about: one build, then promotions


def _new_key() -> SigningKey:
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    return load_signing_key(pem, env="TEST_KEY")


def _sslib_key(key: SigningKey) -> SSlibKey:
    # securesystemslib matches signatures to keys by keyid: lockstep's is the SPKI sha256.
    return SSlibKey.from_crypto(key.public.public, keyid=key.keyid)


def _tampered(envelope: bytes, change) -> bytes:  # type: ignore[no-untyped-def]
    doc = json.loads(envelope)
    body = json.loads(base64.b64decode(doc["payload"]))
    change(body)
    doc["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    return json.dumps(doc).encode()


DIGEST = "sha256:" + "ab" * 32
PREDICATE = {"buildDefinition": {"buildType": "t"}, "verification": {"smoke": {"passed": True}}}


# -- the envelope, without a registry --------------------------------------------------------------


def test_pae_is_the_dsse_specs_encoding() -> None:
    # protocol.md's own example.
    assert (
        pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_an_independent_verifier_accepts_lockstep_envelopes_and_refuses_a_tampered_one() -> None:
    key = _new_key()
    raw = sign_statement(
        statement(subject_name="r/x", digest=DIGEST, predicate=PREDICATE), key
    ).to_json()
    ours = SslibEnvelope.from_dict(json.loads(raw))
    assert ours.payload_type == INTOTO_PAYLOAD_TYPE
    assert set(ours.verify([_sslib_key(key)], 1)) == {key.keyid}
    assert json.loads(ours.payload)["subject"][0]["digest"]["sha256"] == DIGEST.removeprefix(
        "sha256:"
    )
    bad = SslibEnvelope.from_dict(
        json.loads(_tampered(raw, lambda b: b["predicate"].update(forged=True)))
    )
    with pytest.raises(VerificationError):
        bad.verify([_sslib_key(key)], 1)
    with pytest.raises(VerificationError):  # and another key does not verify lockstep's
        ours.verify([SSlibKey.from_crypto(_new_key().public.public, keyid=key.keyid)], 1)


def test_an_envelope_signed_by_securesystemslib_verifies_in_lockstep() -> None:
    from securesystemslib.signer import CryptoSigner

    private = ec.generate_private_key(ec.SECP256R1())
    signer = CryptoSigner(private, _sslib_key(SigningKey(private, "x")))
    body = json.dumps(statement(subject_name="r/x", digest=DIGEST, predicate=PREDICATE)).encode()
    env = SslibEnvelope(payload=body, payload_type=INTOTO_PAYLOAD_TYPE, signatures={})
    env.sign(signer)
    verified = verify_envelope(
        json.dumps(env.to_dict()).encode(), trusted=[SigningKey(private, "x").public], digest=DIGEST
    )
    assert verified.statement["predicateType"] == SLSA_PROVENANCE_V1


def test_a_signing_key_that_does_not_load_is_refused_naming_the_variable_never_the_value() -> None:
    p384 = (
        ec.generate_private_key(ec.SECP384R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    for value, says in (
        (p384, "secp384r1 key"),
        (
            "-----BEGIN PRIVATE KEY-----\nnot-a-key-4242\n-----END PRIVATE KEY-----",
            "does not hold an unencrypted PEM private key",
        ),
        ("", "unset or empty"),
    ):
        with pytest.raises(AttestError) as err:
            load_signing_key(value, env="SITE_ATTEST_KEY")
        assert "$SITE_ATTEST_KEY" in str(err.value) and says in str(err.value)
        body = "".join(value.splitlines()[1:-1])
        assert not body or body not in str(err.value)
    key = load_signing_key(sandbox_attest_key(), env="K")
    assert "PRIVATE" not in repr(key) and key.keyid[:16] in repr(key)


def test_the_attest_table_is_checked_at_load_with_the_line(sb: Sandbox) -> None:
    text = sb.site_file.read_text()
    assert (
        re.search(r"^\[attest\]$", text, re.MULTILINE)
        and load_site(sb.site_file).attest is not None
    )
    (sb.root / "attest" / "gone.pub").unlink(missing_ok=True)
    sb.site_file.write_text(text.replace('"attest/sandbox-attest.pub"', '"attest/gone.pub"'))
    with pytest.raises(FileFormatError) as err:
        load_site(sb.site_file)
    line = next(
        n
        for n, s in enumerate(sb.site_file.read_text().splitlines(), 1)
        if s.startswith("trusted_keys")
    )
    assert f"site.toml:{line}: [attest] trusted_keys #1:" in str(
        err.value
    ) and "gone.pub is not a file" in str(err.value)
    sb.site_file.write_text(
        text.replace(
            '"attest/sandbox-attest.pub"',
            '"-----BEGIN PUBLIC KEY-----\\nAAAA\\n-----END PUBLIC KEY-----"',
        )
    )
    with pytest.raises(FileFormatError) as err:
        load_site(sb.site_file)
    assert f"site.toml:{line}: [attest] trusted_keys:" in str(
        err.value
    ) and "not a PEM public key" in str(err.value)
    sb.site_file.write_text(text)
    assert SANDBOX_ATTEST_KEY_ENV in load_site(sb.site_file).secret_env_names()


def test_referrers_answers_are_parsed_and_paged() -> None:
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": DIGEST,
                "size": 1234,
                "artifactType": INTOTO_PAYLOAD_TYPE,
                "annotations": {"org.opencontainers.image.created": "2026-12-01T00:00:00Z"},
            }
        ],
    }
    (found,) = parse_referrers(json.dumps(index).encode(), "here")
    assert (found.digest, found.size, found.artifact_type) == (DIGEST, 1234, INTOTO_PAYLOAD_TYPE)
    assert parse_referrers(b'{"schemaVersion": 2, "manifests": []}', "here") == []
    for junk in (b"404 page not found", b'{"schemaVersion": 2, "mediaType": "text/html"}', b"[]"):
        with pytest.raises(RegistryError, match="not an OCI image index of referrers"):
            parse_referrers(junk, "here")
    base = "http://127.0.0.1:5000"
    assert (
        next_page('</v2/r/referrers/sha256:ab?n=1&last=x>; rel="next"', base)
        == f"{base}/v2/r/referrers/sha256:ab?n=1&last=x"
    )
    assert next_page(None, base) is None and next_page('<http://x/y>; rel="prev"', base) is None


# -- against a real docker-registry ----------------------------------------------------------------


@dataclass
class Signed:
    p: Pipeline
    build: str
    digest: str
    att_raw: bytes  # the `.att` manifest lockstep pushed, exactly
    envelope: bytes
    registry: HttpRegistry
    verified_meta: dict[str, object]


@pytest.fixture(scope="module")
def signed(
    tmp_path_factory: pytest.TempPathFactory, registry_server: RegistryServer
) -> Iterator[Signed]:
    base = tmp_path_factory.mktemp("attest")
    sb = up(base / "sandbox", registry=registry_server.host)
    with dg.instance_for_test() as instance:
        p = Pipeline(sb, sandbox_resources(sb, base / "cache"), instance)
        try:
            advance_harbor(sb.root, fix=True)
            build = p.relock()
            result = p.build(build)
            assert result.success, failure_message(result)
            digest = p.pinned(build) or ""
            registry = HttpRegistry(host=registry_server.host)
            att = registry.stored(repository=p.repository, reference=attestation_tag(digest))
            assert att is not None
            (layer,) = json.loads(att.raw)["layers"]
            envelope = requests.get(
                f"http://{registry_server.host}/v2/{p.repository}/blobs/{layer['digest']}",
                timeout=10,
            ).content
            yield Signed(
                p=p,
                build=build,
                digest=digest,
                att_raw=att.raw,
                envelope=envelope,
                registry=registry,
                verified_meta=metadata(result, VERIFIED_IMAGE),
            )
        finally:
            stop_sandbox(sb)


def _put_att(s: Signed, envelope: bytes) -> None:
    """The image's `.att` tag holding only `envelope`
    (as someone with push rights could make it)."""
    blob = s.registry.push_blob(
        repository=s.p.repository, data=envelope, media_type=DSSE_MEDIA_TYPE
    )
    layers = [
        {
            "mediaType": DSSE_MEDIA_TYPE,
            "size": blob.size,
            "digest": blob.digest,
            "annotations": {COSIGN_SIGNATURE: "", "predicateType": SLSA_PROVENANCE_V1},
        }
    ]
    config = s.registry.push_blob(
        repository=s.p.repository, data=att_config(layers), media_type=OCI_CONFIG
    )
    s.registry.push_manifest(
        repository=s.p.repository,
        raw=att_manifest(config, layers),
        media_type=OCI_MANIFEST,
        tag=attestation_tag(s.digest),
    )


def _restore(s: Signed) -> None:
    s.registry.push_manifest(
        repository=s.p.repository,
        raw=s.att_raw,
        media_type=OCI_MANIFEST,
        tag=attestation_tag(s.digest),
    )


def test_the_verified_build_carries_a_cosign_layout_attestation_that_an_independent_verifier_accepts(  # noqa: E501
    signed: Signed,
) -> None:
    s = signed
    att = json.loads(s.att_raw)
    assert att["mediaType"] == OCI_MANIFEST and att["config"]["mediaType"] == OCI_CONFIG
    (layer,) = att["layers"]
    assert layer["mediaType"] == DSSE_MEDIA_TYPE
    assert layer["annotations"] == {COSIGN_SIGNATURE: "", "predicateType": SLSA_PROVENANCE_V1}
    # distribution 2.8 has no referrers API: the real
    # 404 is read as "none", and the `.att` tag is used.
    assert (
        s.registry.referrers(
            repository=s.p.repository, digest=s.digest, artifact_type=INTOTO_PAYLOAD_TYPE
        )
        is None
    )
    pub = serialization.load_pem_public_key(
        (s.p.sb.root / "attest" / "sandbox-attest.pub").read_bytes()
    )
    env = SslibEnvelope.from_dict(json.loads(s.envelope))
    keyid = str(s.verified_meta["attestation_keyid"])
    assert set(env.verify([SSlibKey.from_crypto(pub, keyid=keyid)], 1)) == {keyid}  # type: ignore[arg-type]
    doc = json.loads(env.payload)
    assert (
        doc["_type"] == "https://in-toto.io/Statement/v1"
        and doc["predicateType"] == SLSA_PROVENANCE_V1
    )
    assert doc["subject"][0]["digest"]["sha256"] == s.digest.removeprefix("sha256:")
    assert (
        doc["predicate"]["buildDefinition"]["externalParameters"]["consumer"]["commit"] == s.build
    )
    assert {v["passed"] for v in doc["predicate"]["verification"].values()} == {True}
    assert doc == s.verified_meta["provenance"]  # what the record shows is what was signed
    assert "attached via cosign tag" in str(s.verified_meta["attestation"])
    assert sandbox_attest_key().splitlines()[1] not in json.dumps(
        {k: str(v) for k, v in s.verified_meta.items()}
    )


def _sign(doc: dict[str, object], key: SigningKey) -> bytes:
    return sign_statement(doc, key).to_json()


def _statement(s: Signed) -> dict[str, object]:
    return json.loads(Envelope.model_validate_json(s.envelope).body())


def _sandbox_key() -> SigningKey:
    return load_signing_key(sandbox_attest_key(), env=SANDBOX_ATTEST_KEY_ENV)


SCENARIOS = {
    "unattested": (None, "no attestation is attached to it"),
    "tampered": (
        lambda s: _tampered(
            s.envelope,
            lambda b: b["predicate"]["verification"]["smoke"].update(passed=True, note="forged"),
        ),
        "no signature verifies with a trusted key",
    ),
    "other key": (
        lambda s: _sign(_statement(s), _new_key()),
        "no signature verifies with a trusted key",
    ),
    "other subject": (
        lambda s: _sign(
            {**_statement(s), "subject": [{"name": "x", "digest": {"sha256": "cd" * 32}}]},
            _sandbox_key(),
        ),
        f"it attests sha256:{'cd' * 32}, not",
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_promotion_refuses_a_build_without_a_valid_attestation_and_leaves_the_tag(
    signed: Signed, scenario: str
) -> None:
    s = signed
    make, says = SCENARIOS[scenario]
    att = attestation_tag(s.digest)
    try:
        if make is None:  # gone: as for a build verified before the site had [attest]
            att_digest = s.registry.resolve(repository=s.p.repository, reference=att)
            host = s.registry.host
            assert (
                requests.delete(
                    f"http://{host}/v2/{s.p.repository}/manifests/{att_digest}", timeout=10
                ).status_code
                == 202
            )
        else:
            _put_att(s, make(s))
        result = s.p.tag("promote")
        assert not result.success
        message = failure_message(result)
        assert (
            f"refused to move :tpu to {s.digest}: no valid attestation by a trusted key" in message
        ), message
        assert says in message and ":tpu was not touched" in message
        assert s.p.floating() is None
    finally:
        _restore(s)


def test_a_site_without_attest_promotes_unchecked_and_says_so(signed: Signed) -> None:
    s, stack = signed, contextlib.ExitStack()
    text = s.p.sb.site_file.read_text()
    plain = re.sub(r"(?ms)^\[attest\]\n.*?(?=^\[|\Z)", "", text).replace(
        'floating_tag = "tpu"', 'floating_tag = "unsigned"'
    )
    site_file = s.p.sb.site_file.with_name("site-unsigned.toml")
    site_file.write_text(plain)
    assert (
        load_site(site_file).attest is None
        and SANDBOX_ATTEST_KEY_ENV not in load_site(site_file).secret_env_names()
    )
    resources = {**s.p.resources, "site": SiteResource(path=str(site_file))}
    instance = stack.enter_context(dg.instance_for_test())  # its own promotion log: another tag
    for record in s.p.instance.fetch_materializations(VERIFIED_IMAGE, limit=10).records:
        instance.add_dynamic_partitions("tpu_builds", [record.partition_key or ""])
        instance.report_runless_asset_event(record.asset_materialization)  # type: ignore[arg-type]
    unsigned = Pipeline(s.p.sb, resources, instance)
    requests.delete(
        f"http://{s.registry.host}/v2/{s.p.repository}/manifests/"
        f"{s.registry.resolve(repository=s.p.repository, reference=attestation_tag(s.digest))}",
        timeout=10,
    )
    try:
        result = unsigned.tag("promote")
        assert result.success, failure_message(result)
        assert str(metadata(result)["attestation"]).startswith(
            "none: the site has no [attest] table"
        )
        assert s.registry.resolve(repository=s.p.repository, reference="unsigned") == s.digest
    finally:
        _restore(s)
        stack.close()


def test_promotion_with_the_real_attestation_moves_the_tag(signed: Signed) -> None:
    s = signed
    result = s.p.tag("promote")
    assert result.success, failure_message(result)
    assert s.p.floating() == s.digest
    assert str(metadata(result)["attestation"]).startswith(
        f"attested: :{attestation_tag(s.digest)} layer 1 signed by "
        f"trusted key {str(s.verified_meta['attestation_keyid'])[:16]}"
    )


def test_a_signing_key_on_one_line_as_an_env_file_holds_it_is_the_same_key() -> None:
    pem = sandbox_attest_key()
    one_line = pem.strip().replace("\n", "\\n")
    assert "\n" not in one_line
    assert load_signing_key(one_line, env="K").keyid == load_signing_key(pem, env="K").keyid
    with pytest.raises(AttestError, match=r"\$K does not hold"):
        load_signing_key(one_line.replace("\\n", "\\n\\n", 1)[:-40], env="K")
