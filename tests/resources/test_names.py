"""The name rules every parser and loader applies: strict, and held to git's own ref rules."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from resources.names import (
    KNOWN_SCHEMES,
    NameRefused,
    PathEscape,
    check_name,
    check_ref,
    check_relative_path,
    check_url,
    ref_problem,
    under,
)
from tests.support.hostile import HOSTILE_NAMES, HOSTILE_URLS
from tests.support.report import count

BRANCHES = [
    "main",
    "penfever/working",
    "integration/r35-cut",
    "release-1.2",
    "a.b_c-d",
    *HOSTILE_NAMES,
    "a..b",
    "a.lock",
    "a/.b",
    "a/",
    "a//b",
    "@",
    "a@{1}",
    "a~1",
    "a^",
    "a:b",
    "a?",
    "a*",
    "a[",
    "a\\b",
    "refs/heads/main",
    "a.",
    "x\x7f",
    "tab\tname",
]


@pytest.mark.parametrize("name", BRANCHES)
def test_the_ref_rule_agrees_with_git_check_ref_format(name: str) -> None:
    if "\x00" in name:  # no process can be given it as an argument; ours must refuse it
        assert ref_problem(name) is not None
        return
    # `refs/heads/` in front: git never sees a leading '-' as its own option.
    git_says_ok = (
        subprocess.run(
            ["git", "check-ref-format", f"refs/heads/{name}"], capture_output=True, check=False
        ).returncode
        == 0
    )
    ours_ok = ref_problem(name) is None
    # We refuse a full ref where a short branch name belongs (git accepts the string), and a leading
    # '-' or a bare '@': `refs/heads/-x` is legal, but `--branch` refuses both.
    if name.startswith(("refs/", "-")) or name == "@":
        assert not ours_ok
    else:
        assert ours_ok == git_says_ok, f"{name!r}: git says {'ok' if git_says_ok else 'refused'}"


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_name_is_refused_showing_the_value(name: str) -> None:
    count("hostile names refused (names rule)")
    with pytest.raises(NameRefused) as err:
        check_name("rev", name)
    assert repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["r35", "r39", "glm53-2x", "spark-01", "a.b_c-d", "R1"])
def test_plain_names_pass(name: str) -> None:
    assert check_name("rev", name) == name


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_a_hostile_url_is_refused(url: str) -> None:
    count("hostile URLs refused (URL rule)")
    with pytest.raises(NameRefused):
        check_url("harbor_repo", url)


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/org/repo.git",
        "ssh://git@github.com/org/repo",
        "git@github.com:org/repo.git",
        "file:///srv/git/repo.git",
    ],
)
def test_ordinary_urls_pass_within_their_schemes(url: str) -> None:
    assert check_url("repo", url, KNOWN_SCHEMES) == url


def test_a_scheme_the_site_does_not_allow_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(NameRefused, match="uses 'file'; this site allows https, ssh"):
        check_url("repo", "file:///srv/repo.git", ("https", "ssh"))


@pytest.mark.parametrize(
    "path", ["../x", "/etc/passwd", "a/../../b", "a/$(id)", "", "a\\b", "a/-b"]
)
def test_relative_paths_stay_inside(path: str) -> None:
    with pytest.raises(NameRefused):
        check_relative_path("dockerfile", path)
    assert check_relative_path("dockerfile", "docker/Dockerfile.tpu") == "docker/Dockerfile.tpu"


def test_under_refuses_escapes_and_symlinks_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    assert under(root, "profiles", "r35.env") == root.resolve() / "profiles" / "r35.env"
    for parts in (("..", "x"), ("/tmp/x",), ("link", "x"), (".",), ("a", "..", "..", "x")):
        with pytest.raises(PathEscape):
            under(root, *parts)


def test_check_ref_names_the_kind_and_the_rule() -> None:
    with pytest.raises(
        NameRefused, match=r"harbor_branch '-x' is not a valid git ref name: it starts with '-'"
    ):
        check_ref("harbor_branch", "-x")
    assert check_ref("harbor_branch", "penfever/working") == "penfever/working"


SMUGGLED = [
    u
    for u in HOSTILE_URLS
    if "oProxyCommand" in u or "-c" in u.split("/")[2:3] or "%2d" in u.lower()
]


@pytest.mark.parametrize("url", SMUGGLED)
def test_an_option_shaped_user_or_host_is_refused_in_every_url_form_before_any_scheme_rule(
    url: str,
) -> None:
    # Every scheme allowed: the refusal is the option rule's own (or the leading '-' / helper /
    # whitespace rule that comes first), never "not a URL" or "uses
    # <scheme>", so an allow-list cannot let it through.
    with pytest.raises(NameRefused) as err:
        check_url("consumer_repo", url, {*KNOWN_SCHEMES, "git+ssh", "ssh+git"})
    said = str(err.value)
    assert said.startswith(f"consumer_repo {url!r}"), said
    assert any(
        why in said
        for why in ("starts with '-'", "whitespace or a control character", "remote helper")
    ), said


def test_the_option_forms_are_all_there() -> None:
    assert len(SMUGGLED) >= 25 and len(HOSTILE_NAMES) > 120


@pytest.mark.parametrize(
    "url",
    [
        "ssh://git@my-host.example/-x.git",
        "https://a-b.example/org/-repo.git",
        "git@my-host.example:org/-repo.git",
        "ssh://git@[::1]:2222/org/repo.git",
        "file:///tmp/my%20sandbox/repo.git",
        "https://h.example/a%2d-b.git",
    ],
)
def test_a_dash_inside_a_host_or_in_the_path_is_not_an_option(url: str) -> None:
    assert check_url("repo", url, KNOWN_SCHEMES) == url
