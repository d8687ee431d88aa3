"""Registry backends against a real docker-registry and real OCI layout directories.

Behavioural tests run on both backends: HttpRegistry against a `docker-registry` started once for
the module, LayoutRegistry against a fresh directory per test. Test images are built here with
tarfile and gzip: real layer tars, OCI configs and manifests, pushed through the resource itself.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import parse_qs, urlsplit

import pytest

from resources.registry import (
    DOCKER_LAYER_GZIP,
    DOCKER_MANIFEST,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_MANIFEST,
    REF_NAME,
    HttpRegistry,
    ImageRef,
    LayoutRegistry,
    PinnedTagTaken,
    Registry,
    RegistryError,
    TagMoved,
    digest_of,
    registry_for,
    transport,
)
from resources.site.load import load_site
from tests.support.images import (
    Layer,
    d,
    f,
    hardlink,
    layer,
    oci_manifest,
    opaque,
    push_image,
    push_index,
    small_image,
    symlink,
    whiteout,
)
from tests.support.registry_proxy import RegistryProxy
from tests.support.registry_server import RegistryServer

# -- fixtures: both backends -----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Retries wait through transport.backoff_sleep: recorded here, never really waited."""
    waited: list[float] = []
    monkeypatch.setattr(transport, "backoff_sleep", waited.append)
    return waited


@pytest.fixture(params=["http", "layout"])
def reg(request: pytest.FixtureRequest, tmp_path: Path) -> Registry:
    if request.param == "http":
        server: RegistryServer = request.getfixturevalue("registry_server")
        return HttpRegistry(host=server.host, timeout_s=30, blob_cache_dir=str(tmp_path / "blobs"))
    return LayoutRegistry(root=str(tmp_path / "layout"))


@pytest.fixture
def repo() -> str:
    """A repository of its own per test: the module's registry server is shared."""
    return f"lockstep/t-{uuid.uuid4().hex[:12]}"


# -- resolve and manifests -------------------------------------------------------------------------


def test_resolve_tag_digest_and_missing(reg: Registry, repo: str) -> None:
    img = small_image(reg, repo, "one", tag="v1")
    assert img.digest == digest_of(img.raw)
    assert reg.resolve(repository=repo, reference="v1") == img.digest
    assert reg.resolve(repository=repo, reference=img.digest) == img.digest
    assert reg.resolve(repository=repo, reference="v2") is None
    assert reg.resolve(repository=repo, reference=digest_of(b"never pushed")) is None
    assert reg.resolve(repository=f"{repo}-never-pushed", reference="v1") is None
    assert reg.manifest(repository=repo, reference="v2") is None


def test_layout_finds_only_manifests_by_digest(tmp_path: Path) -> None:
    """A layer's digest is not an image. (docker-registry
    2.8 answers HTTP 500 here, so layout only.)"""
    reg = LayoutRegistry(root=str(tmp_path))
    img = small_image(reg, "team/app", "one", tag="v1")
    assert reg.resolve(repository="team/app", reference=img.layer_digests[0]) is None


def test_index_resolves_to_itself_and_manifest_follows_the_platform(
    reg: Registry, repo: str
) -> None:
    amd = small_image(reg, repo, "amd64 build", arch="amd64")
    arm = small_image(reg, repo, "arm64 build", arch="arm64")
    index_digest, index_raw = push_index(reg, repo, [(arm, "arm64"), (amd, "amd64")], tag="multi")

    assert reg.resolve(repository=repo, reference="multi") == index_digest == digest_of(index_raw)
    got = reg.manifest(repository=repo, reference="multi")
    assert got is not None and got.digest == amd.digest and got.raw == amd.raw
    arm_got = reg.manifest(repository=repo, reference="multi", platform="linux/arm64")
    assert arm_got is not None and arm_got.digest == arm.digest
    assert (
        reg.read_file(repository=repo, reference="multi", path="/etc/which").data == b"amd64 build"
    )
    with pytest.raises(
        RegistryError, match=r"without a linux/s390x image \(it has: linux/arm64, linux/amd64\)"
    ):
        reg.manifest(repository=repo, reference="multi", platform="linux/s390x")


def test_config_is_the_image_config(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [layer(f("a", "1"))],
        tag="v1",
        labels={"org.opencontainers.image.revision": "abc"},
    )
    config = reg.config(repository=repo, reference="v1")
    assert config["config"]["Labels"] == {"org.opencontainers.image.revision": "abc"}
    assert config["architecture"] == "amd64"


# -- retag by exact bytes --------------------------------------------------------------------------


