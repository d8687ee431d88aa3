"""The environment a deployment must give lockstep,
for one site file: one source for every secret's name.

The site file names each secret's environment variable (its `*_env` keys,
`SiteConfig.secret_env_keys`). Three places must list exactly those names, and drift between them
fails at run time, not at install: the compose run launcher's `env_vars` (a name it does not forward
is unset in the run container), the `.env` template the operator fills in, and the keys of the
Kubernetes Secret `lockstep-secrets`. This module makes all three from the site, as text; `lockstep
deploy env` prints them, and the files shipped in deploy/docker are what it prints for
deploy/site.example.toml (tests/deploy/test_deploy_env.py).

Names only, always: nothing here reads the environment, so no secret value can reach what it prints.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from resources.atomic import write_atomic
from resources.errors import LockstepError
from resources.model import Model
from resources.site.schema import SiteConfig

# What every run needs besides the site's secrets, in the order deploy/docker/dagster.yaml lists
# them: the instance's Postgres (dagster.yaml `storage:` reads these), where the site and the git
# mirrors are, how git reaches its remotes, which deployment this is (the "site changed" advice,
# resources/site/reload.py), and the iris cluster's credentials.
FIXED_RUN_ENV: tuple[str, ...] = (
    "DAGSTER_POSTGRES_USER",
    "DAGSTER_POSTGRES_PASSWORD",
    "DAGSTER_POSTGRES_HOST",
    "DAGSTER_POSTGRES_DB",
    "DAGSTER_POSTGRES_PORT",
    "LOCKSTEP_SITE",
    "LOCKSTEP_CACHE",
    "GIT_SSH_COMMAND",
    "LOCKSTEP_DEPLOYMENT",
    "KUBECONFIG",
)
# deploy/k8s/values.yaml: envSecrets of the code servers and run pods
K8S_SECRET = "lockstep-secrets"
K8S_NAMESPACE = "lockstep"  # docs/operations.md installs into it
# where the k8s form expects one file per key, beside the operator's shell
SECRET_DIR = "lockstep-secrets"
# The dotenv block is delimited so a refresh replaces
# exactly it and leaves the rest of the file alone.
DOTENV_BEGIN = "# BEGIN secrets the site names"
DOTENV_END = "# END secrets the site names"
REFRESH = "lockstep deploy env --site deploy/site.example.toml --update deploy/docker"
# Site keys whose variable holds a PEM, many lines: a plain NAME=value line carries no newline.
PEM_KEYS = frozenset({"[attest] key_env"})

Format = Literal["compose", "dotenv", "k8s", "all"]
FORMATS: tuple[Format, ...] = ("compose", "dotenv", "k8s", "all")


class SiteSecret(Model):
    """One environment variable the site names as a secret, and every site key that names it."""

    name: str
    keys: list[str]
    pem: bool = False  # a multi-line PEM: a .env line must escape its newlines


class DeployEnv(Model):
    """What `lockstep deploy env --json` prints: names, never values."""

    site: str
    secrets: list[SiteSecret]
    env_vars: list[str]
    k8s_secret: str
    k8s_secret_keys: list[str]


def site_secrets(site: SiteConfig) -> list[SiteSecret]:
    """The site's secrets, each name once (two keys may
    share a token), in the order the site names them."""
    by_name: dict[str, list[str]] = {}
    for key, name in site.secret_env_keys():
        by_name.setdefault(name, []).append(key)
    return [
        SiteSecret(name=name, keys=keys, pem=bool(PEM_KEYS & set(keys)))
        for name, keys in by_name.items()
    ]


def deploy_env(site: SiteConfig) -> DeployEnv:
    secrets = site_secrets(site)
    names = [s.name for s in secrets]
    return DeployEnv(
        site=str(site.path),
        secrets=secrets,
        env_vars=list(dict.fromkeys([*FIXED_RUN_ENV, *names])),
        k8s_secret=K8S_SECRET,
        k8s_secret_keys=names,
    )


def compose_env_vars(env: DeployEnv, indent: str = "") -> str:
    """The run launcher's `env_vars:` block of deploy/docker/dagster.yaml, at `indent`."""
    return "".join([f"{indent}env_vars:\n", *(f"{indent}  - {name}\n" for name in env.env_vars)])


