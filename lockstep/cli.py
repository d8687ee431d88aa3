"""The `lockstep` command: the sandbox, the demo,
and (later) image and rollback tools for people."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lockstep.act_cmd import COMMANDS as ACT_COMMANDS
from lockstep.act_cmd import CONTROL, check_sha
from lockstep.deploy_cmd import deploy
from lockstep.exits import EXIT_CODES_HELP, NegativeAnswer, OperationalError
from lockstep.preflight.command import preflight
from lockstep.site_cmd import site as site_group
from lockstep.status_cmd import status
from resources.errors import LockstepError, Refused

if TYPE_CHECKING:  # the sandbox is imported by the commands that use it, not at CLI start
    from sandbox.layout import Sandbox


@click.group(epilog=EXIT_CODES_HELP)
@click.version_option(package_name="lockstep", prog_name="lockstep", message="%(prog)s %(version)s")
def main() -> None:
    """lockstep: re-lock, build, verify, promote and roll back container images with Dagster."""


@main.group()
def sandbox() -> None:
    """The embedded sandbox: real local upstream repos that stand in for harbor and the consumer."""


_dir = click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".sandbox"),
    show_default=True,
    help="Where the sandbox lives.",
)


@sandbox.command("up")
@_dir
@click.option(
    "--registry",
    default=None,
    metavar="HOST:PORT",
    help="Use this running registry server instead of an image-layout directory (first run only).",
)
@click.option(
    "--consumer-shape",
    type=click.Choice(["direct_reference", "uv_source"]),
    default="direct_reference",
    show_default=True,
    help="How the consumer's pyproject declares harbor: a PEP 508 direct reference following the "
    "branch "
    "(as OpenThoughts-Agent does), or [tool.uv.sources] with branch = (first run only).",
)
def sandbox_up(root: Path, registry: str | None, consumer_shape: str) -> None:
    """Create the sandbox (idempotent) and print its site file."""
    from sandbox.world import up

    _require_engines()
    sb = _guard(lambda: up(root, registry=registry, consumer_shape=consumer_shape))  # type: ignore[arg-type]
    pids = _start_engines(sb)
    click.echo(f"sandbox ready: {sb.site_file}")
    click.echo(f"  harbor   {sb.url(sb.harbor)}")
    click.echo(f"  consumer {sb.url(sb.consumer)}")
    click.echo(
        f"  engines  {len(pids)} dockerd (pids {', '.join(map(str, pids))}); stop them: lockstep "
        "sandbox down"
    )


@sandbox.command("down")
@_dir
def sandbox_down(root: Path) -> None:
    """Stop everything the sandbox runs (iris jobs,
    containers, its Docker engines, its git daemon) by the
    PIDs it recorded; keeps its files. Idempotent."""
    from sandbox.teardown import stop_sandbox

    stopped = _guard(lambda: stop_sandbox(root))
    for line in stopped:
        click.echo(f"stopped {line}")
    click.echo(
        f"sandbox {root}: nothing runs"
        if not stopped
        else f"sandbox {root}: stopped {len(stopped)}"
    )


def _require_engines() -> None:
    """Before anything is made: the sandbox's nodes run real Docker engines (Debian's docker.io)."""
    from sandbox.engines import EngineError, require_docker_io

    try:
        require_docker_io()
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None


def _start_engines(sb: Sandbox) -> list[int]:
    from sandbox.engines import EngineError
    from sandbox.spark_nodes import start_engines

    try:
        return start_engines(sb)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None


@sandbox.command("advance-harbor")
@_dir
@click.option("--fix", is_flag=True, help="Make this the commit that fixes the config-drift guard.")
@click.option(
    "--no-version-bump", is_flag=True, help="Keep harbor's version (the stale-wheel trap)."
)
def sandbox_advance_harbor(root: Path, fix: bool, no_version_bump: bool) -> None:
    """Push one new harbor commit upstream and print its sha."""
    from sandbox.world import advance_harbor

    click.echo(_guard(lambda: advance_harbor(root, fix=fix, version_bump=not no_version_bump)))


@sandbox.command("new-lab-rev")
@_dir
@click.argument("name")
@click.option(
    "--half-cut",
    is_flag=True,
    help=(
        "Pin only the new vLLM commit; keep b12x/LMCache at the previous rev's (hours older) pins."
    ),
)
@click.option(
    "--move-dep",
    is_flag=True,
    help=(
        "The new vLLM tree also moves cmake pins (FlashMLA, CUTLASS_REVISION): the dep table "
        "goes stale."
    ),
)
@click.option(
    "--break-import",
    is_flag=True,
    help=(
        "The new vLLM commit drops vllm/_flashkda_C: the image builds, its flashkda boot gate "
        "fails."
    ),
)
@click.option(
    "--hold",
    multiple=True,
    type=click.Choice(["vllm", "b12x", "lmcache"]),
    help=(
        "Hold this fork on purpose (repeatable): no new commits on it, the lock keeps the "
        "previous pin (r39's LMCache)."
    ),
)
@click.option(
    "--broken-model",
    is_flag=True,
    help=(
        "The new vLLM commit serves a model that never calls a tool: it benches under the baseline."
    ),
)
def sandbox_new_lab_rev(
    root: Path,
    name: str,
    half_cut: bool,
    move_dep: bool,
    break_import: bool,
    hold: tuple[str, ...],
    broken_model: bool,
) -> None:
    """Cut rev NAME across the sandbox forks and publish
    its source lock; print the lab commit and lock path."""
    from sandbox.jovian_world import new_lab_rev
    from sandbox.world import up

    # new_lab_rev cuts in an existing sandbox; this command brings one up first
    _guard(lambda: up(root))
    rev = _guard(
        lambda: new_lab_rev(
            root,
            name,
            half_cut=half_cut,
            move_dep=move_dep,
            break_import=break_import,
            hold=hold,
            broken_model=broken_model,
        )
    )
    click.echo(rev.lab_commit)
    click.echo(rev.lock_path)


@sandbox.command("iris-fault")
@_dir
@click.argument(
    "fault",
    type=click.Choice(
        ["fail", "hang", "vanish", "unschedulable", "oom", "pending", "leak", "replace"]
    ),
)
def sandbox_iris_fault(root: Path, fault: str) -> None:
    """Make the sandbox's next iris job misbehave: fail, hang, vanish, unschedulable, oom (ends
    `failed`), pending (never scheduled), leak (prints its
    DOCKER_TOKEN into its log), replace (another job of the
    same name replaces it when it ends)."""
    from sandbox.fake_iris import queue_fault

    queue_fault(root.resolve() / "iris", fault)
    click.echo(f"the next iris job will {fault}")


@sandbox.command("iris-contract")
@_dir
@click.argument("contract", type=click.Choice(["2026-08", "2026-07", "2026-06"]))
def sandbox_iris_contract(root: Path, contract: str) -> None:
    """Make the sandbox's iris speak another 2026 CLI
    generation: 2026-08 (describe, cancel; today's),
    2026-07 (summary text, kill), 2026-06 (summary --json, kill). Sets [iris] sandbox_contract."""
    from sandbox.world import use_iris_contract

    _guard(lambda: use_iris_contract(root, contract))
    click.echo(f"the sandbox iris speaks the {contract} contract; reload the code locations")


# -- images ---------------------------------------------------------------------------------------


@main.group()
def image() -> None:
    """Look inside pushed images: REF is host[:port]/name:tag or host[:port]/name@sha256:..."""


def _image_ref(ref: str):  # type: ignore[no-untyped-def]
    """REF parsed by the registry's own name rules, before the site is read or anything is asked."""
    from resources.registry import ImageRef
    from resources.site.rules import check_host_port

    try:
        parsed = ImageRef.parse(ref)
    # named as the argument it came from, as click names its own refusals
    except LockstepError as exc:
        raise click.BadParameter(str(exc), param_hint="REF") from None
    if not check_host_port(parsed.registry):
        raise click.BadParameter(
            f"{ref!r}: {parsed.registry!r} is not a registry host[:port]", param_hint="REF"
        )
    return parsed


def _registry_and_ref(ref: str):  # type: ignore[no-untyped-def]
    """The registry to read REF from: the site's own (token, layout dir) when REF is on the site's
    registry host; otherwise anonymous HTTP(S) (plain HTTP for 127.0.0.1 and localhost)."""
    from resources.registry import HttpRegistry, ImageRef, registry_for
    from resources.site.load import load_site

    parsed = _image_ref(ref)
    try:
        site = load_site()
    except LockstepError:
        site = None
    if site is not None and ImageRef.parse(site.tpu.image).registry == parsed.registry:
        return registry_for(site), parsed, site
    return HttpRegistry(host=parsed.registry), parsed, site


@image.command("digest")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help='Print {"ref", "digest", "absent"} instead.')
def image_digest(ref: str, as_json: bool) -> None:
    """Print the digest REF points at (exit 1 when it does not exist)."""
    import json

    registry, parsed, _ = _guard(lambda: _registry_and_ref(ref))
    digest = _guard(
        lambda: registry.resolve(repository=parsed.repository, reference=parsed.reference)
    )
    why = (
        None
        if digest
        else _guard(
            lambda: registry.absence(repository=parsed.repository, reference=parsed.reference)
        )
    )
    if as_json:
        click.echo(json.dumps({"ref": ref, "digest": digest, "absent": why}))
        sys.exit(0 if digest else 1)
    if digest is None:
        raise NegativeAnswer(f"{ref}: not in the registry ({why})")
    click.echo(digest)