def test_retag_keeps_the_digest_and_the_exact_bytes_of_an_odd_manifest(
    reg: Registry, repo: str
) -> None:
    """A client that re-serialises JSON would change this manifest's digest; a retag must not."""
    base = small_image(reg, repo, "x")
    doc = json.loads(base.raw)
    # Keys reversed, odd indentation, spaces before colons, a trailing newline: all digest-relevant.
    odd = (
        "{\n      "
        + ",\n      ".join(
            f"{json.dumps(k)} :  {json.dumps(doc[k], indent=5)}" for k in reversed(list(doc))
        )
        + "\n}\n"
    )
    raw = odd.encode()
    assert json.loads(raw) == doc and raw != base.raw
    digest = reg.push_manifest(repository=repo, raw=raw, media_type=OCI_MANIFEST, tag=None)
    assert digest == digest_of(raw)

    reg.tag(repository=repo, digest=digest, tag="retagged")

    assert reg.resolve(repository=repo, reference="retagged") == digest
    got = reg.manifest(repository=repo, reference="retagged")
    assert got is not None and got.raw == raw and got.digest == digest


def test_retag_keeps_a_docker_manifest_a_docker_manifest(reg: Registry, repo: str) -> None:
    img = push_image(reg, repo, [layer(f("a", "1"))], docker=True)
    reg.tag(repository=repo, digest=img.digest, tag="copy")
    got = reg.manifest(repository=repo, reference="copy")
    assert got is not None
    assert (got.media_type, got.digest, got.raw) == (DOCKER_MANIFEST, img.digest, img.raw)


def test_retag_of_an_index_keeps_the_index(reg: Registry, repo: str) -> None:
    amd = small_image(reg, repo, "a")
    index_digest, _ = push_index(reg, repo, [(amd, "amd64")], tag="multi")
    reg.tag(repository=repo, digest=index_digest, tag="multi-copy")
    assert reg.resolve(repository=repo, reference="multi-copy") == index_digest


def test_tag_of_an_unknown_digest_names_the_ref(reg: Registry, repo: str) -> None:
    missing = digest_of(b"nothing")
    with pytest.raises(
        RegistryError, match=rf"{repo}@{missing}: no manifest with this digest.*push it first"
    ):
        reg.tag(repository=repo, digest=missing, tag="v1")


def test_push_manifest_with_missing_blobs_is_refused(reg: Registry, repo: str) -> None:
    missing = digest_of(b"no such layer")
    doc = oci_manifest({"digest": missing, "size": 1}, [])
    with pytest.raises(RegistryError):
        reg.push_manifest(
            repository=repo, raw=json.dumps(doc).encode(), media_type=OCI_MANIFEST, tag="v1"
        )
    assert reg.resolve(repository=repo, reference="v1") is None


# -- compare-and-swap tag moves --------------------------------------------------------------------


def test_move_tag_creates_then_moves_and_returns_the_rollback_target(
    reg: Registry, repo: str
) -> None:
    a, b = small_image(reg, repo, "a"), small_image(reg, repo, "b")
    assert reg.move_tag(repository=repo, tag="tpu", to_digest=a.digest, expect_from=None) is None
    assert (
        reg.move_tag(repository=repo, tag="tpu", to_digest=b.digest, expect_from=a.digest)
        == a.digest
    )
    assert reg.resolve(repository=repo, reference="tpu") == b.digest
    # Moving to where it already is: nothing to write, and the answer is still the "before".
    assert (
        reg.move_tag(repository=repo, tag="tpu", to_digest=b.digest, expect_from=b.digest)
        == b.digest
    )


def test_move_refused_when_someone_else_moved_the_tag(reg: Registry, repo: str) -> None:
    a, b, theirs = (small_image(reg, repo, x) for x in "abc")
    reg.move_tag(repository=repo, tag="tpu", to_digest=a.digest, expect_from=None)
    reg.tag(repository=repo, digest=theirs.digest, tag="tpu")  # a teammate promotes meanwhile

    with pytest.raises(TagMoved) as info:
        reg.move_tag(repository=repo, tag="tpu", to_digest=b.digest, expect_from=a.digest)

    assert f"{repo}:tpu points at {theirs.digest}, not at {a.digest}" in str(info.value)
    assert "nothing was written" in str(info.value)
    assert reg.resolve(repository=repo, reference="tpu") == theirs.digest


def test_move_expecting_a_new_tag_refused_when_it_exists(reg: Registry, repo: str) -> None:
    a, b = small_image(reg, repo, "a"), small_image(reg, repo, "b")
    reg.tag(repository=repo, digest=a.digest, tag="tpu")
    with pytest.raises(TagMoved, match="not at nothing \\(a new tag\\)"):
        reg.move_tag(repository=repo, tag="tpu", to_digest=b.digest, expect_from=None)
    assert reg.resolve(repository=repo, reference="tpu") == a.digest


def test_move_expecting_a_digest_refused_when_the_tag_is_gone(reg: Registry, repo: str) -> None:
    a, b = small_image(reg, repo, "a"), small_image(reg, repo, "b")
    with pytest.raises(TagMoved, match="points at nothing"):
        reg.move_tag(repository=repo, tag="tpu", to_digest=b.digest, expect_from=a.digest)
    assert reg.resolve(repository=repo, reference="tpu") is None


