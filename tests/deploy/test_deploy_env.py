"""`lockstep deploy env`: every secret the site names,
in the three places a deployment lists them, and
never a value; the files shipped in deploy/docker
are exactly what it prints for the example site."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from lockstep.cli import main
from lockstep.deploy_env import (
    DOTENV_BEGIN,
    DOTENV_END,
    FIXED_RUN_ENV,
    REFRESH,
    deploy_env,
    dotenv_secrets,
    with_dotenv_secrets,
    with_env_vars,
)
from resources.site.load import site_names_only
from tests.support.site_example import EXAMPLE

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
EXAMPLE_SECRETS = [
    "GHCR_TOKEN",
    "IRIS_DOCKER_TOKEN",
    "SPARK_SSH_PASSPHRASE",
    "LOCKSTEP_ATTEST_KEY",
    "LOCKSTEP_SLACK_WEBHOOK",
    "LOCKSTEP_TPU_ONCALL_WEBHOOK",
]


def lockstep(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _small_site(tmp_path: Path) -> Path:
    """A site with [attest] (its key file not made:
    deploy env needs names only), two webhooks and an SSH
    passphrase, and a push token that doubles as the registry token (one name, two keys)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    site = tmp_path / "site.toml"
    site.write_text(
        """
[tpu]
harbor_repo = "https://github.com/marin-community/harbor.git"
harbor_branch = "main"
consumer_repo = "https://github.com/open-thoughts/OpenThoughts-Agent.git"
consumer_branch = "main"
image = "ghcr.io/open-thoughts/openthoughts-agent"

[registry]
token_env = "PUSH_TOKEN"

[iris]
cluster = "c"
user = "u"
docker_user = "u"
docker_token_env = "PUSH_TOKEN"

[spark]
key_path = "/etc/lockstep/ssh/id_ed25519"
passphrase_env = "NODE_KEY_PASSPHRASE"

[[spark.nodes]]
name = "dgx1"
host = "dgx1.lab"
roles = ["build"]

[attest]
key_env = "SIGNING_KEY"
trusted_keys = ["keys/signing.pub"]

[[alerts.webhook]]
name = "ops"
url_env = "OPS_HOOK"

[[alerts.webhook]]
name = "oncall"
url_env = "ONCALL_HOOK"
""",
        encoding="utf-8",
    )
    return site


SMALL_SECRETS = ["PUSH_TOKEN", "NODE_KEY_PASSPHRASE", "SIGNING_KEY", "OPS_HOOK", "ONCALL_HOOK"]


def _k8s_keys(text: str) -> list[str]:
    [command] = [line for line in text.splitlines() if line.startswith("kubectl ")]
    return re.findall(r"--from-file=([A-Z_][A-Z0-9_]*)=", command)


def _dotenv_names(text: str) -> list[str]:
    return [
        line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("#")
    ]


