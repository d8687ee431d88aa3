"""A registry whose HEAD names a digest it does not hold: no move to it is ever recorded.

A real docker-registry behind tests/support/registry_proxy.py, whose HEAD of the floating tag
answers a digest the registry has never seen (Fault.head_digest). lockstep GETs the manifest by that
digest before it records a move to it (tpu_assets/promotion.py `served`): the lie is an error naming
the tag and the digest, and the promotion log gets nothing. The honest control goes through the same
proxy and is recorded. The promote run itself against the lie: tests/tpu/test_floating_tag_log.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from resources.registry import HttpRegistry
from resources.site.resource import SiteResource
from tests.support.registry_proxy import Fault, RegistryProxy
from tests.support.registry_server import RegistryServer
from tests.support.report import count
from tests.support.site_example import EXAMPLE, example_site
from tests.support.tpu.registries import push_hand_made_image
from tpu_assets.definitions import defs
from tpu_assets.history import tag_history
from tpu_assets.promotion import PhantomDigest, put_and_reread, resolve_served

REPOSITORY = "org/image"
PHANTOM = "sha256:" + hashlib.sha256(b"a manifest no registry was ever given").hexdigest()


@pytest.fixture
def proxy(registry_server: RegistryServer) -> Iterator[RegistryProxy]:
    with RegistryProxy(upstream=registry_server.host) as running:
        yield running


@pytest.fixture(scope="module")
def real_digest(registry_server: RegistryServer) -> str:
    registry = HttpRegistry(host=registry_server.host)
    digest = push_hand_made_image(registry, repository=REPOSITORY)
    registry.tag(repository=REPOSITORY, digest=digest, tag="tpu")
    return digest


def lie(proxy: RegistryProxy, tag: str = "tpu", *, times: int = 1000) -> None:
    proxy.fail("HEAD", rf"/manifests/{tag}$", Fault.head_digest(PHANTOM), times=times)
    count("faults injected (registry HEAD names a digest it does not hold)")


def test_a_head_naming_a_digest_the_registry_cannot_serve_is_an_error_naming_tag_and_digest(
    proxy: RegistryProxy, real_digest: str
) -> None:
    lie(proxy)
    registry = HttpRegistry(host=proxy.host)
    # the lie, as a HEAD tells it
    assert registry.resolve(repository=REPOSITORY, reference="tpu") == PHANTOM
    with pytest.raises(PhantomDigest) as err:
        resolve_served(registry, repository=REPOSITORY, tag="tpu")
    assert (
        ":tpu" in str(err.value)
        and PHANTOM in str(err.value)
        and "no manifest by that digest" in str(err.value)
    )
    # asked by digest
    assert [s.status for s in proxy.requests("GET", rf"/manifests/{PHANTOM}$")] == [404]


def test_an_honest_head_is_vouched_for_by_a_get_of_its_digest(
    proxy: RegistryProxy, real_digest: str
) -> None:
    assert (
        resolve_served(HttpRegistry(host=proxy.host), repository=REPOSITORY, tag="tpu")
        == real_digest
    )
    assert [s.status for s in proxy.requests("GET", rf"/manifests/{real_digest}$")] == [200]


def test_a_reread_after_the_put_that_names_a_phantom_raises_instead_of_recording(
    proxy: RegistryProxy, real_digest: str
) -> None:
    registry = HttpRegistry(host=proxy.host)
    lie(proxy, "after-put")
    with pytest.raises(PhantomDigest, match=rf":after-put of {REPOSITORY} is at {PHANTOM}"):
        put_and_reread(registry, repository=REPOSITORY, tag="after-put", target=real_digest)
    assert proxy.requests("PUT", r"/manifests/after-put$")  # the PUT itself went through


@pytest.fixture
def site_file(tmp_path: Path, proxy: RegistryProxy) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8")
    image = 'image = "ghcr.io/open-thoughts/openthoughts-agent"'
    login = (
        'username = "penfever"                  # ghcr: the GitHub user the token belongs '
        'to\ntoken_env = "GHCR_TOKEN"\n'
    )
    assert image in text and login in text
    text = text.replace(image, f'image = "{proxy.host}/{REPOSITORY}"').replace(login, "")
    return example_site(tmp_path / "site", text)


def _tick(instance: dg.DagsterInstance, site_file: Path, proxy: RegistryProxy) -> str:
    sensor = defs.resolve_sensor_def("floating_tag_watch")
    resources = {
        "site": SiteResource(path=str(site_file)),
        "registry": HttpRegistry(host=proxy.host),
    }
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        said = sensor(context)
    assert isinstance(said, dg.SkipReason), said
    return said.skip_message or ""


def test_the_watch_records_nothing_for_a_phantom_and_the_real_digest_once_the_lie_stops(
    proxy: RegistryProxy, real_digest: str, site_file: Path
) -> None:
    with dg.DagsterInstance.ephemeral() as instance:
        lie(proxy, times=2)  # the tick's read, and its read again under the lock
        said = _tick(instance, site_file, proxy)
        assert (
            said.startswith("cannot read the floating tag:") and PHANTOM in said and ":tpu" in said
        ), said
        assert "(nothing recorded)" in said and list(tag_history(instance)) == []
        # The control, through the same proxy once it stops lying: the real digest is recorded.
        said = _tick(instance, site_file, proxy)
        (move,) = list(tag_history(instance))
        assert (move.action, move.to_digest) == ("observed", real_digest) and real_digest in said, (
            said
        )
