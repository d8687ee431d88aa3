"""The tests' layout, so a newcomer can find things:
every helper that is not a test lives in tests/support/,
and no module under tests/ imports a test module (what
tests share is a support module or a conftest fixture)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
# Not tests, not helpers: pytest's own files.
PYTEST_FILES = {"conftest.py", "__init__.py"}


def modules() -> list[Path]:
    """The Python modules of the test packages (data under
    tests/corpus and the like is not in a package)."""
    return sorted(p for p in TESTS.rglob("*.py") if (p.parent / "__init__.py").is_file())


def is_test_module(dotted: str) -> bool:
    return dotted.startswith("tests.") and dotted.rsplit(".", 1)[-1].startswith("test_")


def imports_of_tests(path: Path) -> list[str]:
    """`module:line imported-name` for each import of a test module in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [
                f"{n.lineno}: {a.name}"
                for a in node.names
                if is_test_module(a.name)
                for n in [node]
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if is_test_module(node.module):
                found.append(f"{node.lineno}: {node.module}")
            else:  # `from tests.resources import test_site`
                found += [
                    f"{node.lineno}: {node.module}.{a.name}"
                    for a in node.names
                    if is_test_module(f"{node.module}.{a.name}")
                ]
    return found


def test_the_walk_sees_the_tree() -> None:
    names = {p.relative_to(TESTS).as_posix() for p in modules()}
    assert "test_layout.py" in names and "support/runs.py" in names and "conftest.py" in names


def test_no_module_under_tests_imports_a_test_module() -> None:
    bad = {
        p.relative_to(TESTS).as_posix(): found for p in modules() if (found := imports_of_tests(p))
    }
    assert bad == {}, "move what is shared into tests/support/ (or a conftest.py fixture): " + repr(
        bad
    )


def test_a_test_import_is_caught(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import tests.sensors.test_alerts\nfrom tests.resources.test_site import GOOD\n"
        "from tests.resources import test_git\nfrom tests.support.site_text import GOOD as G\n"
    )
    assert imports_of_tests(sample) == [
        "1: tests.sensors.test_alerts",
        "2: tests.resources.test_site",
        "3: tests.resources.test_git",
    ]


def test_every_helper_that_is_not_a_test_lives_in_tests_support() -> None:
    outside = [
        p.relative_to(TESTS).as_posix()
        for p in modules()
        if not p.name.startswith("test_")
        and p.name not in PYTEST_FILES
        and SUPPORT not in p.parents
    ]
    assert outside == [], f"helpers belong in tests/support/ (or tests/support/<area>/): {outside}"


def test_no_test_module_hides_in_tests_support() -> None:
    tests = [p.relative_to(TESTS).as_posix() for p in SUPPORT.rglob("test_*.py")]
    assert tests == [], (
        f"tests/support/ holds helpers only; put these tests beside the code they test: {tests}"
    )