@image.command("cat")
@click.argument("ref")
@click.argument("path")
def image_cat(ref: str, path: str) -> None:
    """Print PATH as installed in the image (read from
    the top layer down, never from a build log)."""
    if not path or CONTROL.search(path):
        raise click.BadParameter(
            f"{path!r} is not a file path (empty, or holds a control character)", param_hint="PATH"
        )
    registry, parsed, _ = _guard(lambda: _registry_and_ref(ref))
    read = _guard(
        lambda: registry.read_file(
            repository=parsed.repository, reference=parsed.reference, path=path
        )
    )
    if read is None:
        raise NegativeAnswer(f"{ref}: no file {path}")
    click.echo(
        f"# {read.path} from layer {read.layer_index} {read.layer_digest}; "
        f"read {read.bytes_read} of {read.image_bytes} image bytes",
        err=True,
    )
    sys.stdout.buffer.write(read.data)


@image.command("probes")
@click.argument("ref")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"ref", "passed", "description", "facts"} instead.',
)
def image_probes(ref: str, as_json: bool) -> None:
    """Run the site's file probes (default: the harbor
    config-drift guard) on REF; exit 0 only if all hold."""
    from resources.site.tpu import TpuSection
    from tpu_assets.inspection import run_probes

    registry, parsed, site = _guard(lambda: _registry_and_ref(ref))
    # No site: the default probes; the repository keys are required but not read by a probe.
    tpu = (
        site.tpu
        if site
        else TpuSection(
            harbor_repo="https://example.invalid/harbor.git",
            harbor_branch="main",
            consumer_repo="https://example.invalid/consumer.git",
            consumer_branch="main",
            image=f"{parsed.registry}/{parsed.repository}",
        )
    )
    finding = _guard(
        lambda: run_probes(
            registry, repository=parsed.repository, reference=parsed.reference, tpu=tpu
        )
    )
    if as_json:
        import json

        click.echo(
            json.dumps(
                {
                    "ref": ref,
                    "passed": finding.passed,
                    "description": finding.description,
                    "facts": dict(finding.facts),
                },
                indent=2,
            )
        )
    else:
        for where, lines in finding.facts.items():
            click.echo(f"--- {where}\n{lines}")
        click.echo(("HOLDS: " if finding.passed else "FAILS: ") + finding.description)
    sys.exit(0 if finding.passed else 1)


