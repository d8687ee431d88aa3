"""uv.lock model and the real uv CLI (the copy lockstep ships, not the machine's)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from resources.errors import FileFormatError
from resources.uv import GitSource, UvCli, UvLock, uv_binary
from tests.support.hostile import HOSTILE_URLS
from tests.support.uv_lock import LOCK, SHA


def test_git_source_branch_with_slash_and_commit() -> None:
    src = GitSource.parse(
        f"https://github.com/marin-community/harbor.git?branch=penfever%2Fworking#{SHA}"
    )
    assert (src.url, src.branch, src.commit, src.pinned_by) == (
        "https://github.com/marin-community/harbor.git",
        "penfever/working",
        SHA,
        "branch",
    )


@pytest.mark.parametrize(
    ("query", "kind", "value"),
    [
        ("rev=d9504d19", "rev", "d9504d19"),
        ("tag=v0.8.1", "tag", "v0.8.1"),
        ("", "default branch", None),
    ],
)
def test_git_source_other_pins(query: str, kind: str, value: str | None) -> None:
    src = GitSource.parse(f"file:///r/harbor.git{'?' + query if query else ''}#{SHA}")
    assert src.pinned_by == kind and src.branch is None and src.commit == SHA
    assert (src.rev or src.tag) == value


def test_lock_finds_packages_by_normalized_name_and_line() -> None:
    lock = UvLock.read(Path("uv.lock"), LOCK)
    pkg, src = lock.git_package("harbor-x")
    assert pkg.version == "0.8.1" and src.commit == SHA and lock.line_of("Harbor_X") == 6


def test_lock_errors_name_the_file_and_line() -> None:
    lock = UvLock.read(Path("uv.lock"), LOCK)
    with pytest.raises(FileFormatError, match=r"^uv.lock: no \[\[package\]\] named 'harbor'"):
        lock.git_package("harbor")
    with pytest.raises(
        FileFormatError, match=r"^uv.lock:11: six comes from a registry source, not git"
    ):
        lock.git_package("six")
    with pytest.raises(FileFormatError, match=r"^uv.lock:1: not valid TOML"):
        UvLock.read(Path("uv.lock"), "version = = 1")


def test_uv_is_the_projects_own() -> None:
    # The uv that `uv sync` installed into lockstep's environment, not one found on PATH.
    assert Path(uv_binary()).is_file()
    assert Path(uv_binary()).parent.resolve() == Path(sysconfig.get_path("scripts")).resolve()


def test_lock_check_detects_a_pyproject_change(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "c"\nversion = "0"\nrequires-python = ">=3.11"\ndependencies = '
        "[]\n[tool.uv]\npackage = false\n"
    )
    uv = UvCli(offline=True, timeout_s=60)
    uv.lock(project_dir=tmp_path)
    assert uv.lock_check(project_dir=tmp_path).ok
    text = (tmp_path / "pyproject.toml").read_text().replace('version = "0"', 'version = "1"')
    (tmp_path / "pyproject.toml").write_text(text)
    check = uv.lock_check(project_dir=tmp_path)
    assert not check.ok and check.exit_code != 0 and "needs to be updated" in check.output


@pytest.mark.parametrize(
    ("old", "new", "line", "shown"),
    [
        (f"#{SHA}", "", 8, "no '#<commit>'"),
        (f"#{SHA}", "#2dde0b", 8, "'2dde0b'"),
        (f"#{SHA}", f"#{SHA[:-1]}g", 8, f"'{SHA[:-1]}g'"),
        ("file:///r/harbor.git", "--upload-pack=touch /tmp/lockstep-pwned", 8, "starts with '-'"),
        ("version = 1", 'version = "one"', 1, "(got 'one')"),
        ('version = "1.16.0"', "version = 1.16", 12, "(got 1.16)"),
    ],
)
def test_a_lock_that_pins_no_full_commit_or_has_a_type_error_names_line_and_value(
    old: str, new: str, line: int, shown: str
) -> None:
    with pytest.raises(FileFormatError) as info:
        UvLock.read(Path("uv.lock"), LOCK.replace(old, new, 1))
    assert info.value.line == line and shown in str(info.value)


def test_a_lock_that_is_not_utf8_names_the_line() -> None:
    with pytest.raises(FileFormatError, match=r"^uv.lock:11: not UTF-8 text \(byte 0xff\)"):
        UvLock.read(Path("uv.lock"), LOCK.encode().replace(b'"six"', b'"s\xffx"'))


@pytest.mark.parametrize(
    "url", [u for u in HOSTILE_URLS if u and not any(c in u for c in '"\n\r\t')]
)
def test_a_hostile_git_source_in_a_lock_is_refused_at_its_file_and_line(url: str) -> None:
    # (A TOML string cannot hold a raw quote or line
    # break: those are refused by the TOML reader itself.)
    text = (
        'version = 1\n\n[[package]]\nname = "harbor"\nversion = "0.8.0"\n'
        f'source = {{ git = "{url}?branch=main#{"a" * 40}" }}\n'
    )
    with pytest.raises(FileFormatError) as info:
        UvLock.read(Path("uv.lock"), text)
    assert str(info.value).startswith("uv.lock:6: "), str(info.value)
