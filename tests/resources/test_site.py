"""Site file: errors name the file, the line, the
key and what is wrong; secrets are never stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.errors import FileFormatError, LockstepError
from resources.site.load import SITE_ENV, load_site
from tests.support.site_text import GOOD, write


def error_for(tmp_path: Path, text: str) -> FileFormatError:
    with pytest.raises(FileFormatError) as info:
        load_site(write(tmp_path, text))
    return info.value


def test_good_file_loads_with_defaults(tmp_path: Path) -> None:
    site = load_site(write(tmp_path, GOOD))
    assert site.tpu.harbor_branch == "penfever/working"
    assert site.tpu.dockerfile == "docker/Dockerfile.tpu" and site.tpu.harbor_package == "harbor"
    assert site.path == (tmp_path / "site.toml").resolve()


def test_missing_key_names_file_table_and_line(tmp_path: Path) -> None:
    err = error_for(
        tmp_path, GOOD.replace('image = "ghcr.io/open-thoughts/openthoughts-agent"\n', "")
    )
    assert str(err) == f"{tmp_path / 'site.toml'}:4: [tpu] image: required key is missing"


def test_key_in_the_wrong_table_is_an_error_not_ignored(tmp_path: Path) -> None:
    # The recipe TOML trap: a key that lands in another table must not be silently dropped.
    err = error_for(
        tmp_path, GOOD.replace('name = "test"\n', 'name = "test"\nharbor_branch = "main"\n')
    )
    assert err.line == 3
    assert "[site] harbor_branch: unknown key" in str(err) and "right [table]" in str(err)


def test_bad_value_names_the_value(tmp_path: Path) -> None:
    err = error_for(
        tmp_path, GOOD.replace('consumer_branch = "penfever/working"', 'consumer_branch = "a..b"')
    )
    assert (
        err.line == 8
        and "[tpu] consumer_branch: branch 'a..b' is not a valid git ref name" in str(err)
    )


def test_secret_value_in_the_file_is_refused_without_echoing_it(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD + 'ghcr_token = "ghp_dontLeakMe123"\n')
    assert err.line == 10 and "ghcr_token_env" in str(err)
    assert "ghp_dontLeakMe123" not in str(err)


def test_env_name_field_refuses_a_secret_and_does_not_echo_it(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD + '\n[registry]\ntoken_env = "ghp_dontLeakMe123"\n')
    assert err.line == 12 and "[registry] token_env" in str(err)
    assert "NAME of an environment variable" in str(err) and "ghp_dontLeakMe123" not in str(err)
    ok = load_site(write(tmp_path, GOOD + '\n[registry]\ntoken_env = "GHCR_TOKEN"\n'))
    assert ok.secret_env_names() == ["GHCR_TOKEN"]


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    err = error_for(
        tmp_path, GOOD.replace('harbor_branch = "penfever/working"', "harbor_branch = penfever")
    )
    assert err.line == 6 and "not valid TOML" in str(err)


def test_site_path_comes_from_env_and_a_missing_file_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SITE_ENV, str(write(tmp_path, GOOD)))
    assert load_site().site.name == "test"
    monkeypatch.delenv(SITE_ENV)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        LockstepError, match=r"\.sandbox/site\.toml: no site file here \(run `lockstep sandbox up`"
    ):
        load_site()


def test_owners_per_location_fall_back_to_the_site_owners(tmp_path: Path) -> None:
    text = GOOD.replace('name = "test"\n', 'name = "test"\nowners = ["team:ml-infra"]\n')
    site = load_site(write(tmp_path, text))
    assert site.owners("tpu") == ["team:ml-infra"] and site.owners("jovian") == ["team:ml-infra"]
    site = load_site(write(tmp_path, text + 'owners = ["tpu-oncall@example.com"]\n'))
    assert site.owners("tpu") == ["tpu-oncall@example.com"] and site.owners("jovian") == [
        "team:ml-infra"
    ]


def test_an_owner_dagster_would_reject_names_line_and_value(tmp_path: Path) -> None:
    err = error_for(
        tmp_path,
        GOOD.replace('name = "test"\n', 'name = "test"\nowners = ["team:ok", "ml infra"]\n'),
    )
    assert err.line == 3
    assert "[site] owners: owner 'ml infra' must be an email address or 'team:<name>'" in str(err)


def test_an_entry_of_an_array_of_tables_is_named_by_its_position_and_line(tmp_path: Path) -> None:
    text = (
        GOOD
        + '\n[[spark.nodes]]\nname = "a"\nhost = "h"\n\n[[spark.nodes]]\nname = "b"\nport = 0\n'
    )
    err = error_for(tmp_path, text)
    assert err.line == text.splitlines().index("port = 0") + 1
    assert "[[spark.nodes]] #2 port:" in str(err) and "(got 0)" in str(err)


LINKS = """
[links]
image = "https://registry.example/harbor/projects/{repository}/artifacts/{digest}"

[[links.commit]]
remote = "https://github.com/"
url = "https://github.com/{path}/commit/{sha}"

