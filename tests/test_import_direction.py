"""Imports run one way: definitions.py (the wiring) ->
sensors/ -> each location's plain modules -> resources/.

resources/ imports no location and no sensor; a location's plain modules (and sensors/, lockstep/)
do not import an `*_assets.py`, which only definitions.py imports; no `*_assets.py` imports another.
Every import counts, including those inside functions (a lazy import is still a dependency).

Tests and benches may import an `*_assets.py` only for what it defines itself, the assets and checks
they materialize or patch: its keys come from the location's keys.py, its logic from plain modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("lockstep", "resources", "tpu_assets", "jovian_assets", "sensors")
LOCATIONS = ("tpu_assets", "jovian_assets")
ABOVE_RESOURCES = (*LOCATIONS, "sensors", "lockstep")

# Edges still to remove (importer -> imported): shrinks to empty. Each is a plain helper an
# `*_assets.py` still holds; moving it into a plain module removes the edge.
ALLOWED: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (`from
    a import b` counts as a and, if it is one, a.b)."""
    found: set[str] = set()
    package = module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [
                        *package.split(".")[: len(package.split(".")) - node.level + 1],
                        *([base] if base else []),
                    ]
                )
            found.add(base)
            found |= {
                f"{base}.{alias.name}"
                for alias in node.names
                if (ROOT / Path(*f"{base}.{alias.name}".split("."))).with_suffix(".py").exists()
            }
    return found


def is_assets_module(name: str) -> bool:
    parts = name.split(".")
    return len(parts) > 1 and parts[0] in LOCATIONS and parts[-1].endswith("_assets")


def violations(path: Path) -> set[tuple[str, str, str]]:
    """(rule, importer, imported) for each import of `path` that runs against the direction."""
    me = module_name(path)
    top, leaf = me.split(".")[0], me.rsplit(".", 1)[-1]
    found: set[tuple[str, str, str]] = set()
    for other in imports(path):
        other_top = other.split(".")[0]
        if top == "resources" and other_top in ABOVE_RESOURCES:
            found.add(("resources imports a location or a sensor", me, other))
        if not is_assets_module(other):
            continue
        if is_assets_module(me) and other != me:
            found.add(("an *_assets.py imports another", me, other))
        elif not is_assets_module(me) and leaf != "definitions":
            found.add(("a plain module imports an *_assets.py", me, other))
    return found


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


def defined_names(module: str) -> set[str]:
    """The names `module` defines at its top level (not those it imports)."""
    tree = ast.parse((ROOT / Path(*module.split("."))).with_suffix(".py").read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def borrowed(path: Path) -> set[tuple[str, str]]:
    """(module, name) for each name `path` takes from an `*_assets.py` that the module does not
    define (a key or a helper it only imports), or defines privately (a helper in the wrong
    module)."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.ImportFrom) and node.module and is_assets_module(node.module)):
            continue
        own = defined_names(node.module)
        found |= {
            (node.module, a.name) for a in node.names if a.name not in own or a.name.startswith("_")
        }
    return found


def outside_files() -> list[Path]:
    return sorted(p for d in ("tests", "bench") for p in (ROOT / d).rglob("*.py"))


def test_the_walker_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "resources").mkdir()
    sample = tmp_path / "resources" / "sample.py"
    sample.write_text(
        "import tpu_assets.history\ndef f():\n    from sensors import alerts\n"
        "from jovian_assets.bench_assets import BENCH\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert imports(sample) >= {"tpu_assets.history", "sensors", "jovian_assets.bench_assets"}
        assert {rule for rule, *_ in violations(sample)} == {
            "resources imports a location or a sensor",
            "a plain module imports an *_assets.py",
        }
    finally:
        ROOT = saved
    assert is_assets_module("jovian_assets.bench_assets")
    assert not is_assets_module("tpu_assets.jobs") and not is_assets_module("jovian_assets")


def test_the_walker_fails_an_import_of_an_assets_module_but_the_wiring(tmp_path: Path) -> None:
    location = tmp_path / "tpu_assets"
    location.mkdir()
    (location / "image_assets.py").write_text("KEY = 1\n")
    (location / "promotion_assets.py").write_text("from tpu_assets.image_assets import KEY\n")
    (location / "rejection.py").write_text("def f():\n    from tpu_assets import image_assets\n")
    (location / "definitions.py").write_text("from tpu_assets.image_assets import KEY\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        image = "tpu_assets.image_assets"
        assert violations(location / "promotion_assets.py") == {
            ("an *_assets.py imports another", "tpu_assets.promotion_assets", image)
        }
        assert violations(location / "rejection.py") == {
            ("a plain module imports an *_assets.py", "tpu_assets.rejection", image)
        }
        assert violations(location / "definitions.py") == set()  # the wiring
    finally:
        ROOT = saved


def test_tests_and_benches_take_only_definitions_from_an_assets_module(tmp_path: Path) -> None:
    location = tmp_path / "tpu_assets"
    location.mkdir()
    (location / "lock_assets.py").write_text(
        "from tpu_assets.keys import HARBOR_LOCK\ndef harbor_lock(): ...\ndef _helper(): ...\n"
    )
    sample = tmp_path / "test_sample.py"
    sample.write_text("from tpu_assets.lock_assets import HARBOR_LOCK, _helper, harbor_lock\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        lock = "tpu_assets.lock_assets"
        assert borrowed(sample) == {(lock, "HARBOR_LOCK"), (lock, "_helper")}
    finally:
        ROOT = saved
    found = sorted(b for path in outside_files() for b in borrowed(path))
    listed = "\n".join(f"{m}.{n}" for m, n in found)
    assert not found, f"take these from keys.py or a plain module:\n{listed}"


def test_imports_run_one_way() -> None:
    found = {v for path in product_files() for v in violations(path)}
    unexpected = sorted(v for v in found if (v[1], v[2]) not in ALLOWED)
    assert not unexpected, "imports against the direction:\n" + "\n".join(
        f"{r}: {a} -> {b}" for r, a, b in unexpected
    )


def test_the_allow_list_holds_only_edges_that_still_exist() -> None:
    found = {(a, b) for path in product_files() for _, a, b in violations(path)}
    assert ALLOWED <= found, f"remove from ALLOWED, they are gone: {sorted(ALLOWED - found)}"
