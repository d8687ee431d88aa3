"""The Jovian lane's malformed-input corpus: every file under
tests/corpus/{source_lock,cmake,gitmodules, env,recipe}/ is a real-shaped file with ONE defect and
its expected refusal on its first line (`# expect: line=N value=V`). Each must be refused as a
LockstepError that names the file, that line and that value: never accepted, never a traceback. The
parsers are pure, so a case costs milliseconds; `.gitmodules` cases fork one `git config` each.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from jovian_assets.dep_table import check_resolved, parse_cmake
from jovian_assets.dep_trees import submodule_urls
from jovian_assets.inputs import read_text
from jovian_assets.profile import parse_env, recipe_profile_placement
from jovian_assets.source_lock import parse_source_lock
from lockstep.cli import main as lockstep_cli
from resources.errors import FileFormatError
from tests.support.report import REFUSED, tried

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
_EXPECT = re.compile(rb"^# expect: line=(\d+) value=(.*)\n")
PACKAGES = ("vllm", "b12x", "lmcache")

READERS: dict[str, Callable[[str, str], object]] = {
    "source_lock": lambda text, path: parse_source_lock(text, path, required=PACKAGES),
    # What `lockstep lab dep-table` does: a pin left unresolved (undefined or recursive) fails it.
    "cmake": lambda text, path: check_resolved(parse_cmake(text, path)),
    "gitmodules": lambda text, path: submodule_urls(
        text, "https://github.com/vllm-project/FlashMLA.git", path
    ),
    "env": parse_env,
    "recipe": recipe_profile_placement,
}
CASES = sorted(p for kind in READERS for p in (CORPUS / kind).iterdir() if p.is_file())


def expected(path: Path) -> tuple[int, str]:
    m = _EXPECT.match(path.read_bytes())
    assert m, f"{path}: the first line must be '# expect: line=N value=V'"
    return int(m.group(1)), m.group(2).decode()


def test_the_corpus_has_every_format_and_at_least_40_files() -> None:
    per_kind = {kind: len(list((CORPUS / kind).iterdir())) for kind in READERS}
    assert all(n >= 5 for n in per_kind.values()), per_kind
    assert len(CASES) >= 40


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_malformed_file_is_refused_naming_file_line_and_value(path: Path) -> None:
    line, value = expected(path)
    shown = str(path)
    outcome, exc, why = tried(
        lambda: READERS[path.parent.name](read_text(path), shown),
        lambda e: isinstance(e, FileFormatError) and e.line is not None,
    )
    assert outcome == REFUSED, f"{outcome}:\n{why}"
    assert isinstance(exc, FileFormatError), f"{type(exc).__name__}: {exc}"
    assert (exc.path, exc.line) == (shown, line), str(exc)
    assert str(exc).startswith(f"{shown}:{line}: ")
    assert value in exc.message, f"{value!r} not in {exc.message!r}"


@pytest.mark.parametrize(
    "name", ["version_traversal", "repository_option", "invalid_utf8", "bundle_sha256_not_hex"]
)
def test_lab_lock_cli_refuses_with_path_line_and_no_traceback(name: str) -> None:
    path = CORPUS / "source_lock" / f"{name}.source.lock"
    line, value = expected(path)
    out = CliRunner().invoke(lockstep_cli, ["lab", "lock", str(path)])
    assert out.exit_code != 0
    assert f"{path}:{line}: " in out.output and value in out.output
    assert "Traceback" not in out.output and not isinstance(
        out.exception, (UnicodeDecodeError, ValueError)
    )


def test_lab_dep_table_cli_refuses_a_bad_cmake_file_with_its_path_in_the_tree(
    tmp_path: Path,
) -> None:
    for name in ("invalid_utf8", "git_repository_upload_pack"):
        tree = tmp_path / name
        (tree / "cmake/external_projects").mkdir(parents=True)
        source = CORPUS / "cmake" / f"{name}.cmake"
        (tree / "cmake/external_projects/dep.cmake").write_bytes(source.read_bytes())
        line, value = expected(source)
        out = CliRunner().invoke(lockstep_cli, ["lab", "dep-table", str(tree)])
        assert out.exit_code != 0 and "Traceback" not in out.output
        assert (
            f"{tree}/cmake/external_projects/dep.cmake:{line}: " in out.output
            and value in out.output
        )
