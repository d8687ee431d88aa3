"""Every asset key is declared once, in its location's
keys.py: a key spelled anywhere else is a copy that
can drift from the asset it names (resources/alerts.py once carried its own `tpu/harbor_lock`)."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg

from jovian_assets import keys as jovian_keys
from tpu_assets import keys as tpu_keys

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("lockstep", "resources", "tpu_assets", "jovian_assets", "sensors", "sandbox")
KEYS_MODULES = {Path("tpu_assets/keys.py"), Path("jovian_assets/keys.py")}


def _product_files() -> list[Path]:
    return sorted(p.relative_to(ROOT) for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


def _is_asset_key(node: ast.expr) -> bool:
    """`AssetKey` / `dg.AssetKey` / `dagster.AssetKey`, and `AssetKey.from_...` on any of them."""
    if isinstance(node, ast.Attribute) and node.attr.startswith("from_"):
        node = node.value
    return (isinstance(node, ast.Name) and node.id == "AssetKey") or (
        isinstance(node, ast.Attribute) and node.attr == "AssetKey"
    )


def key_literals(path: Path) -> list[int]:
    tree = ast.parse((ROOT / path).read_text(), filename=str(path))  # an absolute path stays itself
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_asset_key(n.func)]


def test_the_walker_finds_a_key_literal(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        'import dagster as dg\nfrom dagster import AssetKey\nA = dg.AssetKey(["a"])\n'
        'B = AssetKey.from_user_string("b")\nC = dg.AssetKey.from_coercible("c")\n'
    )
    assert key_literals(sample) == [3, 4, 5]


def test_asset_keys_are_declared_only_in_a_locations_keys_module() -> None:
    outside = {
        f"{path}:{line}"
        for path in _product_files()
        if path not in KEYS_MODULES
        for line in key_literals(path)
    }
    assert not outside, (
        f"AssetKey spelled outside tpu_assets/keys.py and jovian_assets/keys.py: {sorted(outside)}"
    )


def test_every_key_is_declared_once() -> None:
    declared: dict[dg.AssetKey, list[str]] = {}
    for module in (tpu_keys, jovian_keys):
        for name, value in vars(module).items():
            if isinstance(value, dg.AssetKey):
                declared.setdefault(value, []).append(f"{module.__name__}.{name}")
    twice = {key.to_user_string(): names for key, names in declared.items() if len(names) > 1}
    assert not twice, f"keys declared more than once: {twice}"


def test_every_asset_and_check_of_both_locations_is_named_in_keys() -> None:
    import jovian_assets.definitions as jovian
    import tpu_assets.definitions as tpu

    keys = {
        v for m in (tpu_keys, jovian_keys) for v in vars(m).values() if isinstance(v, dg.AssetKey)
    }
    names = {v for m in (tpu_keys, jovian_keys) for v in vars(m).values() if isinstance(v, str)}
    for defs in (tpu.defs, jovian.defs):
        graph = defs.resolve_asset_graph()
        assert set(graph.get_all_asset_keys()) <= keys
        spec_checks = {c for c in graph.asset_check_keys if c.name not in names}
        # checks declared with @dg.asset_check take their
        # function's name; every AssetCheckSpec names a constant
        decorated = {
            "lock_and_dockerfile_agree",
            "harbor_version_moved",
            "uv_lock_check",
            "floating_tag_bakes_locked_harbor",
        }
        assert {c.name for c in spec_checks} <= decorated, spec_checks