@main.command("changelog")
@click.argument("frm", metavar="FROM")
@click.argument("to", metavar="TO")
@click.option(
    "--must-contain",
    default="",
    metavar="SHA",
    help="A harbor commit (the fix) to mark in the list.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"from", "to", "fix", "range"} (every commit) instead.',
)
def changelog(frm: str, to: str, must_contain: str, as_json: bool) -> None:
    """Print the harbor commits from FROM to TO: added when TO is ahead, removed when TO is behind
    (a rollback), both for diverged histories; the first 50 each way, then a count. FROM and TO are
    sha prefixes of a build (a tpu_builds partition: a
    consumer commit, read through its uv.lock pin) or of
    a harbor commit. Reads git only; changes nothing."""
    # Checked before the site, the instance or git is read: these become git revisions.
    check_sha(frm, "FROM", required=True)
    check_sha(to, "TO", required=True)
    check_sha(must_contain, "--must-contain")

    from resources.changelog import changelog_text
    from resources.git import git_for
    from resources.site.load import load_site
    from tpu_assets.changelog import changelog_between, resolve_endpoint

    def compare():  # type: ignore[no-untyped-def]
        site = load_site()
        git = git_for(site)
        start, end = (
            resolve_endpoint(site, git, frm, what="FROM"),
            resolve_endpoint(site, git, to, what="TO"),
        )
        fix = (
            git.resolve_commit(
                url=site.tpu.harbor_repo, rev=must_contain, branch=site.tpu.harbor_branch
            )
            if must_contain
            else None
        )
        return start, end, changelog_between(site, git, start, end), fix

    start, end, found, fix = _guard(compare)
    if as_json:
        import json

        click.echo(
            json.dumps(
                {
                    "from": start.model_dump(mode="json"),
                    "to": end.model_dump(mode="json"),
                    "fix": fix,
                    "range": found.model_dump(mode="json"),
                },
                indent=2,
            )
        )
        return
    click.echo(f"{start.label} -> {end.label}")
    click.echo(changelog_text([found], fix=fix))