def dotenv_secrets(env: DeployEnv) -> str:
    """The secrets block of the `.env` template: each
    name with an empty value, under the keys naming it."""
    lines = [
        DOTENV_BEGIN,
        (
            "# Every name below is one the site file names: the run launcher forwards each one "
            "(dagster.yaml"
        ),
        "# env_vars), so each must be set. Values go in your copy, never in a committed file.",
    ]
    for secret in env.secrets:
        lines.append(f"# named by {', '.join(secret.keys)}")
        # compose v2 expands \n in a double-quoted value;
        # a bare PEM line would end at its first newline
        if secret.pem:
            lines.append(
                "# a PEM: one line, each newline written as \\n (-----BEGIN ... "
                "KEY-----\\nMIG...); lockstep reads that form"
            )
        lines.append(f"{secret.name}=")
    if not env.secrets:
        lines.append("# (this site names no secret)")
    return "\n".join([*lines, DOTENV_END]) + "\n"


def k8s_secret(env: DeployEnv) -> str:
    """The keys of the Secret both code servers and every run pod read, and how to create it.

    One file per key, not `--from-literal=NAME=value` (a literal sits in the shell's history and in
    the command line any user of the host can read in /proc while kubectl runs) and not
    `--from-env-file` (a PEM's newlines end its value there,
    and kubectl refuses to mix it with `--from-file`).
    """
    width = max((len(s.name) for s in env.secrets), default=0)
    lines = [
        (
            f"# Secret {env.k8s_secret}: one key per secret the site names "
            "(deploy/k8s/values.yaml envSecrets)."
        )
    ]
    lines += [f"#   {s.name.ljust(width)}  {', '.join(s.keys)}" for s in env.secrets]
    if not env.secrets:
        lines.append("#   (this site names no secret)")
        return "\n".join(lines) + "\n"
    lines += [
        (
            f"# Each value alone in {SECRET_DIR}/NAME (printf '%s' ...: a trailing newline "
            "would be part of it);"
        ),
        "# never commit that directory. Then:",
        f"kubectl -n {K8S_NAMESPACE} create secret generic {env.k8s_secret} "
        + " ".join(f"--from-file={s.name}={SECRET_DIR}/{s.name}" for s in env.secrets),
    ]
    return "\n".join(lines) + "\n"


def render(env: DeployEnv, fmt: Format) -> str:
    """One form, or all three under headers."""
    forms = {"compose": compose_env_vars, "dotenv": dotenv_secrets, "k8s": k8s_secret}
    if fmt != "all":
        return forms[fmt](env)
    titles = {
        "compose": "# deploy/docker/dagster.yaml, run_launcher.config:",
        "dotenv": "# deploy/docker/.env (and lockstep.env for Kubernetes):",
        "k8s": "# Kubernetes:",
    }
    return "\n".join(f"{titles[name]}\n{make(env)}" for name, make in forms.items())


_ENV_VARS_BLOCK = re.compile(
    r"^(?P<indent>[ ]*)env_vars:[ ]*\n(?:(?P=indent)[ ]+- .*\n)+", re.MULTILINE
)


def with_env_vars(dagster_yaml: str, env: DeployEnv) -> str:
    """dagster.yaml's text with its one `env_vars:` list replaced, every other byte as it was."""
    blocks = list(_ENV_VARS_BLOCK.finditer(dagster_yaml))
    if len(blocks) != 1:
        raise LockstepError(
            f"expected one `env_vars:` list in the instance config, found {len(blocks)}"
        )
    block = blocks[0]
    return (
        dagster_yaml[: block.start()]
        + compose_env_vars(env, block["indent"])
        + dagster_yaml[block.end() :]
    )


def with_dotenv_secrets(dotenv: str, env: DeployEnv) -> str:
    """A `.env` template's text with its secrets block replaced, every other line as it was."""
    start, end = dotenv.find(DOTENV_BEGIN), dotenv.find(DOTENV_END)
    if start < 0 or end < start:
        raise LockstepError(
            f"no secrets block in the .env template: add the lines {DOTENV_BEGIN!r} and "
            f"{DOTENV_END!r}"
        )
    end = dotenv.index("\n", end) + 1 if "\n" in dotenv[end:] else len(dotenv)
    return dotenv[:start] + dotenv_secrets(env) + dotenv[end:]


def update_docker_dir(env: DeployEnv, directory: Path) -> list[Path]:
    """Rewrite `directory`'s dagster.yaml env_vars and
    .env.example secrets for `env`; the files changed.

    Only the template, never `.env`: that one holds the values, and a rewrite would drop them.
    """
    changed = []
    for name, rewrite in (("dagster.yaml", with_env_vars), (".env.example", with_dotenv_secrets)):
        path = directory / name
        old = path.read_text(encoding="utf-8")
        new = rewrite(old, env)
        if new != old:
            write_atomic(path, new)
            changed.append(path)
    return changed