def test_layout_move_tag_is_a_true_compare_and_swap(tmp_path: Path) -> None:
    """Eight writers race from the same expected digest; the index lock lets exactly one win."""
    reg = LayoutRegistry(root=str(tmp_path / "layout"))
    repo = "lockstep/race"
    start = small_image(reg, repo, "start")
    reg.move_tag(repository=repo, tag="tpu", to_digest=start.digest, expect_from=None)
    candidates = [small_image(reg, repo, f"candidate {i}").digest for i in range(8)]
    barrier = threading.Barrier(len(candidates))
    won, refused = [], []

    def promote(digest: str) -> None:
        barrier.wait()
        try:
            reg.move_tag(repository=repo, tag="tpu", to_digest=digest, expect_from=start.digest)
            won.append(digest)
        except TagMoved:
            refused.append(digest)

    threads = [threading.Thread(target=promote, args=(c,)) for c in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert len(won) == 1 and len(refused) == len(candidates) - 1
    assert reg.resolve(repository=repo, reference="tpu") == won[0]


def test_layout_writes_a_standard_oci_layout(tmp_path: Path) -> None:
    reg = LayoutRegistry(root=str(tmp_path))
    img = small_image(reg, "team/app", "a", tag="v1")
    repo_dir = tmp_path / "team" / "app"
    assert json.loads((repo_dir / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((repo_dir / "index.json").read_text())
    assert index["manifests"] == [
        {
            "mediaType": OCI_MANIFEST,
            "digest": img.digest,
            "size": len(img.raw),
            "annotations": {REF_NAME: "v1"},
        }
    ]
    assert (
        repo_dir / "blobs" / "sha256" / img.digest.removeprefix("sha256:")
    ).read_bytes() == img.raw
    assert not [p for p in repo_dir.rglob(".*") if p.is_file()], "temporary files left behind"


# -- pinned tags -----------------------------------------------------------------------------------


def test_pinned_tag_is_written_once(reg: Registry, repo: str) -> None:
    a, b = small_image(reg, repo, "a"), small_image(reg, repo, "b")
    reg.tag(repository=repo, digest=a.digest, tag="tpu-0123abc")
    reg.tag(repository=repo, digest=a.digest, tag="tpu-0123abc")  # same digest: a no-op

    with pytest.raises(
        PinnedTagTaken,
        match=rf"{repo}:tpu-0123abc is a pinned tag and already points at {a.digest}",
    ):
        reg.tag(repository=repo, digest=b.digest, tag="tpu-0123abc")
    with pytest.raises(PinnedTagTaken):
        reg.move_tag(repository=repo, tag="tpu-0123abc", to_digest=b.digest, expect_from=a.digest)
    with pytest.raises(PinnedTagTaken):
        reg.push_manifest(repository=repo, raw=b.raw, media_type=OCI_MANIFEST, tag="tpu-0123abc")
    assert reg.resolve(repository=repo, reference="tpu-0123abc") == a.digest


def test_unpinned_tags_and_a_custom_pattern(reg: Registry, repo: str) -> None:
    a, b = small_image(reg, repo, "a"), small_image(reg, repo, "b")
    reg.tag(repository=repo, digest=a.digest, tag="tpu")
    reg.tag(repository=repo, digest=b.digest, tag="tpu")  # the floating tag moves freely
    assert reg.resolve(repository=repo, reference="tpu") == b.digest
    strict = reg.model_copy(update={"immutable_tag_pattern": r"^release-"})
    strict.tag(repository=repo, digest=a.digest, tag="release-1")
    with pytest.raises(PinnedTagTaken):
        strict.tag(repository=repo, digest=b.digest, tag="release-1")


# -- read_file -------------------------------------------------------------------------------------


def read(reg: Registry, repo: str, path: str, ref: str = "v1") -> bytes | None:
    got = reg.read_file(repository=repo, reference=ref, path=path)
    return None if got is None else got.data


def test_file_only_in_a_lower_layer(reg: Registry, repo: str) -> None:
    img = push_image(
        reg,
        repo,
        [layer(d("etc"), f("etc/os-release", "debian")), layer(f("app/x", "1"))],
        tag="v1",
    )
    got = reg.read_file(repository=repo, reference="v1", path="/etc/os-release")
    assert got is not None and got.data == b"debian"
    assert (got.layer_index, got.layer_digest, got.path) == (
        0,
        img.layer_digests[0],
        "/etc/os-release",
    )


def test_upper_layer_overrides_a_lower_one(reg: Registry, repo: str) -> None:
    img = push_image(
        reg, repo, [layer(f("etc/conf", "old")), layer(f("etc/conf", "new"))], tag="v1"
    )
    got = reg.read_file(repository=repo, reference="v1", path="etc/conf")
    assert got is not None and (got.data, got.layer_index, got.layer_digest) == (
        b"new",
        1,
        img.layer_digests[1],
    )


def test_whiteout_deletes_a_file_of_a_lower_layer(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [layer(f("etc/conf", "old"), f("etc/keep", "k")), layer(whiteout("etc/conf"))],
        tag="v1",
    )
    assert read(reg, repo, "/etc/conf") is None
    assert read(reg, repo, "/etc/keep") == b"k"


def test_whiteout_of_a_directory_hides_what_is_below_it(reg: Registry, repo: str) -> None:
    push_image(
        reg, repo, [layer(f("opt/tool/bin/run", "v1")), layer(whiteout("opt/tool"))], tag="v1"
    )
    assert read(reg, repo, "/opt/tool/bin/run") is None


def test_opaque_directory_hides_the_lower_layers_contents(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [
            layer(
                f("usr/lib/py/old.py", "old"),
                f("usr/lib/py/both.py", "lower"),
                f("usr/lib/other", "o"),
            ),
            layer(
                d("usr/lib/py"),
                opaque("usr/lib/py"),
                f("usr/lib/py/new.py", "new"),
                f("usr/lib/py/both.py", "upper"),
            ),
        ],
        tag="v1",
    )
    assert read(reg, repo, "/usr/lib/py/old.py") is None
    assert read(reg, repo, "/usr/lib/py/new.py") == b"new"  # the opaque layer's own files show
    assert read(reg, repo, "/usr/lib/py/both.py") == b"upper"
    assert read(reg, repo, "/usr/lib/other") == b"o"  # outside the opaque directory


def test_whiteout_then_recreated_in_the_same_layer(reg: Registry, repo: str) -> None:
    """A whiteout hides lower layers only; a file in its own layer still shows."""
    push_image(
        reg,
        repo,
        [layer(f("etc/conf", "old")), layer(whiteout("etc/conf"), f("etc/conf", "new"))],
        tag="v1",
    )
    assert read(reg, repo, "/etc/conf") == b"new"


@pytest.mark.parametrize(
    ("compress", "media_type"),
    [
        (False, OCI_LAYER_TAR),
        (False, OCI_LAYER_GZIP),  # mislabelled: a plain tar called gzip
        (True, OCI_LAYER_TAR),  # mislabelled: gzip called a plain tar
        (True, DOCKER_LAYER_GZIP),
    ],
)
def test_layer_format_is_told_by_its_bytes(
    reg: Registry, repo: str, compress: bool, media_type: str
) -> None:
    push_image(
        reg, repo, [layer(f("etc/a", "plain?"), compress=compress, media_type=media_type)], tag="v1"
    )
    assert read(reg, repo, "/etc/a") == b"plain?"


def test_absent_path_and_directory_are_none(reg: Registry, repo: str) -> None:
    push_image(reg, repo, [layer(d("etc"), f("etc/a", "1"))], tag="v1")
    assert reg.read_file(repository=repo, reference="v1", path="/etc/missing") is None
    assert reg.read_file(repository=repo, reference="v1", path="/etc") is None
    assert reg.read_file(repository=repo, reference="v1", path="/etc/a/below-a-file") is None


def test_member_and_path_spellings(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [layer(f("./dotted/a", "dot"), f("plain/b", "plain"), f("/abs/c", "abs"))],
        tag="v1",
    )
    for path in ("dotted/a", "/dotted/a", "./dotted/a", "//dotted//a"):
        assert read(reg, repo, path) == b"dot"
    assert read(reg, repo, "/plain/b") == read(reg, repo, "plain/b") == b"plain"
    assert read(reg, repo, "abs/c") == b"abs"
    with pytest.raises(RegistryError, match="names the image root"):
        reg.read_file(repository=repo, reference="v1", path="/")


def test_symlinks_are_followed_within_the_image(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [
            layer(f("usr/lib/real.txt", "real"), symlink("lib", "usr/lib")),
            layer(
                symlink("etc/rel", "../usr/lib/real.txt"),
                symlink("etc/abs", "/usr/lib/real.txt"),
                symlink("etc/escape", "../../../../usr/lib/real.txt"),
                symlink("loop/a", "b"),
                symlink("loop/b", "a"),
                symlink("etc/dangling", "/nowhere"),
            ),
        ],
        tag="v1",
    )
    assert read(reg, repo, "/etc/rel") == b"real"
    assert read(reg, repo, "/etc/abs") == b"real"
    assert read(reg, repo, "/etc/escape") == b"real"  # '..' stops at the image root
    assert read(reg, repo, "/lib/real.txt") == b"real"  # through a symlinked directory
    assert read(reg, repo, "/etc/dangling") is None
    with pytest.raises(RegistryError, match="more than 8 symlinks"):
        reg.read_file(repository=repo, reference="v1", path="/loop/a")


def test_hardlink_reads_the_linked_member(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [layer(f("usr/bin/python3.11", "ELF"), hardlink("usr/bin/python3", "usr/bin/python3.11"))],
        tag="v1",
    )
    assert read(reg, repo, "/usr/bin/python3") == b"ELF"


def test_read_file_stops_at_the_top_layer(reg: Registry, repo: str) -> None:
    base = layer(f("big/blob.bin", os.urandom(4 * 1024 * 1024)), f("etc/base", "b"))
    push_image(reg, repo, [base, layer(f("app/direct_url.json", '{"commit_id": "abc"}'))], tag="v1")
    got = reg.read_file(repository=repo, reference="v1", path="/app/direct_url.json")
    assert got is not None and got.layer_index == 1
    assert got.image_bytes > 4 * 1024 * 1024
    assert got.bytes_read < got.image_bytes / 20, got


def test_read_file_does_not_drain_the_rest_of_a_layer(reg: Registry, repo: str) -> None:
    """The wanted member comes first in an 8 MiB layer: the rest of the blob is never pulled."""
    big = layer(f("first.txt", "found early"), f("big/blob.bin", os.urandom(8 * 1024 * 1024)))
    push_image(reg, repo, [big], tag="v1")
    got = reg.read_file(repository=repo, reference="v1", path="first.txt")
    assert got is not None and got.data == b"found early"
    assert got.bytes_read < 512 * 1024 < 8 * 1024 * 1024 < got.image_bytes


def test_read_file_of_a_missing_image_names_it(reg: Registry, repo: str) -> None:
    with pytest.raises(RegistryError, match=rf"{repo}:nope: no such image"):
        reg.read_file(repository=repo, reference="nope", path="/etc/a")


def test_corrupt_layer_is_named(reg: Registry, repo: str) -> None:
    bad = Layer(
        blob=b"\x1f\x8b" + b"not really gzip" * 10,
        media_type=OCI_LAYER_GZIP,
        diff_id=digest_of(b""),
    )
    push_image(reg, repo, [bad], tag="v1")
    with pytest.raises(RegistryError, match=rf"{repo}@{digest_of(bad.blob)}: layer"):
        reg.read_file(repository=repo, reference="v1", path="/etc/a")


# -- blobs -----------------------------------------------------------------------------------------


def test_push_blob_is_idempotent_and_open_blob_streams(
    reg: Registry, repo: str, tmp_path: Path
) -> None:
    data = os.urandom(300_000)
    first = reg.push_blob(repository=repo, data=data, media_type=OCI_LAYER_TAR)
    again = reg.push_blob(repository=repo, data=data, media_type=OCI_LAYER_TAR)
    assert first == again and first.digest == digest_of(data) and first.size == len(data)
    with reg.open_blob(repository=repo, digest=first.digest) as stream:
        assert stream.read(10) == data[:10]
        assert stream.read() == data[10:]
    (tmp_path / "blob").write_bytes(data[::-1])
    from_file = reg.push_blob_file(
        repository=repo, path=tmp_path / "blob", media_type=OCI_LAYER_TAR
    )
    with reg.open_blob(repository=repo, digest=from_file.digest) as stream:
        assert stream.read() == data[::-1]


def test_missing_blob_names_the_ref(reg: Registry, repo: str) -> None:
    missing = digest_of(b"gone")
    with pytest.raises(RegistryError, match=rf"{repo}@{missing}"):
        reg.open_blob(repository=repo, digest=missing).close()


# -- push rights, proven without pushing -----------------------------------------------------------


def _no_repository(reg: Registry, repo: str) -> bool:
    """The registry holds nothing under `repo`: no tag list (HTTP), no layout directory (layout)."""
    if isinstance(reg, LayoutRegistry):
        return not (Path(reg.root) / repo).exists()
    import requests

    return requests.get(f"{reg.base_url}/v2/{repo}/tags/list", timeout=10).status_code == 404  # type: ignore[attr-defined]


def test_can_push_proves_push_rights_and_leaves_nothing(reg: Registry, repo: str) -> None:
    check = reg.can_push(repository=repo)
    assert check.allowed and check.refusal == "" and check.cancelled and check.repository == repo
    assert repo in check.proof
    assert _no_repository(reg, repo)  # nothing was pushed: no repository, let alone an image
    small_image(reg, repo, "after the probe", tag="v1")  # and a real push still works after it
    assert reg.can_push(repository=repo).allowed


PUSH_TOKEN_ENV = "LOCKSTEP_TEST_PUSH_TOKEN"
PUSH_SECRET = "ghp_PullOnlyTokenValue0123456789"


@pytest.fixture(params=["http", "layout"])
def refusing(
    request: pytest.FixtureRequest, tmp_path: Path, repo: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Registry, str]]:
    """A registry of each backend that will not take a push to `repo`, and what its refusal must
    say: a ghcr-like token endpoint that grants this token
    `pull` only (ghcr: no write:packages), and a layout
    directory that would have to be made under a file."""
    if request.param == "http":
        server: RegistryServer = request.getfixturevalue("registry_server")
        monkeypatch.setenv(PUSH_TOKEN_ENV, PUSH_SECRET)
        with RegistryProxy(upstream=server.host, auth=True, pull_only={repo}) as ghcr_like:
            yield (
                HttpRegistry(
                    host=ghcr_like.host, username="bot", token_env=PUSH_TOKEN_ENV, timeout_s=10
                ),
                (
                    "HTTP 403 Forbidden (DENIED: requested access to the resource is denied): "
                    "the registry refused to "
                    f"start an upload for the token in ${PUSH_TOKEN_ENV}: it cannot push to {repo}"
                ),
            )
    else:
        (tmp_path / "not-a-dir").write_text("a file where the layout should go")
        yield (
            LayoutRegistry(root=str(tmp_path / "not-a-dir" / "layout")),
            (
                f"{tmp_path / 'not-a-dir'} is not a directory, so "
                f"{tmp_path / 'not-a-dir' / 'layout' / repo} cannot be created"
            ),
        )


def test_can_push_refusal_is_a_value_naming_why(refusing: tuple[Registry, str], repo: str) -> None:
    reg, says = refusing
    check = reg.can_push(repository=repo)
    assert not check.allowed and says in check.refusal
    assert PUSH_SECRET not in check.model_dump_json()


def test_can_push_cancels_the_upload_it_opened_with_a_push_scoped_token(
    registry_server: RegistryServer, repo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PUSH_TOKEN_ENV, PUSH_SECRET)
    with RegistryProxy(upstream=registry_server.host, auth=True) as ghcr_like:
        check = HttpRegistry(
            host=ghcr_like.host, username="bot", token_env=PUSH_TOKEN_ENV, timeout_s=10
        ).can_push(repository=repo)
        opened = ghcr_like.requests("POST", f"/v2/{repo}/blobs/uploads/$")
        closed = ghcr_like.requests("DELETE", f"/v2/{repo}/blobs/uploads/")
    assert check.allowed and check.cancelled
    assert [s.status for s in opened] == [401, 202] and [s.status for s in closed] == [204]
    assert [t["scope"] for t in ghcr_like.token_requests] == [f"repository:{repo}:pull,push"]
    # no byte of a blob was sent
    assert not ghcr_like.requests("PUT") and not ghcr_like.requests("PATCH")


def test_can_push_without_the_token_names_the_variable(
    registry_server: RegistryServer, repo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PUSH_TOKEN_ENV, raising=False)
    with RegistryProxy(upstream=registry_server.host, auth=True) as ghcr_like:
        check = HttpRegistry(host=ghcr_like.host, token_env=PUSH_TOKEN_ENV, timeout_s=10).can_push(
            repository=repo
        )
    assert (
        not check.allowed and f"names ${PUSH_TOKEN_ENV}, which is unset or empty" in check.refusal
    )


def test_can_push_to_an_unreachable_registry_is_refused_not_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    check = HttpRegistry(host=f"127.0.0.1:{port}", timeout_s=5, retry_attempts=1).can_push(
        repository="team/app"
    )
    assert not check.allowed and f"cannot reach 127.0.0.1:{port}" in check.refusal


# -- names, refs and input checks ------------------------------------------------------------------


def test_bad_names_are_refused_before_any_request(reg: Registry) -> None:
    with pytest.raises(RegistryError, match="repository 'Bad/Name' is not a valid name"):
        reg.resolve(repository="Bad/Name", reference="v1")
    with pytest.raises(RegistryError, match="tag 'a tag' is not a valid tag"):
        reg.resolve(repository="ok/name", reference="a tag")
    with pytest.raises(RegistryError, match="is not a digest"):
        reg.open_blob(repository="ok/name", digest="sha256:../../etc/passwd")


A64, B64 = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        (
            "ghcr.io/open-thoughts/openthoughts-agent:tpu",
            "ghcr.io",
            "open-thoughts/openthoughts-agent",
            "tpu",
            None,
        ),
        (f"127.0.0.1:5000/lockstep/tpu@{A64}", "127.0.0.1:5000", "lockstep/tpu", None, A64),
        (f"localhost:5000/x:tpu-abc1234@{B64}", "localhost:5000", "x", "tpu-abc1234", B64),
        ("ghcr.io/org/img", "ghcr.io", "org/img", None, None),
    ],
)
def test_image_ref_round_trip(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        registry,
        repository,
        tag,
        digest,
    )
    assert str(ref) == text
    assert ref.reference == (digest or tag or "latest")


