"""resources/reader.py, the one reader every parser takes files through: a directory, FIFO or device
is refused with its path before anything opens it for reading (a FIFO never blocks), a file past the
size limit is refused, and each parser that reads a path
goes through it. Special files cannot live in git,
so they are made here, in tmp_path, and counted with the corpus's outcomes
(tests/support/report.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from jovian_assets.bench_tools import parse_baseline
from jovian_assets.dep_table import parse_tree
from jovian_assets.inputs import read_text as jovian_read_text
from resources.errors import FileFormatError
from resources.reader import MAX_DEPTH, check_nesting, loads_json, read_bytes
from resources.site.check import check_site
from resources.site.load import load_site
from resources.uv import UvLock
from tests.support.report import count

SITE_ENV = "LOCKSTEP_SITE"


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _refused_naming(read: Callable[[], object], shown: str, what: str) -> FileFormatError:
    # A FIFO would block forever on a plain open(); a
    # watchdog turns a hang into a failure, not a stuck run.
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            read()
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which judges it
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert result, "the read blocked (a FIFO opened without O_NONBLOCK?)"
    exc = result[0]
    assert exc is not None, "the special file was accepted"
    assert isinstance(exc, FileFormatError), f"{type(exc).__name__}: {exc}"
    assert str(exc).startswith(f"{shown}: is {what}") and "not a file" in str(exc), str(exc)
    count("special files refused with their path (directory, FIFO, device)")
    return exc


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_special_file_is_refused_with_its_path_and_kind(kind: str, tmp_path: Path) -> None:
    path = {
        "directory": lambda: tmp_path,
        "fifo": lambda: _fifo(tmp_path / "p"),
        "device": lambda: Path("/dev/zero"),
    }[kind]()
    what = {"directory": "a directory", "fifo": "a FIFO", "device": "a character device"}[kind]
    _refused_naming(lambda: read_bytes(path), str(path), what)


def test_a_file_past_the_limit_is_refused_and_a_missing_one_named(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"a = 1\n" * 100)
    assert read_bytes(big, limit=600) == b"a = 1\n" * 100
    with pytest.raises(FileFormatError, match=r"big.toml: is 600 bytes, more than the 599"):
        read_bytes(big, limit=599)
    with pytest.raises(FileFormatError, match=r"nope.toml: does not exist"):
        read_bytes(tmp_path / "nope.toml")


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_lockstep_site_naming_a_directory_or_fifo_is_refused(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "site.toml"
    target.mkdir() if kind == "directory" else _fifo(target)
    monkeypatch.setenv(SITE_ENV, str(target))
    what = "a directory" if kind == "directory" else "a FIFO"
    _refused_naming(lambda: load_site(), str(target), what)
    check = check_site(target)  # `lockstep site check` says the same, as a problem, not a traceback
    assert not check.ok and f"is {what}" in check.errors[0].message


def test_every_parser_that_reads_a_path_refuses_a_fifo(tmp_path: Path) -> None:
    lock = _fifo(tmp_path / "uv.lock")
    _refused_naming(lambda: UvLock.read(lock), str(lock), "a FIFO")
    env = _fifo(tmp_path / "versions.env")
    _refused_naming(lambda: jovian_read_text(env, "versions.env"), "versions.env", "a FIFO")
    tree = tmp_path / "vllm"
    (tree / "cmake/external_projects").mkdir(parents=True)
    # was skipped as if absent: the tree read as having no top-level pins
    _fifo(tree / "CMakeLists.txt")
    _refused_naming(lambda: parse_tree(tree), "CMakeLists.txt", "a FIFO")


def test_nesting_is_refused_at_its_line_before_the_parser_recurses() -> None:
    deep = "ok = 1\nx = " + "[" * 50_000 + "]" * 50_000 + "\n"
    with pytest.raises(FileFormatError, match=rf"^f.toml:2: nested deeper than {MAX_DEPTH} levels"):
        check_nesting(deep, "f.toml", "toml")
    # Brackets inside strings and comments are not nesting: a real file with them is read as it is.
    check_nesting(
        'a = "' + "[" * 100 + '"\n# ' + "{" * 100 + "\nb = '''\n" + "[" * 100 + "\n'''\n",
        "f.toml",
        "toml",
    )
    check_nesting('{"a": "' + "[" * 100 + '\\" [[["}', "f.json", "json")
    with pytest.raises(FileFormatError, match=r"^f.json:3: nested deeper"):
        loads_json('{\n"a":\n' + "[" * 65 + "]" * 65 + "}", "f.json")
    # the limit itself is fine
    assert isinstance(loads_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "f.json"), list)


def test_a_bench_baseline_nested_50000_deep_or_with_a_duplicate_key_is_refused_with_its_line() -> (
    None
):
    with pytest.raises(FileFormatError, match=r"^recipes/glm53/baseline.json:1: nested deeper"):
        parse_baseline(b"[" * 50_000 + b"]" * 50_000, "recipes/glm53/baseline.json")
    with pytest.raises(
        FileFormatError, match=r"^recipes/glm53/baseline.json:2: \$.rev is given twice"
    ):
        parse_baseline(b'{"rev": "r35",\n "rev": "r36"}', "recipes/glm53/baseline.json")