# -- rejecting a build -----------------------------------------------------------------------------


def _record_rejection(build: str, *, rejected: bool, by: str, reason: str) -> None:
    import getpass

    from resources.site.load import load_site
    from tpu_assets.rejection import record_rejection

    check_sha(build, "BUILD", required=True)

    def run():  # type: ignore[no-untyped-def]
        site = load_site()
        with _instance() as instance:
            return record_rejection(
                instance,
                site,
                build=build,
                rejected=rejected,
                by=by or getpass.getuser(),
                reason=reason,
                emit=instance.report_runless_asset_event,
                holder=f"lockstep {'reject' if rejected else 'release'}, pid {os.getpid()}",
            )

    done = _guard(run)
    if rejected:
        click.echo(
            f"build {done.build} rejected by {done.by}: {done.reason}. Neither promote_tpu nor "
            "auto_promote "
            f"promotes it until `lockstep release {done.build[:12]}`"
        )
    else:
        click.echo(
            f"build {done.build} released by {done.by}: it may be promoted again (soak and "
            "freeze still apply)"
        )


@main.command()
@click.argument("build")
@click.option("--reason", required=True, help="Why: shown in every refusal to promote it.")
@click.option("--by", default="", help="Who rejects it (default: the login name).")
def reject(build: str, reason: str, by: str) -> None:
    """Reject BUILD (a tpu_builds commit sha or its prefix) so nothing promotes it: recorded on its
    tpu/verified_image partition in the instance at $DAGSTER_HOME."""
    _record_rejection(build, rejected=True, by=by, reason=reason)


@main.command()
@click.argument("build")
@click.option("--by", default="", help="Who releases it (default: the login name).")
def release(build: str, by: str) -> None:
    """Undo `lockstep reject BUILD`: it may be promoted again."""
    _record_rejection(build, rejected=False, by=by, reason="")


@main.command()
@click.option(
    "--iris-builds",
    default=4,
    show_default=True,
    help="Concurrent iris builds (the cluster's quota).",
)
@click.option(
    "--apply",
    is_flag=True,
    help="Set them on the instance at $DAGSTER_HOME (else: print the commands).",
)
def pools(iris_builds: int, apply: bool) -> None:
    """The Dagster pools this site needs: tag moves, iris builds, one per DGX build node."""
    from lockstep.pools import apply_pools, site_pools
    from resources.site.load import load_site

    wanted = site_pools(_guard(load_site), iris_builds=iris_builds)
    if not apply:
        for pool, limit in wanted.items():
            click.echo(f"dagster instance concurrency set {pool} {limit}")
        return
    with _instance() as instance:
        apply_pools(instance, wanted)
    click.echo("set: " + ", ".join(f"{pool}={limit}" for pool, limit in wanted.items()))