[[links.commit]]
remote = "git@github.com:"
url = "https://github.com/{path}/commit/{sha}"
"""


def test_links_give_commit_and_digest_pages_without_credentials(tmp_path: Path) -> None:
    from resources.links import commit_url, image_url

    links = load_site(write(tmp_path, GOOD + LINKS)).links
    sha = "a" * 40
    assert commit_url(links, "https://github.com/marin-community/harbor.git", sha) == (
        f"https://github.com/marin-community/harbor/commit/{sha}"
    )
    assert (
        commit_url(links, "git@github.com:org/vllm.git", sha)
        == f"https://github.com/org/vllm/commit/{sha}"
    )
    # Credentials in the remote neither stop the match nor reach the link.
    url = commit_url(
        links, "https://penfever:ghp_S3cretTokenValue@github.com/marin-community/harbor.git", sha
    )
    assert url == f"https://github.com/marin-community/harbor/commit/{sha}"
    assert commit_url(links, "file:///srv/git/harbor.git", sha) is None
    assert image_url(links, "ghcr.io/open-thoughts/openthoughts-agent", "sha256:" + "b" * 64) == (
        "https://registry.example/harbor/projects/open-thoughts/openthoughts-agent/artifacts/sha256:"
        + "b" * 64
    )


def test_a_link_template_with_an_unknown_placeholder_names_line_and_allowed_ones(
    tmp_path: Path,
) -> None:
    text = GOOD + LINKS.replace(
        'commit/{sha}"\n\n[[links.commit]]\nremote = "git@',
        'commit/{commit}"\n\n[[links.commit]]\nremote = "git@',
    )
    err = error_for(tmp_path, text)
    assert (
        err.line == text.splitlines().index('url = "https://github.com/{path}/commit/{commit}"') + 1
    )
    assert "[[links.commit]] #1 url: uses {commit}; allowed: {path}, {sha}" in str(err)


def test_links_image_key_after_an_array_header_lands_in_the_array_and_is_an_error(
    tmp_path: Path,
) -> None:
    # The TOML trap: a key written after [[links.commit]] belongs to that entry, not to [links].
    text = GOOD + (
        '\n[[links.commit]]\nremote = "https://github.com/"\nurl = '
        '"https://github.com/{path}/commit/{sha}"\nimage = "https://x/{digest}"\n'
    )
    err = error_for(tmp_path, text)
    assert err.line == len(text.splitlines())
    assert "[[links.commit]] #1 image: unknown key" in str(err) and "right [table]" in str(err)


def test_an_upload_pack_url_is_refused_at_load_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = GOOD.replace(
        '"https://github.com/marin-community/harbor.git"', f'"--upload-pack=touch {marker}"'
    )
    err = error_for(tmp_path, text)
    assert str(err).startswith(
        f"{tmp_path / 'site.toml'}:5: [tpu] harbor_repo: repository URL '--upload-pack=touch"
    )
    assert not marker.exists()


def test_url_schemes_default_to_https_and_ssh_and_the_sandbox_adds_file(tmp_path: Path) -> None:
    local = GOOD.replace(
        "https://github.com/marin-community/harbor.git", "file:///srv/git/harbor.git"
    )
    err = error_for(tmp_path, local)
    assert err.line == 5 and "uses 'file'; this site allows https, ssh ([site] url_schemes)" in str(
        err
    )
    site = load_site(
        write(
            tmp_path,
            local.replace('name = "test"', 'name = "test"\nurl_schemes = ["https", "ssh", "file"]'),
        )
    )
    assert site.tpu.harbor_repo == "file:///srv/git/harbor.git" and site.site.url_schemes == [
        "https",
        "ssh",
        "file",
    ]
    scp = load_site(
        write(
            tmp_path,
            GOOD.replace("https://github.com/open-thoughts/", "git@github.com:open-thoughts/"),
        )
    )
    assert scp.tpu.consumer_repo.startswith("git@github.com:")  # scp-like counts as ssh


def test_a_credential_in_a_refused_url_is_not_echoed(tmp_path: Path) -> None:
    url = "http://bot:ghp_NeverEcho0123@github.com/marin-community/harbor.git"
    err = error_for(
        tmp_path, GOOD.replace('"https://github.com/marin-community/harbor.git"', f'"{url}"')
    )
    assert "ghp_NeverEcho0123" not in str(err) and "uses 'http'" in str(err)


@pytest.mark.parametrize(
    "size", ["64GB", "64 GB", "120gb", "512MiB", "1.5G", "8g", "4096", "100 bytes", "2TB"]
)
def test_a_size_the_site_accepts_is_one_iris_reads_the_same_way(size: str) -> None:
    # iris parses --memory/--disk with humanfriendly.parse_size(binary=True) (cluster/types.py).
    humanfriendly = pytest.importorskip("humanfriendly")
    from resources.site.rules import size_bytes

    assert size_bytes("memory", size) == humanfriendly.parse_size(size, binary=True)
