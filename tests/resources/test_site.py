"""Site file: errors name the file, the line, the key and what is wrong; secrets are never stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.errors import FileFormatError, LockstepError
from resources.site import SITE_ENV, load_site

GOOD = """\
[site]
name = "test"

[tpu]
harbor_repo = "https://github.com/marin-community/harbor.git"
harbor_branch = "penfever/working"
consumer_repo = "https://github.com/open-thoughts/OpenThoughts-Agent.git"
consumer_branch = "penfever/working"
image = "ghcr.io/open-thoughts/openthoughts-agent"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "site.toml"
    p.write_text(text)
    return p


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
    err = error_for(tmp_path, GOOD.replace('image = "ghcr.io/open-thoughts/openthoughts-agent"\n', ""))
    assert str(err) == f"{tmp_path / 'site.toml'}:4: [tpu] image: required key is missing"


def test_key_in_the_wrong_table_is_an_error_not_ignored(tmp_path: Path) -> None:
    # The recipe TOML trap: a key that lands in another table must not be silently dropped.
    err = error_for(tmp_path, GOOD.replace('name = "test"\n', 'name = "test"\nharbor_branch = "main"\n'))
    assert err.line == 3
    assert "[site] harbor_branch: unknown key" in str(err) and "right [table]" in str(err)


def test_bad_value_names_the_value(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace('consumer_branch = "penfever/working"', 'consumer_branch = "a..b"'))
    assert err.line == 8 and "'a..b'" in str(err) and "plain branch name" in str(err)


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
    err = error_for(tmp_path, GOOD.replace('harbor_branch = "penfever/working"', "harbor_branch = penfever"))
    assert err.line == 6 and "not valid TOML" in str(err)


def test_site_path_comes_from_env_and_a_missing_file_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SITE_ENV, str(write(tmp_path, GOOD)))
    assert load_site().site.name == "test"
    monkeypatch.delenv(SITE_ENV)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LockstepError, match=r"\.sandbox/site\.toml: no site file here \(run `lockstep sandbox up`"):
        load_site()
