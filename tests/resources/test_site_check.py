"""`lockstep site check`'s logic (resources/site/check.py): every error of a site file at once, each
with the line, table and key a load would name, never a secret's value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resources.errors import FileFormatError
from resources.site.check import check_site
from resources.site.load import load_site
from tests.support.site_example import EXAMPLE, example_site

TEXT = EXAMPLE.read_text(encoding="utf-8")
SECRET = "ghp_SiteCheckCanary0123456789"


def edit(text: str, *changes: tuple[str, str]) -> str:
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def line_of(text: str, start: str) -> int:
    """The line that starts with `start` (the example's lines end in comments)."""
    [n] = [n for n, s in enumerate(text.splitlines(), 1) if s.startswith(start)]
    return n


def shown(site: Path) -> list[tuple[int | None, str]]:
    return [(p.line, p.message) for p in check_site(site).errors]


def test_a_valid_site_has_no_errors(tmp_path: Path) -> None:
    report = check_site(example_site(tmp_path))
    assert report.ok and report.errors == [] and report.file == str(tmp_path / "site.toml")


def test_errors_in_five_tables_are_all_reported_at_once_with_their_lines(tmp_path: Path) -> None:
    text = edit(
        TEXT,
        ('consumer_branch = "penfever/working"', 'consumer_branch = "penfever/../working"'),
        ('token_env = "GHCR_TOKEN"\n', f'token_env = "GHCR_TOKEN"\npassword = "{SECRET}"\n'),
        ('cluster = "cw-us-east-02a"', 'clustr = "cw-us-east-02a"'),
        ('memory = "64GB"', 'memory = "lots"'),
        ('nodes = ["dgx1", "dgx2"]', 'nodes = ["dgx1", "dgx5"]'),
        ('name = "tpu-oncall"', 'name = "ml-infra-slack"'),
    )
    site = example_site(tmp_path, text)
    at = {
        key: line_of(text, key)
        for key in (
            'consumer_branch = "penfever/../working"',
            f'password = "{SECRET}"',
            'clustr = "cw-us-east-02a"',
            'memory = "lots"',
            'nodes = ["dgx1", "dgx5"]',
        )
    }
    webhook = [
        n for n, s in enumerate(text.splitlines(), 1) if s.startswith('name = "ml-infra-slack"')
    ][1]
    assert shown(site) == [
        (
            at['consumer_branch = "penfever/../working"'],
            (
                "[tpu] consumer_branch: branch 'penfever/../working' is not a valid git ref "
                "name: it holds '..' or '@{', or is '@'"
            ),
        ),
        (
            at[f'password = "{SECRET}"'],
            (
                "[registry] password: unknown key (secrets are never stored in the site file: "
                "put the NAME of an environment variable in password_env)"
            ),
        ),
        (
            at['clustr = "cw-us-east-02a"'],
            (
                "[iris] clustr: unknown key (not a key of this table: check the spelling, "
                "and that it sits under the right [table] header)"
            ),
        ),
        (
            at['memory = "lots"'],
            (
                "[iris] memory: memory 'lots' is not a size iris accepts: a number and a unit, "
                "e.g. '64GB' or '512MiB'"
            ),
        ),
        # A rule across [jovian] and [spark]: pydantic skips
        # it when another table fails; the check does not.
        (
            at['nodes = ["dgx1", "dgx5"]'],
            (
                "[jovian.lane] nodes: node 'dgx5' is not a [[spark.nodes]] name (the "
                "[[spark.nodes]] are dgx4, dgx1, dgx2, dgx3)"
            ),
        ),
        (
            webhook,
            "[[alerts.webhook]] #2 name: webhook name 'ml-infra-slack' appears more than once",
        ),
    ]
    assert SECRET not in check_site(site).model_dump_json()
    # A load still stops at one of them, word for word.
    with pytest.raises(FileFormatError) as err:
        load_site(site)
    assert (err.value.line, err.value.message) in shown(site)


def test_the_report_names_table_and_key_apart_from_the_message(tmp_path: Path) -> None:
    text = edit(
        TEXT, ("port = 22", "port = 0"), ('\nuser = "benjaminfeuer"', '\nuser = "benjamin feuer"')
    )
    [iris_user, node_port] = check_site(example_site(tmp_path, text)).errors
    assert (iris_user.table, iris_user.key) == ("[iris]", "user")
    assert (node_port.table, node_port.key, node_port.line) == (
        "[[spark.nodes]] #4",
        "port",
        line_of(text, "port = 0"),
    )
    assert node_port.message == "[[spark.nodes]] #4 port: Input should be greater than 0 (got 0)"


def test_every_problem_of_a_rule_across_tables_is_named_not_only_the_first(tmp_path: Path) -> None:
    text = edit(
        TEXT,
        (
            'harbor_repo = "https://github.com/marin-community/harbor.git"',
            'harbor_repo = "http://github.com/marin-community/harbor.git"',
        ),
        (
            'lab_repo = "https://github.com/local-inference-lab/rtx6kpro.git"',
            'lab_repo = "git://github.com/local-inference-lab/rtx6kpro.git"',
        ),
        ('build_node = "dgx4"', 'build_node = "dgx9"'),
        ('relay_key = "/home/bf/.ssh/lane_relay_ed25519"', "# relay_key ="),
        ('relay_known_hosts = "/home/bf/.ssh/lane_known_hosts"', "# relay_known_hosts ="),
    )
    site = example_site(tmp_path, text)
    got = shown(site)
    assert [line for line, _ in got] == sorted(line for line, _ in got) and len(got) == 5
    # A key that is not in the file is found under its table's header: dgx1's entry.
    assert [line for line, m in got if "relay" in m] == [line_of(text, 'name = "dgx1"') - 1] * 2
    says = "\n".join(message for _, message in got)
    for part in (
        (
            "[tpu] harbor_repo: repository URL 'http://github.com/marin-community/harbor.git' "
            "uses 'http'"
        ),
        (
            "[jovian] lab_repo: repository URL "
            "'git://github.com/local-inference-lab/rtx6kpro.git' uses 'git'"
        ),
        "[jovian] build_node: node 'dgx9' is not a [[spark.nodes]] name",
        (
            "[[spark.nodes]] #2 relay_key: node 'dgx1' forwards the relay to 'dgx2' ([jovian] "
            "distribute = "
            '"relay") and has no relay_key'
        ),
        "[[spark.nodes]] #2 relay_known_hosts: node 'dgx1'",
    ):
        assert part in says, says
    with pytest.raises(FileFormatError) as err:  # the load names the first, as before
        load_site(site)
    assert err.value.line == line_of(
        text, 'harbor_repo = "http://github.com/marin-community/harbor.git"'
    )
    assert (err.value.line, err.value.message) == got[0]


def test_two_errors_of_one_table_rule_are_both_named(tmp_path: Path) -> None:
    text = edit(
        TEXT,
        ('cluster = "cw-us-east-02a"', 'cluster = "cw-us-east-02a"\nconfig = "cw.yaml"'),
        ("poll_min_s = 10.0", "poll_min_s = 90.0"),
    )
    got = shown(example_site(tmp_path, text))
    assert got == [
        (
            line_of(text, 'config = "cw.yaml"'),
            (
                "[iris] config: set exactly one of cluster, config, controller_url "
                "(got cluster, config)"
            ),
        ),
        (
            line_of(text, "poll_min_s = 90.0"),
            "[iris] poll_min_s: poll_min_s (90) must not exceed poll_max_s (60)",
        ),
    ]


def test_a_typo_is_one_error_not_also_the_missing_key_it_meant(tmp_path: Path) -> None:
    text = edit(TEXT, ('harbor_branch = "main"', 'harbour_branch = "main"'))
    assert shown(example_site(tmp_path, text)) == [
        (
            line_of(text, 'harbour_branch = "main"'),
            "[tpu] harbour_branch: unknown key (did you mean harbor_branch?)",
        )
    ]


def test_a_secret_in_an_env_key_is_named_without_its_value(tmp_path: Path) -> None:
    text = edit(
        TEXT,
        ('passphrase_env = "SPARK_SSH_PASSPHRASE"', f'passphrase_env = "{SECRET}"'),
        (
            'url_env = "LOCKSTEP_SLACK_WEBHOOK"',
            'url_env = "https://hooks.slack.com/services/T0/B0/XyZsecret"',
        ),
    )
    report = check_site(example_site(tmp_path, text))
    assert [(p.table, p.key) for p in report.errors] == [
        ("[spark]", "passphrase_env"),
        ("[[alerts.webhook]] #1", "url_env"),
    ]
    assert all("must be the NAME of an environment variable" in p.message for p in report.errors)
    assert SECRET not in report.model_dump_json() and "XyZsecret" not in report.model_dump_json()


def test_every_trusted_key_file_that_is_not_a_key_is_named(tmp_path: Path) -> None:
    text = edit(
        TEXT,
        (
            'trusted_keys = ["keys/lockstep-attest.pub"]',
            'trusted_keys = ["keys/gone.pub", "keys/lockstep-attest.pub", "keys/not-a-key.pub"]',
        ),
    )
    site = example_site(tmp_path, text)
    (tmp_path / "keys" / "not-a-key.pub").write_text("ssh-ed25519 AAAA... not a PEM\n")
    report = check_site(site)
    line = line_of(
        text, 'trusted_keys = ["keys/gone.pub", "keys/lockstep-attest.pub", "keys/not-a-key.pub"]'
    )
    assert [(p.line, p.table, p.key, p.message.split(":")[0]) for p in report.errors] == [
        (line, "[attest]", "trusted_keys", "[attest] trusted_keys #1"),
        (line, "[attest]", "trusted_keys", "[attest] trusted_keys #3"),
    ]
    assert "gone.pub is not a file" in report.errors[0].message


def test_key_files_are_read_even_when_another_table_is_broken(tmp_path: Path) -> None:
    text = edit(TEXT, ('memory = "64GB"', 'memory = "lots"'))
    site = example_site(tmp_path, text)
    (tmp_path / "keys" / "lockstep-attest.pub").unlink()
    assert [p.key for p in check_site(site).errors] == ["memory", "trusted_keys"]


def test_a_toml_syntax_error_is_the_one_error(tmp_path: Path) -> None:
    text = edit(
        TEXT,
        ('harbor_branch = "main"', "harbor_branch = main"),
        ('memory = "64GB"', 'memory = "lots"'),
    )
    [problem] = check_site(example_site(tmp_path, text)).errors
    assert problem.line == line_of(text, "harbor_branch = main") and problem.message.startswith(
        "not valid TOML"
    )
    assert (problem.table, problem.key) == (None, None)


CORPUS = sorted((Path(__file__).resolve().parent.parent / "corpus" / "site").glob("*.toml"))
_EXPECT = re.compile(rb"^# expect: line=(\d+) value=(.*?)(?: secret=(\S+))?$")


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_corpus_file_is_refused_with_the_loads_error_among_its_errors(path: Path) -> None:
    m = _EXPECT.match(path.read_bytes().split(b"\n", 1)[0])
    assert m, path
    line, value, secret = int(m[1]), m[2].decode(), (m[3] or b"").decode()
    report = check_site(path)
    assert not report.ok and all(p.file == str(path) and p.line for p in report.errors)
    with pytest.raises(FileFormatError) as err:
        load_site(path)
    assert (err.value.line, err.value.message) in [(p.line, p.message) for p in report.errors]
    assert any(p.line == line and value in p.message for p in report.errors), report.errors
    if secret:
        assert secret not in report.model_dump_json()
