"""The registry client against a real docker-registry, directly and through a fault-injecting proxy.

What ghcr does to a client on a bad day (429 with Retry-After, 503, a token endpoint that fails, a
download reset halfway, a body cut short) is played by tests/support/registry_proxy.py in front of a
real `docker-registry`; the proxy counts what the client sent, so retries, resumes, token scopes and
"each layer opened once" are checked at the wire. Retry waits are recorded, never waited.
"""

from __future__ import annotations

import email.utils
import gzip
import io
import json
import os
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import zstandard

from resources.registry import (
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_LAYER_ZSTD,
    HttpRegistry,
    LayoutRegistry,
    Registry,
    RegistryError,
    digest_of,
    transport,
)
from resources.registry.transport import retry_after_s
from resources.site.tpu import Probe, TpuSection
from tests.support.images import (
    Layer,
    f,
    layer,
    push_image,
    small_image,
    tar_bytes,
    whiteout,
)
from tests.support.registry_proxy import Fault, RegistryProxy
from tests.support.registry_server import RegistryServer
from tpu_assets.inspection import CHECK_INSTALLED, CHECK_PROBES, verify_image
from tpu_assets.models import BuiltImage, HarborPin

TOKEN_ENV = "LOCKSTEP_TEST_PROXY_TOKEN"
SECRET = "ghp_ProxyTestSecret0123456789"


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waited: list[float] = []
    monkeypatch.setattr(transport, "backoff_sleep", waited.append)
    return waited


@pytest.fixture
def proxy(registry_server: RegistryServer) -> Iterator[RegistryProxy]:
    with RegistryProxy(upstream=registry_server.host) as running:
        yield running


@pytest.fixture
def authed_proxy(registry_server: RegistryServer) -> Iterator[RegistryProxy]:
    with RegistryProxy(upstream=registry_server.host, auth=True) as running:
        yield running


@pytest.fixture
def repo() -> str:
    return f"lockstep/f-{uuid.uuid4().hex[:12]}"


def direct(server: RegistryServer, tmp_path: Path) -> HttpRegistry:
    """Straight to the registry: to set up images without going through the faults."""
    return HttpRegistry(
        host=server.host, timeout_s=30, blob_cache_dir=str(tmp_path / "direct-blobs")
    )


def via(proxy: RegistryProxy, tmp_path: Path, **fields: object) -> HttpRegistry:
    return HttpRegistry(
        host=proxy.host, timeout_s=10, blob_cache_dir=str(tmp_path / "blobs"), **fields
    )  # type: ignore[arg-type]


def blob_gets(proxy: RegistryProxy, digest: str) -> list:
    return proxy.requests("GET", f"/blobs/{digest}$")


# -- retries of reads ------------------------------------------------------------------------------


