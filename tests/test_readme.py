"""The README and docs/*.md: every command their ```bash blocks show is run here (or, where it needs
a cluster or a registry this machine does not have, listed with the reason), every relative link
points at a file and heading that exist, and every site example validates.

A command the docs show that no test here recognises fails
`test_every_command_the_docs_show_is_recognised`: a
new doc command needs a test. How each kind is tested:

- `lockstep ...`: run with click's CliRunner, in the
  order of `LOCKSTEP_SCENARIO`, against a sandbox in
  a temporary directory driven in-process into the state each command needs (a fix upstream, builds
  verified and promoted), placeholders such as `<harbor
  sha>` replaced by real values; exit codes asserted.
- `./dev X`: X is a subcommand of the `dev` script, and its help text says so.
- `. .venv/bin/activate`: the environment `./dev setup` makes, with the `lockstep` command in it.
- `export NAME=...`: lockstep reads NAME (its code
  does, or the site example names it in a `*_env` key).
- `openssl ...`: run; lockstep loads the key pair they
  make, and the public key verifies the private one.
- `pg_dump` / `pg_restore`: run against a real
  PostgreSQL holding a Dagster instance, and the restore
  brings back exactly the dumped promotion log.
- `python bench/X.py`: the bench exists and starts
  (`--help`); benches take minutes and are not part of
  the test run (docs/PERFORMANCE.md).
- `dagster definitions validate ...`: run on the sandbox's site.
- `cp SRC DST`: SRC exists and git ignores DST.
- `NOT_RUN`: the few deployment commands that need what does not exist here, each with the reason.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from lockstep.cli import main
from resources.site.schema import SiteConfig
from sandbox.teardown import stop_sandbox
from sandbox.world import Sandbox, up
from tests.conftest import sandbox_resources
from tests.support.runs import Pipeline, failure_message

# seconds, about (33-70 here): two sandbox builds, three lab revs, a Postgres
pytestmark = pytest.mark.heavy(60)

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
DEV = ROOT / "dev"

# The lockstep commands the docs show, in the order the scenario runs them, with the exit code each
# must give. The scenario brings the sandbox into the state a command needs just before it (see
# test_every_lockstep_command_the_docs_show_runs_against_a_sandbox).
LOCKSTEP_SCENARIO: dict[str, int] = {
    "lockstep site check": 0,
    "lockstep site schema > site.schema.json": 0,
    "lockstep deploy env --format dotenv": 0,
    "lockstep deploy env --format k8s": 0,
    "lockstep preflight": 0,
    "lockstep preflight --json": 0,
    "lockstep sandbox advance-harbor --fix": 0,
    "lockstep sandbox advance-harbor": 0,
    "lockstep rollback plan --must-contain <harbor sha>": 0,
    "lockstep rollback plan --build <build>": 0,
    "lockstep image probes sandbox.local/open-thoughts/openthoughts-agent:tpu": 0,
    "lockstep changelog <current build> <target build> --must-contain <harbor sha>": 0,
    "lockstep reject <build> --reason OOMs on v5e-8 --by ops@lab": 0,
    "lockstep release <build> --by ops@lab": 0,
    "lockstep pools --iris-builds 4": 0,
    "lockstep pools --apply --iris-builds 4": 0,
    "lockstep sandbox advance-harbor --no-version-bump": 0,
    "lockstep sandbox iris-fault fail": 0,
    "lockstep sandbox iris-contract 2026-06": 0,
    "lockstep sandbox new-lab-rev r28": 0,
    "lockstep sandbox new-lab-rev r29 --half-cut": 0,
    "lockstep sandbox new-lab-rev r39 --hold lmcache": 0,
}

# Shown, not run here: each needs what this machine does not have. The lines as the docs show them.
_DOCKER = (
    "needs the team's host and its site; tests/deploy/test_compose_live.py runs these on a real "
    "engine, "
    "tests/deploy/test_docker.py checks deploy/docker against Dagster's schemas"
)
_CLUSTER = (
    "needs a Kubernetes cluster and the ghcr registry; tests/deploy/test_k8s.py checks the Helm "
    "values "
    "and the Job a run gets, offline"
)
_SERVES = (
    "serves until stopped: `lockstep demo` runs this same `dagster dev` (lockstep/cli.py), and "
    "tests/ui/test_browser.py runs `lockstep demo`"
)
_WEBSERVER = (
    "launches through a running webserver's GraphQL: tests/ui/test_browser.py runs these "
    "against `lockstep demo` on a sandbox"
)
_COMPOSE = "docker compose -p lockstep -f deploy/docker/docker-compose.yml"
NOT_RUN: dict[str, str] = {
    f"{_COMPOSE} up -d --build": _DOCKER,
    f"{_COMPOSE} exec tpu lockstep pools --apply --iris-builds 4": _DOCKER,
    f"{_COMPOSE} restart tpu jovian": _DOCKER,
    "lockstep deploy env --site /etc/lockstep/site/site.toml --update deploy/docker": _DOCKER,
    (
        f"{_COMPOSE} exec -T postgres pg_dump --format=custom --username=lockstep lockstep > "
        "lockstep.dump"
    ): _DOCKER,
    f"{_COMPOSE} stop daemon webserver tpu jovian": _DOCKER,
    f"{_COMPOSE} exec -T postgres pg_restore --clean --if-exists --no-owner --username=lockstep "
    "--dbname=lockstep "
    "< lockstep.dump": _DOCKER,
    f"{_COMPOSE} start tpu jovian webserver daemon": _DOCKER,
    (
        "docker build -f deploy/Dockerfile -t ghcr.io/open-thoughts/lockstep:$(git rev-parse "
        "--short HEAD) ."
    ): _DOCKER,
    "docker push ghcr.io/open-thoughts/lockstep:$(git rev-parse --short HEAD)": _CLUSTER,
    "kubectl create namespace lockstep": _CLUSTER,
    "kubectl -n lockstep create secret generic lockstep-ssh --from-file=id_ed25519 "
    "--from-file=git_ed25519 "
    "--from-file=known_hosts": _CLUSTER,
    (
        "kubectl -n lockstep create secret generic lockstep-postgresql "
        "--from-literal=postgresql-password=$PG_PASSWORD"
    ): _CLUSTER,
    (
        "kubectl -n lockstep create configmap lockstep-site --from-file=site.toml "
        "--from-file=lockstep-attest.pub"
    ): _CLUSTER,
    (
        "kubectl -n lockstep create secret generic lockstep-kube "
        "--from-file=config=iris-cluster.kubeconfig"
    ): _CLUSTER,
    "kubectl -n lockstep apply -f lockstep-shared.yaml": _CLUSTER,
    "helm repo add dagster https://dagster-io.github.io/helm": _CLUSTER,
    (
        "helm upgrade --install dagster dagster/dagster --version 1.13.27 -n lockstep -f "
        "deploy/k8s/values.yaml"
    ): _CLUSTER,
    "lockstep pools --iris-builds 4 | while read -r cmd; do kubectl -n lockstep exec "
    "deploy/dagster-daemon -- $cmd; "
    "done": _CLUSTER,
    "kubectl -n lockstep create configmap lockstep-site --from-file=site.toml "
    "--from-file=lockstep-attest.pub "
    "--dry-run=client -o yaml | kubectl -n lockstep apply -f -": _CLUSTER,
    (
        "kubectl -n lockstep rollout restart deployment -l "
        "component=user-deployments,deployment in (tpu,jovian)"
    ): _CLUSTER,
    "dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000": _SERVES,
    "lockstep promote --plan": _WEBSERVER,
    "lockstep promote --note ship the fix --by ops@lab": _WEBSERVER,
    "lockstep rollback --plan": _WEBSERVER,
    "lockstep rollback --must-contain <harbor sha> --note bad harbor --by ops@lab": _WEBSERVER,
    "lockstep hold release tag --by ops@lab": _WEBSERVER,
}

# Variables the docs export, and where lockstep (or Dagster) reads each.
ENV_READERS = {
    "LOCKSTEP_SITE": ROOT / "resources" / "site" / "load.py",
    "LOCKSTEP_CACHE": ROOT / "resources" / "git.py",
    "DAGSTER_HOME": ROOT / "lockstep" / "cli.py",
}


# ---- what the docs show --------------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """One command of a ```bash block: `text` as shown (continuations joined), `key` its words."""

    doc: Path
    line: int
    text: str

    @property
    def key(self) -> str:
        """The command's words, space-separated, without its comment: what the lists above hold."""
        return " ".join(shlex.split(self.text, comments=True))

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"


def fenced_blocks(doc: Path, language: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, lines) of each ```language block (`language` is the whole info string:
    "toml" is a site snippet, "toml pyproject.toml" a consumer's pyproject)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start, body = i + 2, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            yield start, body
        i += 1


def shown_commands(doc: Path) -> list[Shown]:
    out: list[Shown] = []
    for start, body in fenced_blocks(doc, "bash"):
        pending, first = "", 0
        for n, line in enumerate(body, start):
            if not pending:
                first = n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            text = (pending + line).strip()
            pending = ""
            if text and shlex.split(text, comments=True):
                out.append(Shown(doc, first, text))
    return out


ALL_SHOWN = [s for doc in DOCS for s in shown_commands(doc)]


def placeholders(key: str) -> list[str]:
    return re.findall(r"<[^<>]+>", key)


# ---- recognising every command -------------------------------------------------------------------


def dev_subcommands() -> set[str]:
    """The arms of the `case "$cmd" in` of ./dev (not `*`)."""
    script = DEV.read_text(encoding="utf-8")
    case = script[script.index('case "$cmd" in') : script.index("esac")]
    return set(re.findall(r"^\s+([a-z][a-z-]*)\)", case, re.MULTILINE))


def dev_help() -> str:
    return "\n".join(DEV.read_text(encoding="utf-8").splitlines()[1:6])


def leading_assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """`A=1 B=2 cmd args` -> ({A: 1, B: 2}, [cmd, args])."""
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words[0].partition("=")
        env[name] = value
        words = words[1:]
    return env, words


SITE_EXAMPLE = ROOT / "deploy" / "site.example.toml"


def site_example_env_names() -> set[str]:
    text = SITE_EXAMPLE.read_text(encoding="utf-8")
    return set(re.findall(r'^\w+_env\s*=\s*"([^"]+)"', text, re.MULTILINE))


def kind_of(shown: Shown) -> str | None:
    """How `shown` is tested, or None when nothing here tests it."""
    key = shown.key
    if key in NOT_RUN:
        return "not run: " + NOT_RUN[key]
    _, words = leading_assignments(shown.words)
    if not words:
        return None
    program = words[0]
    if program == "lockstep":
        return "lockstep scenario" if key in LOCKSTEP_SCENARIO else None
    if program == "./dev":
        return "dev subcommand" if len(words) > 1 and words[1] in dev_subcommands() else None
    if words in (["."], [".", ".venv/bin/activate"], ["source", ".venv/bin/activate"]):
        return "venv"
    if program == "export":
        return "env var" if len(words) == 2 and "=" in words[1] else None
    if program == "openssl":
        return "signing keys"
    if program in ("pg_dump", "pg_restore"):
        return "backup"
    if program == "python" and len(words) >= 2 and re.fullmatch(r"bench/\w+\.py", words[1]):
        return "bench"
    if words[:3] == ["dagster", "definitions", "validate"]:
        return "dagster validate"
    if program == "cp" and len(words) == 3:
        return "cp"
    return None


def test_the_docs_show_commands_and_read_them_as_the_shell_would() -> None:
    assert len(ALL_SHOWN) > 30  # the parser found the blocks
    joined = [s for s in ALL_SHOWN if s.key.startswith("PGPASSWORD=")]
    assert joined and all("--host=" in s.key for s in joined)


def test_every_command_the_docs_show_is_recognised() -> None:
    unknown = [str(s) for s in ALL_SHOWN if kind_of(s) is None]
    assert not unknown, (
        "commands the docs show that no test in tests/test_readme.py runs or checks (add them "
        "to LOCKSTEP_SCENARIO, NOT_RUN or a recognised kind):\n" + "\n".join(unknown)
    )


def test_every_listed_command_is_still_shown() -> None:
    keys = {s.key for s in ALL_SHOWN}
    stale = [k for k in [*LOCKSTEP_SCENARIO, *NOT_RUN] if k not in keys]
    assert not stale, "listed in tests/test_readme.py but shown nowhere in the docs:\n" + "\n".join(
        stale
    )


def test_no_command_is_shown_through_a_private_uv() -> None:
    for s in ALL_SHOWN:
        assert ".tools/" not in s.text and not s.key.startswith("uv "), (
            f"{s}: show the command itself (`lockstep ...`)"
        )


def test_dev_commands_are_subcommands_of_the_dev_script() -> None:
    shown = [s for s in ALL_SHOWN if kind_of(s) == "dev subcommand"]
    assert {leading_assignments(s.words)[1][1] for s in shown} >= {"demo", "test"}
    help_text = dev_help()
    for s in shown:
        env, words = leading_assignments(s.words)
        assert f"./dev {words[1]}" in help_text, (
            f"{s}: ./dev's help text does not mention `./dev {words[1]}`"
        )
        for name in env:  # a variable set for the run must be one the tests read
            readers = subprocess.run(
                ["git", "grep", "-l", f'"{name}"', "--", "tests"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()
            assert readers, f"{s}: nothing under tests/ reads {name}"


def test_the_venv_the_docs_activate_has_the_lockstep_command() -> None:
    assert any(kind_of(s) == "venv" for s in ALL_SHOWN)
    assert (ROOT / ".venv" / "bin" / "activate").is_file(), "./dev setup makes .venv"
    assert (ROOT / ".venv" / "bin" / "lockstep").is_file()


def test_every_variable_the_docs_export_is_read_by_lockstep() -> None:
    exported = [s for s in ALL_SHOWN if kind_of(s) == "env var"]
    assert exported
    from_site = site_example_env_names()
    for s in exported:
        name = s.words[1].split("=", 1)[0]
        if name in from_site:
            continue
        assert name in ENV_READERS, f"{s}: lockstep does not read {name}"
        assert f'"{name}"' in ENV_READERS[name].read_text(encoding="utf-8"), (
            f"{ENV_READERS[name]} no longer reads {name}"
        )


def test_cp_commands_copy_a_file_that_exists_to_a_path_git_ignores() -> None:
    shown = [s for s in ALL_SHOWN if kind_of(s) == "cp"]
    assert {s.words[1] for s in shown} >= {"deploy/site.example.toml", "deploy/docker/.env.example"}
    for s in shown:
        _, src, dst = s.words
        assert (ROOT / src).is_file(), f"{s}: no {src}"
        if Path(dst).is_absolute():
            # out of the checkout (the site file goes to
            # /etc/lockstep): nothing to commit by mistake
            continue
        ignored = subprocess.run(["git", "check-ignore", "-q", dst], cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"{s}: git does not ignore {dst}, and it holds secrets"


# ---- links and site examples ---------------------------------------------------------------------


def slugs(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of `doc`."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_points_at_a_file_and_heading_that_exist() -> None:
    broken = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in slugs(file):
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def merged(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    """`extra` over `base`: tables merge, everything else (arrays of tables too) is replaced."""
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        out[key] = (
            merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
        )
    return out


def test_the_site_snippets_in_the_docs_validate_in_the_example_site_file() -> None:
    """The one full example is deploy/site.example.toml
    (tests/resources/test_site_example.py loads it); each
    ```toml snippet of the docs, merged into it, still makes a valid site."""
    example = tomllib.loads(SITE_EXAMPLE.read_text(encoding="utf-8"))
    SiteConfig.model_validate(example)
    blocks = [
        (doc, n, tomllib.loads("\n".join(body)))
        for doc in DOCS
        for n, body in fenced_blocks(doc, "toml")
    ]
    assert blocks, "the docs show site snippets (the relay's, at least)"
    for doc, n, data in blocks:
        assert not ("site" in data and "tpu" in data), (
            f"{doc.relative_to(ROOT)}:{n}: a second full site example: "
            "link deploy/site.example.toml instead"
        )
        try:
            SiteConfig.model_validate(merged(example, data))
        except ValueError as exc:
            pytest.fail(
                f"{doc.relative_to(ROOT)}:{n}: this snippet, merged into the site example, is "
                f"refused: {exc}"
            )


def test_the_consumer_pyproject_the_docs_show_is_one_lockstep_follows() -> None:
    """The docs' consumer pyproject declares harbor as
    the example site's repo and branch, in a shape the
    re-lock reads (tpu_assets/harbor_declaration.py)."""
    from tpu_assets.harbor_declaration import read_declaration

    site = SiteConfig.model_validate(tomllib.loads(SITE_EXAMPLE.read_text(encoding="utf-8")))
    shown = [
        ("\n".join(body), doc, n)
        for doc in DOCS
        for n, body in fenced_blocks(doc, "toml pyproject.toml")
    ]
    assert shown, "docs/site.md shows the consumer's pyproject"
    for text, doc, n in shown:
        declared = read_declaration(text, site.tpu.harbor_package)
        where = f"{doc.relative_to(ROOT)}:{n}"
        assert (declared.shape, declared.ref) == ("direct_reference", site.tpu.harbor_branch), where
        assert declared.url == site.tpu.harbor_repo, where


# ---- commands run --------------------------------------------------------------------------------


def shown_of(kind: str) -> list[Shown]:
    return [s for s in ALL_SHOWN if kind_of(s) == kind]


def test_the_signing_key_commands_make_a_key_pair_lockstep_accepts(tmp_path: Path) -> None:
    from resources.attest import load_public_key, load_signing_key

    block = next(
        body
        for doc in DOCS
        for _, body in fenced_blocks(doc, "bash")
        if any("openssl" in b for b in body)
    )
    assert shown_of("signing keys"), "the docs show how to make a signing key"
    script = "set -euo pipefail\n" + "\n".join(block) + '\nprintf %s "$LOCKSTEP_ATTEST_KEY"\n'
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    key = load_signing_key(done.stdout, env="LOCKSTEP_ATTEST_KEY")
    trusted = load_public_key(
        (tmp_path / "lockstep-attest.pub").read_bytes(), source="lockstep-attest.pub"
    )
    assert key.public.keyid == trusted.keyid
    assert trusted.verifies(key.sign(b"payload"), b"payload")


def test_every_bench_the_docs_show_exists_and_starts() -> None:
    shown = shown_of("bench")
    assert {s.words[1] for s in shown} == {
        f"bench/{p.name}" for p in (ROOT / "bench").glob("*_bench.py")
    }, "every bench's command is shown, and only benches that exist"
    for s in shown:
        done = subprocess.run(
            [sys.executable, s.words[1], "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0 and "usage:" in done.stdout, f"{s}: {done.stderr[-2000:]}"


def test_the_backup_commands_restore_the_promotion_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.deploy.instance import write_production_home
    from tests.support.postgres_server import running_postgres
    from tpu_assets.history import FLOATING_TAG

    dump, restore = shown_of("backup")
    assert dump.words[1] == "pg_dump" and restore.words[1] == "pg_restore"
    home = tmp_path / "dagster_home"

    def moves() -> list[str]:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            records = instance.fetch_materializations(
                FLOATING_TAG, limit=10, ascending=True
            ).records
            return [str(r.asset_materialization.metadata["to_digest"].value) for r in records]  # type: ignore[union-attr]

    def move(digest: str) -> None:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(FLOATING_TAG, metadata={"to_digest": digest})
            )

    with running_postgres() as server:
        env = write_production_home(home, server.fresh_database("backup"))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        move("sha256:" + "1" * 64)
        ran = subprocess.run(
            ["bash", "-c", dump.text],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0 and (tmp_path / "lockstep.dump").stat().st_size > 0, ran.stderr
        move("sha256:" + "2" * 64)  # after the backup: the restore takes it away
        assert len(moves()) == 2
        ran = subprocess.run(
            ["bash", "-c", restore.text],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert moves() == ["sha256:" + "1" * 64]


def test_every_lockstep_command_the_docs_show_runs_against_a_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's demo order: the fix upstream, built
    and promoted; a later commit, built and promoted;
    then the plans, the image, the changelog, a rejection,
    the pools; last the commands that break things."""
    shown = {s.key: s for s in shown_of("lockstep scenario")}
    known = {"<harbor sha>", "<build>", "<current build>", "<target build>"}
    assert {p for k in shown for p in placeholders(k)} <= known
    # `.sandbox` and `.sandbox/site.toml`, the commands' defaults, are here
    monkeypatch.chdir(tmp_path)
    sb: Sandbox = up(tmp_path / ".sandbox")
    home = sb.root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    for name, value in {
        "LOCKSTEP_SITE": sb.site_file,
        "DAGSTER_HOME": home,
        "LOCKSTEP_CACHE": sb.root / "cache",
    }.items():
        monkeypatch.setenv(name, str(value))
    values: dict[str, str] = {}
    ran: list[str] = []

    def run(key: str) -> str:
        assert key in shown, f"the scenario runs {key!r}, which the docs do not show"
        text = shown[key].text  # as shown: quoting and all
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        assert not placeholders(text), f"{key}: no value for {placeholders(text)}"
        words = shlex.split(text, comments=True)[1:]
        into = None
        # `lockstep ... > FILE`: the output goes to FILE, as the shell would put it
        if ">" in words:
            words, into = words[: words.index(">")], words[words.index(">") + 1 :]
            assert len(into) == 1, f"{text}: one file after >"
        result = CliRunner().invoke(main, words)
        assert result.exit_code == LOCKSTEP_SCENARIO[key], (
            f"{text}: exit {result.exit_code}\n{result.output}"
        )
        if into:
            (tmp_path / into[0]).write_text(result.output, encoding="utf-8")
        ran.append(key)
        return result.output

    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            p = Pipeline(sb, sandbox_resources(sb, sb.root / "cache"), instance)

            def relock_build_promote() -> str:  # what the demo's sensors and a person do in the UI
                commit = p.relock()
                built = p.build(commit)
                assert built.success, failure_message(built)
                promoted = p.tag("promote")
                assert promoted.success, failure_message(promoted)
                return commit

            # Day one on the sandbox's site: it checks clean and passes preflight.
            assert run("lockstep site check").strip().endswith("valid site file")
            run("lockstep site schema > site.schema.json")
            schema = json.loads((tmp_path / "site.schema.json").read_text(encoding="utf-8"))
            assert {"tpu", "iris", "spark", "jovian"} <= set(schema["properties"])
            # The sandbox site's secrets, by name, in the
            # .env block and the Secret's keys; no value.
            secrets = SiteConfig.model_validate(
                tomllib.loads(sb.site_file.read_text())
            ).secret_env_names()
            dotenv, k8s = (
                run("lockstep deploy env --format dotenv"),
                run("lockstep deploy env --format k8s"),
            )
            assert secrets and all(
                f"\n{n}=\n" in dotenv and f"--from-file={n}=" in k8s for n in secrets
            )
            assert "0 failed" in run("lockstep preflight")
            report = json.loads(run("lockstep preflight --json"))
            assert report["exit_code"] == 0 and report["counts"]["fail"] == 0, report["counts"]
            values["<harbor sha>"] = run("lockstep sandbox advance-harbor --fix").strip()[:12]
            first = relock_build_promote()
            run("lockstep sandbox advance-harbor")
            second = relock_build_promote()
            values |= {
                "<build>": first[:12],
                "<target build>": first[:12],
                "<current build>": second[:12],
            }
            plan = run("lockstep rollback plan --must-contain <harbor sha>")
            assert re.search(rf"build {first[:8]}.*TARGET", plan), plan
            run("lockstep rollback plan --build <build>")
            assert "HOLDS: " in run(
                "lockstep image probes sandbox.local/open-thoughts/openthoughts-agent:tpu"
            )
            run("lockstep changelog <current build> <target build> --must-contain <harbor sha>")
            assert "rejected by ops@lab" in run(
                "lockstep reject <build> --reason OOMs on v5e-8 --by ops@lab"
            )
            assert "released by ops@lab" in run("lockstep release <build> --by ops@lab")
            printed = run("lockstep pools --iris-builds 4").splitlines()
            assert printed[:2] == [
                "dagster instance concurrency set tag_moves 1",
                "dagster instance concurrency set iris_builds 4",
            ], printed
            run("lockstep pools --apply --iris-builds 4")
            run("lockstep sandbox advance-harbor --no-version-bump")
            run("lockstep sandbox iris-fault fail")
            run("lockstep sandbox iris-contract 2026-06")
            run("lockstep sandbox new-lab-rev r28")
            run("lockstep sandbox new-lab-rev r29 --half-cut")
            run("lockstep sandbox new-lab-rev r39 --hold lmcache")
    finally:
        stop_sandbox(sb.root)  # iris jobs, engines, the git daemon: by PID
    assert ran == list(LOCKSTEP_SCENARIO), "the scenario runs every listed command, in order"

    # Both code locations load with the site the commands
    # left behind, as `dagster definitions validate` says.
    for s in shown_of("dagster validate"):
        words = [str(Path(sys.executable).parent / "dagster"), *s.words[1:]]
        done = subprocess.run(
            words, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, f"{s}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