@pytest.mark.parametrize(
    "text",
    ["ubuntu:22.04", "https://ghcr.io/org/img:tpu", "ghcr.io/Org/img:tpu", "ghcr.io/o/i@sha256:zz"],
)
def test_image_ref_refuses(text: str) -> None:
    with pytest.raises(RegistryError):
        ImageRef.parse(text)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("localhost:5000", "http://localhost:5000"),
        ("[::1]:5000", "http://[::1]:5000"),
        ("localhost", "http://localhost"),
        ("ghcr.io", "https://ghcr.io"),
        ("registry.example.com:8443", "https://registry.example.com:8443"),
    ],
)
def test_plain_http_only_on_this_machine(host: str, url: str) -> None:
    assert HttpRegistry(host=host).base_url == url


# -- HTTP failures ---------------------------------------------------------------------------------


def test_unreachable_registry_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reg = HttpRegistry(host=f"127.0.0.1:{port}", timeout_s=5)
    with pytest.raises(
        RegistryError, match=rf"HEAD 127.0.0.1:{port}/team/app:v1: cannot reach 127.0.0.1:{port}"
    ):
        reg.resolve(repository="team/app", reference="v1")


def test_every_request_has_a_timeout() -> None:
    """A server that accepts the connection and never answers: the call gives up after timeout_s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        reg = HttpRegistry(host=host, timeout_s=0.3)
        with pytest.raises(RegistryError, match=rf"no answer from {host} within 0.3 s"):
            reg.resolve(repository="team/app", reference="v1")


# -- token auth (ghcr's flow) against a tiny in-test server ---------------------------------------

SECRET = "ghp_NeverShowThis0123456789"
BEARER = "bearer-ABCDEF-also-secret"
ANON_BEARER = "anon-bearer-token-123"


class FakeGhcr:
    """Challenges with Bearer realm/service/scope; the realm trades basic auth for a bearer token.

    basic=True: a registry that takes basic auth itself (Basic challenge, no token endpoint).
    digest_header=False: a registry that leaves Docker-Content-Digest out of its answers.
    """

    def __init__(
        self,
        *,
        secret: str = SECRET,
        anonymous_pull: bool = False,
        accept_bearer: bool = True,
        basic: bool = False,
        digest_header: bool = True,
    ) -> None:
        self.manifest = json.dumps(
            oci_manifest({"digest": digest_of(b"{}"), "size": 2}, [])
        ).encode()
        self.digest = digest_of(self.manifest)
        self.token_requests: list[tuple[str | None, dict[str, list[str]]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                self.answer(body=True)

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def answer(self, body: bool) -> None:
                url = urlsplit(self.path)
                auth = self.headers.get("Authorization")
                if url.path == "/token":
                    fake.token_requests.append((auth, parse_qs(url.query)))
                    expected = "Basic " + base64.b64encode(f"bot:{secret}".encode()).decode()
                    if auth == expected:
                        return self.send(
                            200, json.dumps({"token": BEARER}).encode(), "application/json", body
                        )
                    if auth is None and anonymous_pull:
                        return self.send(
                            200,
                            json.dumps({"token": ANON_BEARER}).encode(),
                            "application/json",
                            body,
                        )
                    return self.send(
                        401,
                        b'{"errors":[{"code":"DENIED","message":"bad credentials"}]}',
                        "application/json",
                        body,
                    )
                granted = {f"Bearer {BEARER}"} if accept_bearer else set()
                if anonymous_pull:
                    granted.add(f"Bearer {ANON_BEARER}")
                realm = f"http://127.0.0.1:{fake.port}/token"
                challenge = (
                    f'Bearer realm="{realm}",service="fake-ghcr",scope="repository:team/app:pull"'
                )
                if basic:
                    granted = {"Basic " + base64.b64encode(f"bot:{secret}".encode()).decode()}
                    challenge = 'Basic realm="fake"'
                if auth not in granted:
                    return self.send(
                        401,
                        b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}',
                        "application/json",
                        body,
                        {"WWW-Authenticate": challenge},
                    )
                if url.path == "/v2/team/app/manifests/v1":
                    extra = {"Docker-Content-Digest": fake.digest} if digest_header else {}
                    return self.send(200, fake.manifest, OCI_MANIFEST, body, extra)
                return self.send(
                    404,
                    b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}',
                    "application/json",
                    body,
                )

            def send(
                self, status: int, data: bytes, ctype: str, body: bool, extra: dict | None = None
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"


def test_token_from_the_env_var_is_exchanged_for_a_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_TEST_TOKEN", SECRET)
    with FakeGhcr() as ghcr:
        reg = HttpRegistry(
            host=ghcr.host, username="bot", token_env="LOCKSTEP_TEST_TOKEN", timeout_s=5
        )
        assert reg.resolve(repository="team/app", reference="v1") == ghcr.digest
        got = reg.manifest(repository="team/app", reference="v1")
        assert got is not None and got.raw == ghcr.manifest
        assert reg.resolve(repository="team/app", reference="v2") is None
    # One exchange, cached for the later calls; basic auth carried the env var's value.
    assert len(ghcr.token_requests) == 1
    auth, query = ghcr.token_requests[0]
    assert auth == "Basic " + base64.b64encode(f"bot:{SECRET}".encode()).decode()
    assert query == {"service": ["fake-ghcr"], "scope": ["repository:team/app:pull"]}
    for shown in (repr(reg), str(reg), reg.model_dump_json()):
        assert SECRET not in shown and BEARER not in shown


def test_refused_token_never_appears_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_TEST_TOKEN", SECRET + "-expired")
    with FakeGhcr() as ghcr:
        reg = HttpRegistry(
            host=ghcr.host, username="bot", token_env="LOCKSTEP_TEST_TOKEN", timeout_s=5
        )
        with pytest.raises(RegistryError) as info:
            reg.resolve(repository="team/app", reference="v1")
    message = str(info.value)
    assert (
        f"{ghcr.host}/team/app:v1" in message
        and "HTTP 401" in message
        and "$LOCKSTEP_TEST_TOKEN" in message
    )
    assert (
        SECRET not in message
        and SECRET not in repr(info.value.args)
        and info.value.__cause__ is None
    )


def test_bearer_refused_by_the_registry_never_appears_in_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKSTEP_TEST_TOKEN", SECRET)
    with FakeGhcr(accept_bearer=False) as ghcr:
        reg = HttpRegistry(
            host=ghcr.host, username="bot", token_env="LOCKSTEP_TEST_TOKEN", timeout_s=5
        )
        with pytest.raises(RegistryError) as info:
            reg.manifest(repository="team/app", reference="v1")
    message = str(info.value)
    assert (
        "GET" in message
        and "HTTP 401" in message
        and "refused the token in $LOCKSTEP_TEST_TOKEN" in message
    )
    assert SECRET not in message and BEARER not in message


def test_unset_token_env_says_which_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCKSTEP_TEST_TOKEN", raising=False)
    with FakeGhcr() as ghcr:
        reg = HttpRegistry(host=ghcr.host, token_env="LOCKSTEP_TEST_TOKEN", timeout_s=5)
        with pytest.raises(
            RegistryError, match="names \\$LOCKSTEP_TEST_TOKEN, which is unset or empty"
        ):
            reg.resolve(repository="team/app", reference="v1")


def test_anonymous_pull_without_token_env() -> None:
    with FakeGhcr(anonymous_pull=True) as ghcr:
        reg = HttpRegistry(host=ghcr.host, timeout_s=5)
        assert reg.resolve(repository="team/app", reference="v1") == ghcr.digest
    assert [auth for auth, _ in ghcr.token_requests] == [None]


def test_basic_auth_registry_gets_the_token_as_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_TEST_TOKEN", SECRET)
    with FakeGhcr(basic=True) as ghcr:
        reg = HttpRegistry(
            host=ghcr.host, username="bot", token_env="LOCKSTEP_TEST_TOKEN", timeout_s=5
        )
        assert reg.resolve(repository="team/app", reference="v1") == ghcr.digest
    assert ghcr.token_requests == []


def test_digest_falls_back_to_the_hash_of_the_body() -> None:
    """A registry without Docker-Content-Digest: the digest is the sha256 of the manifest bytes."""
    with FakeGhcr(anonymous_pull=True, digest_header=False) as ghcr:
        reg = HttpRegistry(host=ghcr.host, timeout_s=5)
        assert (
            reg.resolve(repository="team/app", reference="v1")
            == ghcr.digest
            == digest_of(ghcr.manifest)
        )


# -- the backend a site file names -----------------------------------------------------------------

SITE = """\
[tpu]
harbor_repo = "https://github.com/marin-community/harbor.git"
harbor_branch = "penfever/working"
consumer_repo = "https://github.com/open-thoughts/OpenThoughts-Agent.git"
consumer_branch = "penfever/working"
image = "{image}"

