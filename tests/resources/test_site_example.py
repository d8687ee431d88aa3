"""deploy/site.example.toml: a real site's file (not
the sandbox's) that loads, with every table in it."""

from __future__ import annotations

import re
import tomllib
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from resources.site.fields import ENV_NAME
from resources.site.jovian import DEFAULT_BOOT_GATES
from resources.site.load import load_site
from resources.site.schema import SiteConfig
from resources.site.tpu import HARBOR_GUARD_PROBE
from resources.spark.relay import relay_hops
from tests.support.site_example import EXAMPLE, example_site


def _tables(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every table the site models define, dotted: a
    field whose type is a model, or a list of models."""
    out = []
    # resolved: a table's model may be defined after the one holding it
    hints = typing.get_type_hints(model)
    for name in model.model_fields:
        kinds = [hints[name]]
        while kinds:
            kind = kinds.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                out += [f"{prefix}{name}", *_tables(kind, f"{prefix}{name}.")]
            elif isinstance(kind, types.UnionType) or typing.get_origin(kind) in (
                typing.Union,
                list,
            ):
                kinds += typing.get_args(kind)
    return out


def _present(data: dict, dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    value = data.get(head)
    if not rest or value is None:
        return value is not None
    return any(_present(v, rest) for v in (value if isinstance(value, list) else [value]))


def test_the_example_loads_with_every_table_the_site_models_define(tmp_path: Path) -> None:
    site = load_site(example_site(tmp_path))
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    tables = _tables(SiteConfig)
    # A table added to the models and not to the example fails here: the example is the reference.
    assert {
        "tpu.probes",
        "tpu.promotion.freeze",
        "spark.nodes",
        "jovian.lane",
        "jovian.lineages",
        "jovian.boot_gates",
        "links.commit",
        "attest",
        "alerts.webhook",
    } <= set(tables)
    assert [t for t in tables if not _present(data, t)] == []
    assert (
        site.iris is not None
        and site.jovian is not None
        and site.spark is not None
        and site.attest is not None
    )
    assert (
        site.jovian.lane is not None
        and len(site.jovian.lineages) == 1
        and len(site.tpu.promotion.freeze) == 2
    )
    assert len(site.links.commit) == 2 and [h.name for h in site.alerts.webhook] == [
        "ml-infra-slack",
        "tpu-oncall",
    ]


def test_the_example_is_a_real_site_in_the_runbooks_words(tmp_path: Path) -> None:
    site = load_site(example_site(tmp_path))
    assert (site.tpu.harbor_repo, site.tpu.harbor_branch) == (
        "https://github.com/marin-community/harbor.git",
        "main",
    )
    assert (site.tpu.consumer_repo, site.tpu.consumer_branch) == (
        "git@github.com:open-thoughts/OpenThoughts-Agent.git",
        "penfever/working",
    )
    assert (
        site.tpu.image == "ghcr.io/open-thoughts/openthoughts-agent"
        and site.tpu.floating_tag == "tpu"
    )
    assert site.iris is not None and site.iris.cluster == "cw-us-east-02a"
    # Nothing of the sandbox's: no file:// URL allowed, no local node, a registry over HTTP.
    assert site.site.url_schemes == ["https", "ssh"] and site.registry.kind == "http"
    assert site.spark is not None and {n.name: n.transport for n in site.spark.nodes} == {
        "dgx4": "ssh",
        "dgx1": "ssh",
        "dgx2": "ssh",
        "dgx3": "ssh",
    }
    assert site.jovian is not None and site.jovian.build_node == "dgx4"


def test_the_examples_relay_keys_make_the_hop_the_lane_needs(tmp_path: Path) -> None:
    site = load_site(example_site(tmp_path))
    assert site.jovian is not None and site.jovian.lane is not None and site.spark is not None
    assert site.jovian.distribute == "relay"
    [hop] = relay_hops(site.spark.nodes, chain=site.jovian.lane.nodes)
    assert (hop.src, hop.dst, hop.host) == ("dgx1", "dgx2", "192.168.100.2")
    assert (
        hop.key == "/home/bf/.ssh/lane_relay_ed25519"
        and hop.known_hosts == "/home/bf/.ssh/lane_known_hosts"
    )


def test_the_probe_and_boot_gates_written_out_are_exactly_the_defaults(tmp_path: Path) -> None:
    # The example says they ARE the defaults: a list
    # there replaces the defaults, so they must not drift.
    site = load_site(example_site(tmp_path))
    assert site.tpu.probes == [HARBOR_GUARD_PROBE]
    assert site.jovian is not None and site.jovian.boot_gates == DEFAULT_BOOT_GATES


def test_every_secret_is_an_env_name_that_the_examples_header_lists(tmp_path: Path) -> None:
    site = load_site(example_site(tmp_path))
    names = site.secret_env_names()
    assert len(names) == 6 and all(ENV_NAME.match(n) for n in names), names
    header = EXAMPLE.read_text(encoding="utf-8").split("\n[site]", 1)[0]
    assert [n for n in names if not re.search(rf"^#\s+{n}\b", header, re.MULTILINE)] == []


def test_the_example_commits_no_key_and_says_how_to_make_one() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "-----BEGIN" not in text and not (EXAMPLE.parent / "keys").exists()
    assert "openssl ec -pubout" in text
