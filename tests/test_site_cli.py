"""`lockstep site check` and `lockstep site schema` as a person (or CI, or an editor) runs them."""

from __future__ import annotations

import datetime
import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner, Result

from lockstep.cli import main
from resources.site.load import SITE_ENV
from tests.support.site_example import EXAMPLE, example_site

CORPUS = sorted((Path(__file__).resolve().parent / "corpus" / "site").glob("*.toml"))
_EXPECT = re.compile(r"^# expect: line=(\d+) value=(.*?)(?: secret=(\S+))?$")


def lockstep(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def broken_example(tmp_path: Path) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8")
    for old, new in (('cluster = "cw-us-east-02a"', 'clustr = "cw-us-east-02a"'),
                     ('harbor_branch = "main"', 'harbor_branch = "-main"'),
                     ('nodes = ["dgx1", "dgx2"]', 'nodes = ["dgx1", "dgx7"]')):  # fmt: skip
        text = text.replace(old, new)
    return example_site(tmp_path, text)


def test_a_valid_file_exits_0_and_says_so(tmp_path: Path) -> None:
    site = example_site(tmp_path)
    result = lockstep("site", "check", str(site))
    assert (result.exit_code, result.output) == (0, f"{site}: valid site file\n")


def test_a_broken_file_exits_1_with_one_file_line_message_per_error_then_a_summary(
    tmp_path: Path,
) -> None:
    site = broken_example(tmp_path)
    result = lockstep("site", "check", str(site))
    lines = result.output.splitlines()
    assert result.exit_code == 1 and lines[-1] == f"{site}: 3 errors"
    assert [
        re.match(rf"^{re.escape(str(site))}:(\d+): (\[[^\]]+\]) (\w+): ", line).groups()[1:]
        for line in lines[:-1]
    ] == [("[tpu]", "harbor_branch"), ("[iris]", "clustr"), ("[jovian.lane]", "nodes")]


def test_json_gives_file_ok_and_every_error_with_file_line_table_key_message(
    tmp_path: Path,
) -> None:
    site = broken_example(tmp_path)
    result = lockstep("site", "check", str(site), "--json")
    report = json.loads(result.output)
    assert result.exit_code == 1 and set(report) == {"file", "ok", "errors"}
    assert report["file"] == str(site) and report["ok"] is False
    assert [set(e) for e in report["errors"]] == [{"file", "line", "table", "key", "message"}] * 3
    [branch, _, lane] = report["errors"]
    text = site.read_text().splitlines()
    assert branch["file"] == str(site) and text[branch["line"] - 1].startswith(
        'harbor_branch = "-main"'
    )
    assert (lane["table"], lane["key"]) == ("[jovian.lane]", "nodes") and "'dgx7'" in lane[
        "message"
    ]
    ok = lockstep("site", "check", str(example_site(tmp_path / "ok")), "--json")
    assert (
        ok.exit_code == 0
        and json.loads(ok.output)["ok"] is True
        and json.loads(ok.output)["errors"] == []
    )


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_corpus_file_is_refused_with_its_line(path: Path) -> None:
    line, value, secret = _EXPECT.match(path.read_text(errors="replace").split("\n", 1)[0]).groups()  # type: ignore[union-attr]
    result = lockstep("site", "check", str(path))
    assert result.exit_code == 1
    assert any(
        out.startswith(f"{path}:{line}: ") and value in out for out in result.output.splitlines()
    ), result.output
    assert not secret or secret not in result.output


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert lockstep("site", "check", str(tmp_path / "nowhere.toml")).exit_code == 2
    assert lockstep("site", "check", str(tmp_path)).exit_code == 2  # a directory
    assert lockstep("site", "check", "--jsn").exit_code == 2


def test_without_file_it_checks_lockstep_site_then_the_sandboxs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SITE_ENV, str(broken_example(tmp_path)))
    assert lockstep("site", "check").output.endswith(f"{tmp_path / 'site.toml'}: 3 errors\n")
    monkeypatch.setenv(SITE_ENV, str(tmp_path / "gone.toml"))
    result = lockstep("site", "check")
    assert (result.exit_code, result.output.splitlines()[0]) == (
        1,
        f"{tmp_path / 'gone.toml'}: no site file here (check {SITE_ENV})",
    )
    monkeypatch.delenv(SITE_ENV)
    monkeypatch.chdir(tmp_path)
    result = lockstep("site", "check", "--json")
    assert result.exit_code == 1 and json.loads(result.output)["errors"][0]["message"] == (
        "no site file here (run `lockstep sandbox up`, or give FILE)"
    )
    example_site(tmp_path / ".sandbox")
    assert lockstep("site", "check").exit_code == 0


def test_schema_prints_a_draft_2020_12_schema_the_example_satisfies() -> None:
    result = lockstep("site", "schema")
    assert result.exit_code == 0
    schema = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(schema)
    example = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    for window in example["tpu"]["promotion"]["freeze"]:  # TOML datetimes, as JSON holds them
        window.update(
            {k: v.isoformat() for k, v in window.items() if isinstance(v, datetime.datetime)}
        )
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(example)) == []


def test_a_missing_trusted_key_file_is_named_at_the_line_of_the_file_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = example_site(tmp_path)
    (tmp_path / "keys" / "lockstep-attest.pub").unlink()
    monkeypatch.chdir(tmp_path)
    result = lockstep("site", "check", "site.toml")
    line = next(
        n for n, s in enumerate(site.read_text().splitlines(), 1) if s.startswith("trusted_keys = ")
    )
    assert result.exit_code == 1 and result.output.splitlines() == [
        (
            f"site.toml:{line}: [attest] trusted_keys #1: "
            f"{tmp_path / 'keys' / 'lockstep-attest.pub'} is not a file "
            "(a public key PEM, e.g. cosign.pub)"
        ),
        "site.toml: 1 error",
    ]