@main.command()
@_dir
@click.option("--port", default=3000, show_default=True)
def demo(root: Path, port: int) -> None:
    """Sandbox up, then the Dagster UI on it (both code locations, sensors running)."""
    from sandbox.world import (
        SANDBOX_ATTEST_KEY_ENV,
        SANDBOX_TOKEN_ENV,
        SANDBOX_TOKEN_VALUE,
        sandbox_attest_key,
        up,
    )

    _require_engines()
    sb = _guard(lambda: up(root))
    home = sb.root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    # lockstep owns this instance's config (SQLite in
    # `home`, production's concurrency rules): refresh it.
    shutil.copyfile(
        Path(__file__).resolve().parent.parent / "deploy" / "sandbox" / "dagster.yaml",
        home / "dagster.yaml",
    )
    _set_demo_pools(home, sb.site_file)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LOCKSTEP_SITE": str(sb.site_file),
        "LOCKSTEP_CACHE": str(sb.root / "cache"),
        "LOCKSTEP_SENSORS_RUNNING": "1",
        SANDBOX_TOKEN_ENV: os.environ.get(SANDBOX_TOKEN_ENV) or SANDBOX_TOKEN_VALUE,
        SANDBOX_ATTEST_KEY_ENV: os.environ.get(SANDBOX_ATTEST_KEY_ENV) or sandbox_attest_key(),
    }
    workspace = Path(__file__).resolve().parent.parent / "workspace.yaml"
    click.echo(f"lockstep demo on http://127.0.0.1:{port} (sandbox {sb.root}); Ctrl-C stops it")
    click.echo("  push upstream from another terminal: lockstep sandbox advance-harbor")
    argv = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(workspace),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    sys.exit(_serve_then_down(sb, argv, env))


def _serve_then_down(sb: Sandbox, argv: list[str], env: dict[str, str]) -> int:
    """Run `argv` (dagster dev) until it ends, Ctrl-C
    or SIGTERM; then stop what the sandbox runs (its
    engines, iris jobs, the lane's containers, its git daemon), whichever way it ended."""
    import signal
    import subprocess

    from sandbox.teardown import stop_sandbox

    class _Terminated(Exception):
        pass

    def on_term(signum: int, frame: object) -> None:
        raise _Terminated

    proc = None
    # a service manager's stop: tear down as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        _start_engines(sb)
        proc = subprocess.Popen(argv, env=env)
        return proc.wait()
    except (KeyboardInterrupt, _Terminated) as why:
        # Ctrl-C reached dagster dev too (one process group); a SIGTERM to us did not: pass it on.
        if proc is not None and isinstance(why, _Terminated):
            proc.terminate()
        return 130 if isinstance(why, KeyboardInterrupt) else 143
    finally:
        # A second Ctrl-C or SIGTERM must not cut the
        # teardown short (dagster dev keeps its own handlers).
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if proc is not None:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        click.echo("lockstep demo: stopping the sandbox's engines, jobs and git daemon", err=True)
        for line in stop_sandbox(sb.root):
            click.echo(f"  stopped {line}", err=True)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _set_demo_pools(home: Path, site_file: Path) -> None:
    import dagster as dg

    from lockstep.pools import apply_pools, site_pools
    from resources.site.load import load_site

    with dg.DagsterInstance.from_config(str(home)) as instance:
        apply_pools(instance, site_pools(load_site(site_file), iris_builds=1))


