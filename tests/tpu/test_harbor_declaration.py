"""How the consumer's pyproject.toml declares harbor, read and edited in both shapes in the field.

The real consumer (open-thoughts/OpenThoughts-Agent at 53265d2f) has a PEP 508 direct reference in
[project].dependencies that follows a branch; the other shape is a [tool.uv.sources] git entry.
"""

from __future__ import annotations

import tomllib

import pytest

from resources.errors import FileFormatError
from tpu_assets.harbor_declaration import read_declaration, set_declared_ref, split_vcs_url

H1 = "1" * 40
REAL = """[project]
name = "OpenThoughts-Agent"
requires-python = ">=3.12"
dependencies = [
    "pydantic>=2.0.0,<3.0.0",
    # the canonical fork, on its main branch
    "harbor[daytona] @ git+https://github.com/marin-community/harbor.git@main ; python_version >= '3.10'",  # keep
    "dynamic-semaphore @ git+https://github.com/penfever/dynamic-semaphore",
]

[project.optional-dependencies]
harbor-docker = ["harbor[docker] @ git+https://github.com/marin-community/harbor.git@main"]
"""  # noqa: E501
SOURCES = """[project]
name = "consumer"  # a comment that must survive
dependencies = ["harbor[daytona]"]

[tool.uv.sources]
harbor = { git = "https://github.com/marin-community/harbor", branch = "penfever/working" }
other = { path = "../other" }
"""


def test_the_real_consumers_direct_reference_is_read_with_its_line_and_ref() -> None:
    declared = read_declaration(REAL, "harbor")
    assert declared.shape == "direct_reference" and declared.line == 7
    assert declared.url == "https://github.com/marin-community/harbor.git"
    assert (declared.ref_kind, declared.ref) == ("rev", "main")
    assert declared.following("main").startswith(
        '"harbor[daytona] @ git+https://github.com/marin-community/harbor.git@main'
    )


def test_pinning_a_direct_reference_changes_only_its_refs_and_release_puts_the_branch_back() -> (
    None
):
    pinned = set_declared_ref(REAL, "harbor", rev=H1)
    changed = [
        (a, b) for a, b in zip(REAL.splitlines(), pinned.splitlines(), strict=True) if a != b
    ]
    assert [b for _, b in changed] == [
        (
            f'    "harbor[daytona] @ git+https://github.com/marin-community/harbor.git@{H1} ; '
            "python_version >= '3.10'\",  # keep"
        ),
        f'harbor-docker = ["harbor[docker] @ git+https://github.com/marin-community/harbor.git@{H1}"]',
    ]  # extras, markers, comments and every other dependency untouched; every place harbor is named
    assert read_declaration(pinned, "harbor").ref == H1
    assert set_declared_ref(pinned, "harbor", branch="main") == REAL


def test_pinning_a_uv_source_by_rev_changes_only_its_branch_key_and_release_puts_the_branch_back() -> (  # noqa: E501
    None
):
    pinned = set_declared_ref(SOURCES, "harbor", rev=H1)
    source = tomllib.loads(pinned)["tool"]["uv"]["sources"]["harbor"]
    assert source == {"git": "https://github.com/marin-community/harbor", "rev": H1}
    assert "# a comment that must survive" in pinned and 'other = { path = "../other" }' in pinned
    declared = read_declaration(pinned, "harbor")
    assert (declared.shape, declared.ref_kind, declared.ref, declared.line) == (
        "uv_source",
        "rev",
        H1,
        6,
    )
    # not one other byte
    assert pinned == SOURCES.replace('branch = "penfever/working"', f'rev = "{H1}"')
    assert set_declared_ref(pinned, "harbor", branch="penfever/working") == SOURCES


def test_a_uv_source_written_as_its_own_table_is_re_pointed_too() -> None:
    text = (
        '[project]\nname = "c"\ndependencies = ["harbor"]\n\n[tool.uv.sources.harbor]\n'
        'git = "https://h.example/harbor.git"\nbranch = "main"  # the canonical branch\n'
    )
    assert set_declared_ref(text, "harbor", rev=H1) == text.replace(
        'branch = "main"', f'rev = "{H1}"'
    )


def test_a_uv_source_without_a_ref_cannot_be_pinned_and_says_what_to_declare() -> None:
    text = (
        '[project]\nname = "c"\ndependencies = ["harbor"]\n[tool.uv.sources]\nharbor = { git = '
        '"https://h.example/h.git" }\n'
    )
    assert read_declaration(text, "harbor").ref_kind is None
    with pytest.raises(
        FileFormatError, match=r"^pyproject.toml:5: \[tool.uv.sources\] harbor names no branch"
    ):
        set_declared_ref(text, "harbor", rev=H1)


def test_uv_sources_win_over_a_direct_reference_as_they_do_in_uv() -> None:
    both = REAL + (
        "\n[tool.uv.sources]\nharbor = { git = "
        '"https://github.com/marin-community/harbor.git", branch = "x" }\n'
    )
    assert read_declaration(both, "harbor").shape == "uv_source"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "git+ssh://git@github.com/marin-community/harbor.git@main",
            ("ssh://git@github.com/marin-community/harbor.git", "main"),
        ),
        (
            "git+file:///srv/harbor.git@penfever/working",
            ("file:///srv/harbor.git", "penfever/working"),
        ),
        (
            "git+https://github.com/marin-community/harbor.git",
            ("https://github.com/marin-community/harbor.git", None),
        ),
        (
            "git+https://github.com/o/h.git@v1#subdirectory=lib",
            ("https://github.com/o/h.git", "v1"),
        ),
    ],
)
def test_the_ref_is_what_follows_the_last_at_of_the_path_as_pip_and_uv_read_it(
    url: str, expected: tuple[str, str | None]
) -> None:
    assert split_vcs_url(url) == expected


def test_a_literal_string_stays_a_literal_string() -> None:
    text = (
        "[project]\nname = 'c'\ndependencies = ['harbor @ git+https://h.example/harbor.git@main']\n"
    )
    assert set_declared_ref(text, "harbor", rev=H1) == text.replace("@main", f"@{H1}")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '[project]\nname = "c"\ndependencies = ["harbor>=0.8"]\n',
            "neither as a git direct reference",
        ),
        (
            '[project]\nname = "c"\ndependencies = ["harbor @ https://h.example/harbor-0.8.tar.gz"]\n',
            "not a git repository",
        ),
        (
            (
                '[project]\nname = "c"\ndependencies = ["harbor"]\n[tool.uv.sources]\nharbor = '
                '{ path = "../harbor" }\n'
            ),
            "is not a git source",
        ),
        (
            (
                '[project]\nname = "c"\ndependencies = [\n  "harbor @ git+https://a.example/h.git@main",\n'
                '  "harbor @ git+https://b.example/h.git@main",\n]\n'
            ),
            "2 different URLs (lines 4, 5)",
        ),
        ('[project\nname = "c"\n', "not valid TOML"),
        (
            "[project]\nname = 'c'\ndependencies = " + "[" * 5_000 + "]" * 5_000 + "\n",
            "nested more than 100 levels",
        ),
    ],
)
def test_a_declaration_lockstep_cannot_follow_is_refused_naming_pyproject(
    text: str, needle: str
) -> None:
    with pytest.raises(FileFormatError, match=r"^pyproject\.toml") as err:
        read_declaration(text, "harbor")
    assert needle in str(err.value)
    with pytest.raises(FileFormatError):
        set_declared_ref(text, "harbor", rev=H1)