[registry]
{registry}
"""


def test_registry_for_a_site(tmp_path: Path) -> None:
    site_file = tmp_path / "site.toml"
    site_file.write_text(
        SITE.format(image="127.0.0.1:5000/lab/img", registry='kind = "layout"\nlayout_dir = "oci"')
    )
    layout = registry_for(load_site(site_file))
    assert isinstance(layout, LayoutRegistry) and Path(layout.root) == tmp_path / "oci"

    site_file.write_text(
        SITE.format(
            image="ghcr.io/open-thoughts/openthoughts-agent",
            registry='username = "bot"\ntoken_env = "GHCR_TOKEN"',
        )
    )
    http = registry_for(load_site(site_file))
    assert isinstance(http, HttpRegistry)
    assert (http.base_url, http.username, http.token_env) == (
        "https://ghcr.io",
        "bot",
        "GHCR_TOKEN",
    )


def test_glob_finds_the_topmost_dist_info_and_honours_whiteouts(reg: Registry, repo: str) -> None:
    sp = "opt/venv/lib/python3.12/site-packages"
    push_image(
        reg,
        repo,
        [
            layer(
                f(f"{sp}/harbor-0.8.0.dist-info/METADATA", "Version: 0.8.0"),
                f(f"{sp}/six-1.dist-info/METADATA", "x"),
            ),
            layer(
                whiteout(f"{sp}/harbor-0.8.0.dist-info"),
                f(f"{sp}/harbor-0.8.1.dist-info/METADATA", "Version: 0.8.1"),
            ),
            layer(f("app/README", "app")),
        ],
        tag="v1",
    )
    pattern = f"{sp}/harbor-*.dist-info/METADATA"
    assert reg.glob(repository=repo, reference="v1", pattern=pattern) == [
        f"{sp}/harbor-0.8.1.dist-info/METADATA"
    ]
    assert reg.glob(repository=repo, reference="v1", pattern=f"/{sp}/six-*.dist-info/METADATA") == [
        f"{sp}/six-1.dist-info/METADATA"
    ]
    assert reg.glob(repository=repo, reference="v1", pattern=f"{sp}/*/METADATA/x") == []
    # '*' does not cross '/': the site-packages level alone matches nothing deeper.
    assert reg.glob(repository=repo, reference="v1", pattern=f"{sp}/*") == []


def test_glob_does_not_return_a_whited_out_lower_match(reg: Registry, repo: str) -> None:
    push_image(
        reg,
        repo,
        [layer(f("etc/a.conf", "a")), layer(whiteout("etc/a.conf"), f("etc/keep", "k"))],
        tag="v1",
    )
    assert reg.glob(repository=repo, reference="v1", pattern="etc/*.conf") == []