def test_429_waits_what_retry_after_says(
    proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    img = small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    proxy.fail("HEAD", "/manifests/v1$", Fault.status_code(429, retry_after="7"))
    assert via(proxy, tmp_path).resolve(repository=repo, reference="v1") == img.digest
    assert sleeps == [7.0]
    assert [s.status for s in proxy.requests("HEAD", "/manifests/v1$")] == [429, 200]


def test_retry_after_as_an_http_date_and_capped(
    proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    now = 1_900_000_000.0
    assert retry_after_s(email.utils.formatdate(now + 12, usegmt=True), now=now) == pytest.approx(
        12.0
    )
    assert retry_after_s("soon") is None and retry_after_s(None) is None
    img = small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    proxy.fail("GET", "/manifests/v1$", Fault.status_code(429, retry_after="3600"))
    got = via(proxy, tmp_path, retry_max_wait_s=20.0, retry_budget_s=60.0).manifest(
        repository=repo, reference="v1"
    )
    assert got is not None and got.digest == img.digest
    assert sleeps == [20.0]


def test_503_is_retried_with_jittered_backoff(
    proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    img = small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    proxy.fail("GET", "/manifests/v1$", Fault.status_code(503), times=2)
    got = via(proxy, tmp_path, retry_base_s=0.5).manifest(repository=repo, reference="v1")
    assert got is not None and got.digest == img.digest
    # full jitter under 0.5 * 2^n
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0
    assert [s.status for s in proxy.requests("GET", "/manifests/v1$")] == [503, 503, 200]


def test_a_registry_that_keeps_failing_is_given_up_on(
    proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    proxy.fail("HEAD", "/manifests/v1$", Fault.status_code(503), times=50)
    with pytest.raises(RegistryError, match=r"HTTP 503 .*kept failing \(3 tries"):
        via(proxy, tmp_path, retry_attempts=3).resolve(repository=repo, reference="v1")
    assert len(proxy.requests("HEAD", "/manifests/v1$")) == 3 and len(sleeps) == 2


def test_the_time_budget_bounds_the_retries(
    proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    proxy.fail("HEAD", "/manifests/v1$", Fault.status_code(429, retry_after="30"), times=50)
    with pytest.raises(RegistryError, match="HTTP 429"):
        via(proxy, tmp_path, retry_attempts=10, retry_budget_s=45.0).resolve(
            repository=repo, reference="v1"
        )
    assert sleeps == [30.0]  # a second 30 s wait would end past the 45 s budget


def test_token_endpoint_500_is_retried(
    authed_proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    img = small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    authed_proxy.fail("GET", "^/token$", Fault.status_code(500))
    assert via(authed_proxy, tmp_path).resolve(repository=repo, reference="v1") == img.digest
    assert [s.status for s in authed_proxy.requests("GET", "^/token")] == [500, 200] and len(
        sleeps
    ) == 1


# -- resuming a broken download --------------------------------------------------------------------


def big_layer(tmp_path: Path) -> tuple[Layer, bytes]:
    """A plain tar whose file of interest sits after ~1 MiB of incompressible bytes."""
    payload = os.urandom(1024 * 1024)
    return layer(
        f("opt/blob.bin", payload), f("etc/after", "read past the break"), compress=False
    ), payload


def test_a_reset_mid_blob_is_resumed_with_a_range_request(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    lay, _ = big_layer(tmp_path)
    img = push_image(direct(registry_server, tmp_path), repo, [lay], tag="v1")
    digest = img.layer_digests[0]
    proxy.fail("GET", f"/blobs/{digest}$", Fault.reset(after=300_000))
    got = via(proxy, tmp_path).read_file(repository=repo, reference="v1", path="/etc/after")
    assert got is not None and got.data == b"read past the break"
    first, again = blob_gets(proxy, digest)
    assert first.fault == "reset" and "Range" not in first.headers
    start = int(again.headers["Range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= 300_000 and again.status == 206
    # each byte pulled at most once
    assert len(lay.blob) - 20_000 <= got.bytes_read <= len(lay.blob)


def test_a_resume_answered_200_skips_what_was_read(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    lay, _ = big_layer(tmp_path)
    img = push_image(direct(registry_server, tmp_path), repo, [lay], tag="v1")
    digest = img.layer_digests[0]
    proxy.fail("GET", f"/blobs/{digest}$", Fault.reset(after=200_000))
    proxy.fail("GET", f"/blobs/{digest}$", Fault.ignore_range())
    got = via(proxy, tmp_path).read_file(repository=repo, reference="v1", path="/etc/after")
    assert got is not None and got.data == b"read past the break"
    assert [s.status for s in blob_gets(proxy, digest)] == [200, 200]


def test_a_download_that_never_resumes_names_the_offset(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    lay, _ = big_layer(tmp_path)
    img = push_image(direct(registry_server, tmp_path), repo, [lay], tag="v1")
    digest = img.layer_digests[0]
    proxy.fail("GET", f"/blobs/{digest}$", Fault.reset(after=100_000))
    proxy.fail("GET", f"/blobs/{digest}$", Fault.status_code(503), times=50)
    with pytest.raises(RegistryError, match=rf"{digest}.*(broke off at byte \d+|HTTP 503)"):
        via(proxy, tmp_path, retry_attempts=3).read_file(
            repository=repo, reference="v1", path="/etc/after"
        )


# -- truncated and corrupt layers are errors, never a fall-through ---------------------------------


def stale_below_truncated_top() -> tuple[list[Layer], int]:
    """Layer 0 holds a stale etc/conf; layer 1 (plain tar) holds etc/other then the new etc/conf.
    Returns the layers and the byte offset of etc/conf's header in layer 1: cut there, the tar ends
    cleanly at a member boundary."""
    top = tar_bytes(f("etc/other", "o" * 700), f("etc/conf", "new"))
    cut = 512 + 1024  # etc/other's header and its 700 bytes padded to two blocks
    with tarfile.open(fileobj=io.BytesIO(top[:cut])) as tar:
        assert tar.getnames() == ["etc/other"]
    return [
        layer(f("etc/conf", "stale")),
        Layer(blob=top, media_type=OCI_LAYER_TAR, diff_id=digest_of(top)),
    ], cut


def test_a_truncated_plain_tar_layer_is_an_error_not_the_stale_copy_below(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    layers, cut = stale_below_truncated_top()
    img = push_image(direct(registry_server, tmp_path), repo, layers, tag="v1")
    proxy.fail("GET", f"/blobs/{img.layer_digests[1]}$", Fault.truncate(after=cut))
    with pytest.raises(
        RegistryError,
        match=rf"{img.layer_digests[1]}: layer blob is {cut} bytes, but its "
        rf"descriptor says {len(layers[1].blob)}",
    ):
        via(proxy, tmp_path).read_file(repository=repo, reference="v1", path="/etc/conf")
    assert (
        via(proxy, tmp_path).read_file(repository=repo, reference="v1", path="/etc/conf").data
        == b"new"
    )


def test_a_truncated_layer_in_a_layout_is_an_error_too(tmp_path: Path) -> None:
    reg = LayoutRegistry(root=str(tmp_path / "layout"))
    layers, cut = stale_below_truncated_top()
    img = push_image(reg, "team/app", layers, tag="v1")
    blob = (
        tmp_path
        / "layout"
        / "team"
        / "app"
        / "blobs"
        / "sha256"
        / img.layer_digests[1].removeprefix("sha256:")
    )
    blob.write_bytes(blob.read_bytes()[:cut])
    with pytest.raises(RegistryError, match="is truncated or corrupt"):
        reg.read_file(repository="team/app", reference="v1", path="/etc/conf")
    with pytest.raises(RegistryError, match="is truncated or corrupt"):
        reg.glob(repository="team/app", reference="v1", pattern="etc/con*")


def test_a_corrupt_cached_blob_is_dropped(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    img = push_image(
        direct(registry_server, tmp_path),
        repo,
        [layer(f("etc/a", "A")), layer(f("etc/b", "B"))],
        tag="v1",
    )
    reg = via(proxy, tmp_path)
    # layer 1 passed: cached
    assert reg.read_file(repository=repo, reference="v1", path="/etc/a").data == b"A"
    cached = tmp_path / "blobs" / "sha256" / img.layer_digests[1].removeprefix("sha256:")
    assert cached.is_file()
    cached.write_bytes(b"\x1f\x8b" + cached.read_bytes()[2:-5])
    with pytest.raises(RegistryError, match=img.layer_digests[1]):
        reg.read_file(repository=repo, reference="v1", path="/etc/a")
    assert not cached.exists()
    assert reg.read_file(repository=repo, reference="v1", path="/etc/a").data == b"A"


# -- layer formats -------------------------------------------------------------------------------


def backends(server: RegistryServer, tmp_path: Path) -> list[Registry]:
    return [direct(server, tmp_path), LayoutRegistry(root=str(tmp_path / "layout"))]


def test_a_multi_member_gzip_layer_reads(
    registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    """eStargz writes a layer as many gzip members; tarfile's own r|gz stops after the first."""
    plain = tar_bytes(
        f("a/first", "1" * 3000), f("b/second", "2" * 3000), f("c/third", "third member")
    )
    blob = (
        gzip.compress(plain[:1024], mtime=0)
        + gzip.compress(plain[1024:5000], mtime=0)
        + gzip.compress(plain[5000:], mtime=0)
    )
    # the reason this matters
    with (
        pytest.raises(tarfile.ReadError),
        tarfile.open(fileobj=io.BytesIO(blob), mode="r|gz") as tar,
    ):
        [m.name for m in tar]
    multi = Layer(blob=blob, media_type=OCI_LAYER_GZIP, diff_id=digest_of(plain))
    for reg in backends(registry_server, tmp_path):
        push_image(reg, repo, [multi], tag="v1")
        assert (
            reg.read_file(repository=repo, reference="v1", path="/c/third").data == b"third member"
        )
        assert reg.glob(repository=repo, reference="v1", pattern="*/second") == ["b/second"]


def test_a_zstd_layer_reads(registry_server: RegistryServer, repo: str, tmp_path: Path) -> None:
    plain = tar_bytes(f("etc/zstd", "compressed with zstd"), f("etc/more", os.urandom(200_000)))
    frames = zstandard.ZstdCompressor().compress(
        plain[:2048]
    ) + zstandard.ZstdCompressor().compress(plain[2048:])
    for reg in backends(registry_server, tmp_path):
        for blob in (zstandard.ZstdCompressor(level=3).compress(plain), frames):
            push_image(
                reg,
                repo,
                [
                    layer(f("etc/zstd", "stale gzip below")),
                    Layer(blob=blob, media_type=OCI_LAYER_ZSTD, diff_id=digest_of(plain)),
                ],
                tag="v1",
            )
            got = reg.read_file(repository=repo, reference="v1", path="/etc/zstd")
            assert got is not None and (got.data, got.layer_index) == (b"compressed with zstd", 1)


# -- writes ----------------------------------------------------------------------------------------


def test_a_write_answered_503_fails_after_exactly_one_put(
    proxy: RegistryProxy,
    registry_server: RegistryServer,
    repo: str,
    tmp_path: Path,
    sleeps: list[float],
) -> None:
    base = small_image(direct(registry_server, tmp_path), repo, "x")
    proxy.fail("PUT", "/manifests/", Fault.status_code(503), times=5)
    with pytest.raises(RegistryError, match=r"PUT .*HTTP 503.*a write is not retried blindly"):
        via(proxy, tmp_path).push_manifest(
            repository=repo, raw=base.raw, media_type=json.loads(base.raw)["mediaType"], tag=None
        )
    assert len(proxy.requests("PUT", "/manifests/")) == 1 and sleeps == []


def test_a_blob_upload_answered_503_is_not_retried(
    proxy: RegistryProxy, repo: str, tmp_path: Path
) -> None:
    proxy.fail("POST", "/blobs/uploads/$", Fault.status_code(503), times=5)
    with pytest.raises(RegistryError, match=r"POST .*HTTP 503"):
        via(proxy, tmp_path).push_blob(
            repository=repo, data=b"layer bytes", media_type=OCI_LAYER_TAR
        )
    assert len(proxy.requests("POST")) == 1 and proxy.requests("PUT") == []


def test_a_write_asks_for_push_scope_at_its_first_challenge(
    authed_proxy: RegistryProxy, repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    reg = via(authed_proxy, tmp_path, username="bot", token_env=TOKEN_ENV)
    img = small_image(reg, repo, "pushed through bearer auth", tag="v1")
    scopes = [t["scope"] for t in authed_proxy.token_requests]
    # The HEAD before an upload reads (pull); the first write's token request already asks to push,
    # and every token after that is reused: one exchange per (repository, actions).
    assert scopes == [f"repository:{repo}:pull", f"repository:{repo}:pull,push"]
    assert all(t["basic"] == "True" for t in authed_proxy.token_requests)
    writes = [s for s in authed_proxy.seen if s.method in ("POST", "PUT")]
    # one challenge, never a 403
    assert [s.status for s in writes if s.status in (401, 403)] == [401]
    assert reg.resolve(repository=repo, reference="v1") == img.digest
    assert len(authed_proxy.token_requests) == 2
    assert SECRET not in repr(reg) and all(SECRET not in str(s.headers) for s in authed_proxy.seen)


# -- why a 404 -----------------------------------------------------------------------------------


def test_docker_registry_answers_manifest_unknown_for_an_unknown_repository_too(
    registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    """What the real server says (distribution 2.8):
    the body code alone cannot tell the two apart."""
    small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    codes = {}
    for name, tag in ((repo, "v2"), (f"{repo}-never-pushed", "v1")):
        resp = requests.get(f"http://{registry_server.host}/v2/{name}/manifests/{tag}", timeout=10)
        codes[name] = (resp.status_code, resp.json()["errors"][0]["code"])
    assert set(codes.values()) == {(404, "MANIFEST_UNKNOWN")}
    tags = requests.get(
        f"http://{registry_server.host}/v2/{repo}-never-pushed/tags/list", timeout=10
    )
    assert (tags.status_code, tags.json()["errors"][0]["code"]) == (404, "NAME_UNKNOWN")


def test_absence_tells_an_unknown_tag_from_an_unknown_repository(
    registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    reg = direct(registry_server, tmp_path)
    small_image(reg, repo, "x", tag="v1")
    missing = digest_of(b"never pushed")
    assert reg.resolve(repository=repo, reference="v2") is None
    assert reg.absence(repository=repo, reference="v2") == f"absent: {repo} has no tag v2"
    assert reg.manifest(repository=repo, reference=missing) is None
    assert (
        reg.absence(repository=repo, reference=missing)
        == f"absent: {repo} has no manifest {missing}"
    )
    other = f"{repo}-never-pushed"
    assert reg.resolve(repository=other, reference="v1") is None
    assert (
        reg.absence(repository=other, reference="v1")
        == f"absent: the registry has no repository {other}"
    )
    with pytest.raises(
        RegistryError, match=rf"{other}:v1: no such image \(absent: the registry has no repository"
    ):
        reg.read_file(repository=other, reference="v1", path="/etc/which")
    assert (
        LayoutRegistry(root=str(tmp_path / "layout")).absence(repository=repo, reference="v2")
        == "absent"
    )


def test_absence_behind_a_login_may_be_a_token_that_cannot_read(
    registry_server: RegistryServer, repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_image(direct(registry_server, tmp_path), repo, "x", tag="v1")
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    with RegistryProxy(upstream=registry_server.host, auth=True, unreadable={repo}) as ghcr_like:
        with_token = via(ghcr_like, tmp_path, username="bot", token_env=TOKEN_ENV)
        anonymous = via(ghcr_like, tmp_path)
        for reg in (with_token, anonymous):
            assert reg.resolve(repository=repo, reference="v1") is None
        assert with_token.absence(repository=repo, reference="v1") == (
            f"absent, or not readable with the token in ${TOKEN_ENV}"
        )
        assert anonymous.absence(repository=repo, reference="v1") == (
            "absent, or private and needs a token (set token_env in the site's [registry])"
        )
        # The HEAD said 404 without a body: one GET learnt the code, and only when asked.
        assert [s.status for s in ghcr_like.requests("GET", f"/v2/{repo}/manifests/v1$")] == [
            404,
            404,
        ]
    with RegistryProxy(upstream=registry_server.host, auth=True) as readable:
        reg = via(readable, tmp_path, username="bot", token_env=TOKEN_ENV)
        assert reg.resolve(repository=repo, reference="v2") is None
        assert reg.absence(repository=repo, reference="v2") == f"absent: {repo} has no tag v2"


# -- one scan per verification, and the blob cache -------------------------------------------------

SP = "opt/openthoughts/.venv/lib/python3.12/site-packages"
COMMIT = "42bc23b59d697b5b" + "0" * 24
JOB_PY = """\
class Job:
    def resume(self):
        if existing_config != self.config:
            logger.warning("config changed since the job started; keeping the new one")
        return self
"""


def harbor_image(reg: Registry, repo: str) -> list[str]:
    base = layer(
        f("etc/os-release", "debian"), f("opt/base/blob.bin", os.urandom(300_000)), compress=False
    )
    pip = layer(
        f(f"{SP}/six.py", "six"),
        f(f"{SP}/harbor/__init__.py", "from harbor.job import Job\n"),
        f(f"{SP}/harbor/job.py", JOB_PY),
        f(f"{SP}/harbor/util.py", "def helper():\n    return 1\n"),
        f(f"{SP}/harbor-0.4.2.dist-info/METADATA", "Name: harbor\nVersion: 0.4.2\n"),
        f(
            f"{SP}/harbor-0.4.2.dist-info/direct_url.json",
            json.dumps(
                {
                    "url": "https://github.com/marin-community/harbor.git",
                    "vcs_info": {"vcs": "git", "commit_id": COMMIT},
                }
            ),
        ),
        f(f"{SP}/zz/padding.bin", os.urandom(200_000)),
    )
    app = layer(f("app/README", "lockstep"), whiteout(f"{SP}/six.py"))
    return push_image(reg, repo, [base, pip, app], tag="tpu-0123abc").layer_digests


def three_probes() -> list[Probe]:
    return [
        Probe(
            name="guard",
            path="harbor/job.py",
            anchor=r"^\s*if existing_config != self\.config:\s*$",
            must_follow=r"logger\.warning\(",
            must_not_follow=r"^\s*raise\b",
        ),
        Probe(name="every module imports", path="harbor/*.py", anchor=r".", within=1),
        Probe(
            name="helper",
            path=f"/{SP}/harbor/util.py",
            anchor=r"^def helper",
            must_follow=r"return",
        ),
    ]


def test_a_verification_opens_each_layer_once_and_the_second_reads_from_the_cache(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    digests = harbor_image(direct(registry_server, tmp_path), repo)
    manifest = direct(registry_server, tmp_path).manifest(repository=repo, reference="tpu-0123abc")
    assert manifest is not None
    built = BuiltImage(
        consumer_commit="c" * 40,
        gitsha="0123abc",
        ref=f"{proxy.host}/{repo}:tpu-0123abc",
        digest=manifest.digest,
        lock_pin=HarborPin(commit=COMMIT, version="0.4.2"),
        dockerfile_commit=COMMIT,
        job_id="job-1",
        job_state="SUCCEEDED",
    )
    tpu = TpuSection(
        harbor_repo="https://example.invalid/harbor.git",
        harbor_branch="main",
        consumer_repo="https://example.invalid/consumer.git",
        consumer_branch="main",
        image=f"{proxy.host}/{repo}",
        probes=three_probes(),
    )

    first = verify_image(via(proxy, tmp_path), built=built, tpu=tpu, repository=repo)
    assert all(f.passed for f in first.values()), first
    assert "installed harbor 0.4.2 @ 42bc23b5 = lock" in first[CHECK_INSTALLED].description
    # guard, job.py/util.py/__init__.py, helper
    assert first[CHECK_PROBES].description.count("holds") == 5
    # The pip layer decides everything: the top layer is passed through, the base never opened.
    assert {d: len(blob_gets(proxy, d)) for d in digests} == {
        digests[0]: 0,
        digests[1]: 1,
        digests[2]: 1,
    }

    before = len(proxy.seen)
    # a new process, same cache
    second = verify_image(via(proxy, tmp_path), built=built, tpu=tpu, repository=repo)
    assert second == first
    assert [s for s in proxy.seen[before:] if "/blobs/" in s.path] == []


def test_scan_answers_paths_globs_and_symlinks_in_one_walk(
    registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    from resources.registry import GlobQuery
    from tests.support.images import hardlink, symlink

    for reg in backends(registry_server, tmp_path):
        push_image(
            reg,
            repo,
            [
                layer(f("usr/lib/real.txt", "real"), f("etc/old.conf", "old")),
                layer(
                    f("opt/a.conf", "A"),
                    hardlink("opt/b.conf", "opt/a.conf"),
                    symlink("opt/c.conf", "/usr/lib/real.txt"),
                    whiteout("etc/old.conf"),
                    symlink("opt/top", "../usr/lib/real.txt"),
                ),
            ],
            tag="v1",
        )
        scan = reg.scan(
            repository=repo,
            reference="v1",
            paths=["/opt/top", "/etc/old.conf", "/nope"],
            globs=[GlobQuery(pattern="opt/*.conf", read=True), GlobQuery(pattern="etc/*.conf")],
        )
        assert scan.glob("opt/*.conf") == ["opt/a.conf", "opt/b.conf", "opt/c.conf"]
        assert [scan.file(p).data for p in scan.glob("opt/*.conf")] == [b"A", b"A", b"real"]  # type: ignore[union-attr]
        assert scan.file("/opt/top").data == b"real"  # type: ignore[union-attr]
        assert scan.file("/etc/old.conf") is None and scan.file("nope") is None
        assert scan.glob("etc/*.conf") == []
        with pytest.raises(KeyError, match="not part of this scan"):
            scan.file("/usr/lib/real.txt")


def test_the_blob_cache_stays_under_its_bound(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    layers = [layer(f(f"l{i}/data", os.urandom(60_000)), compress=False) for i in range(4)]
    img = push_image(direct(registry_server, tmp_path), repo, layers, tag="v1")
    reg = via(proxy, tmp_path, blob_cache_bytes=150_000)
    # passes through 3, 2, 1
    assert reg.read_file(repository=repo, reference="v1", path="/l0/data") is not None
    cached = sorted(p.name for p in (tmp_path / "blobs" / "sha256").iterdir())
    total = sum(p.stat().st_size for p in (tmp_path / "blobs" / "sha256").iterdir())
    assert total <= 150_000 and len(cached) == 2
    # Least recently used go first: layer 3 (read first) was evicted, the last two kept.
    assert cached == sorted(d.removeprefix("sha256:") for d in img.layer_digests[1:3])
    assert not list((tmp_path / "blobs" / "tmp").iterdir())


def test_an_unwritable_cache_costs_the_cache_not_the_read(
    proxy: RegistryProxy, registry_server: RegistryServer, repo: str, tmp_path: Path
) -> None:
    push_image(
        direct(registry_server, tmp_path),
        repo,
        [layer(f("etc/a", "A")), layer(f("etc/b", "B"))],
        tag="v1",
    )
    (tmp_path / "not-a-dir").write_text("a file where the cache directory should be")
    reg = HttpRegistry(
        host=proxy.host, timeout_s=10, blob_cache_dir=str(tmp_path / "not-a-dir" / "blobs")
    )
    for _ in range(2):
        assert reg.read_file(repository=repo, reference="v1", path="/etc/a").data == b"A"  # type: ignore[union-attr]