@pytest.mark.parametrize(
    ("make", "secrets"),
    [
        (lambda tmp: EXAMPLE, EXAMPLE_SECRETS),
        (_small_site, SMALL_SECRETS),
    ],
    ids=["example", "attest-two-webhooks-passphrase"],
)
def test_every_secret_is_in_all_three_forms_and_no_value_is(
    make, secrets: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canaries = {name: f"canary-{name.lower()}-6f1c" for name in secrets}
    for name, value in canaries.items():  # set, so a form that read the environment would show them
        monkeypatch.setenv(name, value)
    site = make(tmp_path)
    outputs = {
        fmt: lockstep("deploy", "env", "--site", str(site), "--format", fmt)
        for fmt in ("compose", "dotenv", "k8s", "all")
    }
    outputs["json"] = lockstep("deploy", "env", "--site", str(site), "--json")
    for fmt, result in outputs.items():
        assert result.exit_code == 0, (fmt, result.output)
        assert not [v for v in canaries.values() if v in result.output], (
            f"--format {fmt} printed a secret value"
        )

    env_vars = yaml.safe_load(outputs["compose"].output)["env_vars"]
    assert env_vars == [*FIXED_RUN_ENV, *secrets]
    assert _dotenv_names(outputs["dotenv"].output) == secrets
    assert all(
        line.endswith("=")
        for line in outputs["dotenv"].output.splitlines()
        if not line.startswith("#")
    )
    assert _k8s_keys(outputs["k8s"].output) == secrets
    assert (
        "--from-literal" not in outputs["k8s"].output
        and "--from-env-file" not in outputs["k8s"].output
    )
    data = json.loads(outputs["json"].output)
    assert [s["name"] for s in data["secrets"]] == data["k8s_secret_keys"] == secrets
    assert data["env_vars"] == env_vars and data["k8s_secret"] == "lockstep-secrets"
    all_forms = outputs["all"].output
    assert outputs["compose"].output in all_forms and outputs["dotenv"].output in all_forms


def test_each_secret_says_which_site_keys_name_it(tmp_path: Path) -> None:
    text = dotenv_secrets(deploy_env(site_names_only(_small_site(tmp_path))))
    lines = text.splitlines()
    assert lines[0] == DOTENV_BEGIN and lines[-1] == DOTENV_END

    def comment_of(name: str) -> str:
        at = lines.index(f"{name}=")
        return next(line for line in reversed(lines[:at]) if line.startswith("# named by "))

    assert comment_of("PUSH_TOKEN") == "# named by [registry] token_env, [iris] docker_token_env"
    assert comment_of("NODE_KEY_PASSPHRASE") == "# named by [spark] passphrase_env"
    assert comment_of("SIGNING_KEY") == "# named by [attest] key_env"
    assert comment_of("OPS_HOOK") == "# named by [[alerts.webhook]] url_env (ops)"
    assert comment_of("ONCALL_HOOK") == "# named by [[alerts.webhook]] url_env (oncall)"
    # The signing key is a PEM: its line says how a .env carries its newlines.
    assert lines[lines.index("SIGNING_KEY=") - 1].startswith(
        "# a PEM: one line, each newline written as"
    )


def test_the_shipped_files_are_what_it_prints_for_the_example_site() -> None:
    env = deploy_env(site_names_only(EXAMPLE))
    hint = f"deploy/docker is out of date with deploy/site.example.toml: run `{REFRESH}`"
    instance = (DOCKER / "dagster.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(instance)["run_launcher"]["config"]["env_vars"] == env.env_vars, hint
    assert with_env_vars(instance, env) == instance, hint
    dotenv = (DOCKER / ".env.example").read_text(encoding="utf-8")
    assert dotenv_secrets(env) in dotenv and with_dotenv_secrets(dotenv, env) == dotenv, hint


def test_update_rewrites_only_the_two_blocks_and_never_dot_env(tmp_path: Path) -> None:
    for name in ("dagster.yaml", ".env.example"):
        (tmp_path / name).write_text((DOCKER / name).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / ".env").write_text("GHCR_TOKEN=kept\n", encoding="utf-8")
    before = {
        name: (tmp_path / name).read_text(encoding="utf-8")
        for name in ("dagster.yaml", ".env.example")
    }
    result = lockstep(
        "deploy",
        "env",
        "--site",
        str(_small_site(tmp_path / "site")),
        "--format",
        "compose",
        "--update",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    instance = (tmp_path / "dagster.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(instance)["run_launcher"]["config"]["env_vars"] == [
        *FIXED_RUN_ENV,
        *SMALL_SECRETS,
    ]
    # Outside the env_vars list, not a byte moved.
    strip = re.compile(r"^      - [A-Z_0-9]+\n", re.MULTILINE)
    assert strip.sub("", instance) == strip.sub("", before["dagster.yaml"])
    dotenv = (tmp_path / ".env.example").read_text(encoding="utf-8")
    head, tail = (
        before[".env.example"].split(DOTENV_BEGIN)[0],
        before[".env.example"].split(DOTENV_END)[1],
    )
    assert dotenv.startswith(head) and dotenv.endswith(tail)
    assert _dotenv_names(dotenv.split(DOTENV_BEGIN)[1].split(DOTENV_END)[0]) == SMALL_SECRETS
    assert (tmp_path / ".env").read_text(encoding="utf-8") == "GHCR_TOKEN=kept\n"


def test_a_broken_site_or_no_site_is_an_operational_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "site.toml"
    broken.write_text(
        _small_site(tmp_path)
        .read_text()
        .replace('token_env = "PUSH_TOKEN"', 'token_env = "ghp_x"', 1)
    )
    result = CliRunner().invoke(main, ["deploy", "env", "--site", str(broken)])
    assert (
        result.exit_code == 3
        and f"{broken}:" in result.output
        and "NAME of an environment variable" in result.output
    )
    monkeypatch.setenv("LOCKSTEP_SITE", str(tmp_path / "absent.toml"))
    result = CliRunner().invoke(main, ["deploy", "env"])
    assert (
        result.exit_code == 3
        and "absent.toml: no site file here (check LOCKSTEP_SITE)" in result.output
    )


def test_the_push_token_has_one_name_everywhere_and_the_k8s_header_lists_every_secret() -> None:
    env = deploy_env(site_names_only(EXAMPLE))
    values = (REPO / "deploy" / "k8s" / "values.yaml").read_text(encoding="utf-8")
    header = values.split("#   Secret    lockstep-secrets", 1)[1].split(
        "#   Secret    lockstep-ssh", 1
    )[0]
    assert [n for n in env.k8s_secret_keys if n not in header] == []
    # The kaniko push token: the example's [iris] docker_token_env,
    # under that name in every file that names it.
    [push] = [s.name for s in env.secrets if "[iris] docker_token_env" in s.keys]
    assert push == "IRIS_DOCKER_TOKEN"
    for path in (
        DOCKER / ".env.example",
        DOCKER / "dagster.yaml",
        REPO / "docs" / "operations.md",
        REPO / "docs" / "site.md",
    ):
        assert push in path.read_text(encoding="utf-8"), path
