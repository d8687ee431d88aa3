"""resources/site/ and resources/iris/ as packages: their modules import one another one way (no
circle, not even under TYPE_CHECKING or inside a function), `__init__.py` re-exports nothing
(importing one module loads only what it needs), and the site's code locations are its location
tables."""

from __future__ import annotations

import ast
import tomllib
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from resources.errors import LockstepError
from resources.site.fields import LocationSection, Owners, RepoUrl
from resources.site.schema import LOCATIONS, SiteConfig, location_tables
from tests.support.site_text import GOOD

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("resources.site", "resources.iris")


def package_edges(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports, anywhere in the file."""
    folder = root.joinpath(*package.split("."))
    modules = {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    edges: dict[str, set[str]] = {}
    for name in sorted(modules):
        tree = ast.parse(root.joinpath(*name.split(".")).with_suffix(".py").read_text())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}:{node.lineno}: a relative import (use absolute)"
                base = node.module or ""
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle among `edges` ([] when they form a DAG), as the modules around it."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_imports_form_a_dag(package: str) -> None:
    edges = package_edges(package)
    assert len(edges) >= 4 and any(edges.values()), f"the walk found no modules: {edges}"
    assert cycle(edges) == [], f"{package} has an import circle: {' -> '.join(cycle(edges))}"


def test_the_walk_catches_a_circle_even_under_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "resources" / "site"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "schema.py").write_text("from resources.site.cache import SiteCache\n")
    (pkg / "cache.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from resources.site.schema import SiteConfig\n"
    )
    (pkg / "load.py").write_text("def f():\n    from resources.site import schema\n")
    edges = package_edges("resources.site", tmp_path)
    assert edges == {
        "resources.site.cache": {"resources.site.schema"},
        "resources.site.load": {"resources.site.schema"},
        "resources.site.schema": {"resources.site.cache"},
    }
    assert cycle(edges) == ["resources.site.cache", "resources.site.schema", "resources.site.cache"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_init_imports_nothing(package: str) -> None:
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init} says what the package holds"
    statements = [
        n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]
    assert statements == [], f"{init} re-exports nothing: import each name from its module"


def test_no_flat_module_is_left_beside_the_packages() -> None:
    left = sorted(
        p.name for p in (ROOT / "resources").glob("*.py") if p.stem.startswith(("site", "iris"))
    )
    assert left == []


def test_the_locations_are_the_sites_location_tables_and_the_workspaces() -> None:
    assert LOCATIONS == ("tpu", "jovian")
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    assert [e["python_module"]["location_name"] for e in workspace["load_from"]] == list(LOCATIONS)


class GpuSection(LocationSection):
    """A third pipeline's table, as a new location would add it."""

    REPOSITORY_KEYS: typing.ClassVar[tuple[str, ...]] = ("gpu_repo",)
    gpu_repo: RepoUrl
    owners: Owners | None = Field(default=None)


class ThreeLocations(SiteConfig):
    gpu: GpuSection | None = None


def test_a_third_location_table_is_a_location_with_owners_and_repository_urls() -> None:
    data = tomllib.loads(GOOD)
    data["site"] = {**data.get("site", {}), "owners": ["team:ml-infra"]}
    data["gpu"] = {"gpu_repo": "https://example.com/gpu.git", "owners": ["gpu@example.com"]}
    site = ThreeLocations.model_validate(data)
    assert location_tables(ThreeLocations) == ("tpu", "jovian", "gpu")
    assert site.owners("gpu") == ["gpu@example.com"] and site.owners("tpu") == ["team:ml-infra"]
    assert site.repository_urls()[("gpu", "gpu_repo")] == "https://example.com/gpu.git"
    # the [site] url_schemes rule covers the new table's URLs too
    data["gpu"]["gpu_repo"] = "http://example.com/gpu.git"
    with pytest.raises(ValueError, match=r"uses 'http'; this site allows"):
        ThreeLocations.model_validate(data)


def test_owners_of_a_location_the_site_does_not_have_is_an_error() -> None:
    site = SiteConfig.model_validate(tomllib.loads(GOOD))
    said = r"no code location 'gpu' in the site \(its locations: tpu, jovian\)"
    with pytest.raises(LockstepError, match=said):
        site.owners("gpu")