def _instance():  # type: ignore[no-untyped-def]
    """The Dagster instance at $DAGSTER_HOME (made absolute);
    unset, the sandbox's, as `lockstep demo` uses."""
    import dagster as dg

    home = os.environ.get("DAGSTER_HOME") or (
        ".sandbox/dagster_home" if not os.environ.get("LOCKSTEP_SITE") else ""
    )
    if not home or not (Path(home) / "").is_dir():
        raise LockstepError(
            f"DAGSTER_HOME {home or '(unset)'} is not a directory: point it at the instance that "
            "ran lockstep"
        )
    os.environ["DAGSTER_HOME"] = str(Path(home).resolve())
    return dg.DagsterInstance.get()


def _guard(fn):  # type: ignore[no-untyped-def]
    """Run `fn`; a LockstepError becomes a one-line
    message and exit code 3 (operational), not a traceback;
    a Refused (the answer is "no") exit code 1."""
    try:
        return fn()
    except LockstepError as exc:
        raise (NegativeAnswer if isinstance(exc, Refused) else OperationalError)(str(exc)) from None


# -- the Jovian lane -------------------------------------------------------------------------------


@main.group()
def lane() -> None:
    """The Jovian lane's bench baseline."""


@lane.command("rebaseline")
@click.argument("report")
def lane_rebaseline(report: str) -> None:
    """Make the run a filed bench report records (REPORT:
    recipes/<lane>/reports/<file>.md in the build
    repo) the lane's baseline: writes recipes/<lane>/baseline.json there, committed and pushed."""
    from jovian_assets.bench_baseline import rebaseline
    from resources.git import git_for
    from resources.site.load import load_site

    def run():  # type: ignore[no-untyped-def]
        site = load_site()
        return rebaseline(site, git_for(site), report)

    base = _guard(run)
    click.echo(
        f"{base.lane}: baseline is {base.rev}'s run {base.run.run_id} ({base.run.tool} "
        f"{base.run.tool_version}, "
        f"score {base.run.final_score}, graded {base.run.graded_text}, cohort {base.run.cohort})"
    )


# -- lab revs -------------------------------------------------------------------------------------


@main.group()
def lab() -> None:
    """Preview a lab rev before adopting it."""


@lab.command("lock")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def lab_lock(path: Path) -> None:
    """Print a `<rev>.source.lock` parsed, as JSON: packages
    (repository, commit, tree, ...) and every other key."""
    import json

    from jovian_assets.inputs import read_text
    from jovian_assets.source_lock import parse_source_lock, to_json

    lock = _guard(lambda: parse_source_lock(read_text(path), str(path)))
    click.echo(json.dumps(to_json(lock), indent=2))


@lab.command("dep-table")
@click.argument("tree", type=click.Path(exists=True, file_okay=False, path_type=Path))
def lab_dep_table(tree: Path) -> None:
    """Print the cmake dependency table of a vLLM source
    tree (a checkout or an unpacked sdist) as JSON rows.

    A row whose repository or tag holds a variable nothing sets (or only sets from itself) keeps the
    `${VAR}` in its value, lists it under "unresolved",
    is named on stderr with its file:line and whether
    it is missing or recursive, and the command exits non-zero (lockstep never fetches it)."""
    import json

    from jovian_assets.dep_table import parse_tree, to_rows_json, why_unresolved
    from resources.errors import FileFormatError

    def parse():  # type: ignore[no-untyped-def]
        try:
            return parse_tree(tree)
        # the parser names files inside the tree; say where the tree is
        except FileFormatError as exc:
            if Path(exc.path) == tree:
                raise
            raise FileFormatError(tree / exc.path, exc.line, exc.message) from None

    rows = _guard(parse)
    click.echo(json.dumps(to_rows_json(rows), indent=2))
    open_rows = [row for row in rows if row.unresolved]
    for row in open_rows:
        click.echo(
            f"{tree / row.file}:{row.line}: {row.name}: unresolved {why_unresolved(row)}", err=True
        )
    if open_rows:  # a table with a pin nobody can fetch is not a table to sync gates from
        raise click.ClickException(
            f"{len(open_rows)} of {len(rows)} pins did not resolve to literal values (above)"
        )


main.add_command(site_group)
main.add_command(preflight)
main.add_command(deploy)
main.add_command(status)
for _command in ACT_COMMANDS:
    main.add_command(_command)
