"""The commands that act: `lockstep promote`, `rollback`,
`hold release tag|harbor`, `build reject|release`.

Each launches the same job a person would launch in the UI (tpu location: promote_tpu, rollback_tpu,
release_tpu_hold, release_harbor_hold, reject_tpu_build, release_tpu_build) through the webserver's
GraphQL (`--url`), then follows the run, printing its log as it comes. Only the webserver's URL is
needed: no database access, no dagster import (lockstep/graphql.py), so it works from a laptop.

Who asked is recorded on every launch: `--by`, else the login name, sent as the run tag
`lockstep/by` (and as the job's `by` config where it
has one); the jobs record it and name it in the run log.

`--plan` changes nothing. Without selectors it reads the precomputed status observation through the
webserver (lockstep/status_cmd.py's `plan_text`). With selectors (`--build`, `--must-contain`, a
`--scope` other than auto, `--override-freeze`) the answer depends on them, so it is computed here
from the instance at $DAGSTER_HOME (the in-process planner `lockstep rollback plan` always used):
that path needs database access, and says so.

Exit codes (lockstep/exits.py): 0 the run succeeded; 1 it ended in a refusal (the job raised one of
REFUSALS: a negative answer); 2 usage; 3 it failed otherwise, or the webserver could not be reached.
"""

from __future__ import annotations

import getpass
import json
import re
import sys
from collections.abc import Mapping
from typing import Any, Literal, NoReturn

import click

from lockstep.exits import NEGATIVE, OK, OPERATIONAL, OperationalError
from lockstep.graphql import DEFAULT_URL, RunEvent, Webserver, WebserverError
from resources.errors import LockstepError

LOCATION = "tpu"
# every command checks a sha with check_sha, before anything is asked
SHA_PREFIX = re.compile(r"^[0-9a-f]{4,40}$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# as a rejection's reason (tpu_assets/rejection.py MAX_TEXT): one line, kept in records
MAX_TEXT = 500
MAX_BY = 100
# The exceptions a job raises on purpose to say "no" (tpu_assets: promotion.py, promotion_policy.py,
# attestation.py, lock_assets.py). A run that failed
# with one of them is a negative answer, not a crash.
REFUSALS = frozenset(
    {"PromotionRefused", "AlreadyThere", "PolicyRefused", "AttestationRefused", "HarborHeld"}
)
# Following a run: how much of its log is printed, and for how long it is followed.
MAX_LINES = 400
MAX_LINE_CHARS = 4000
FOLLOW_S = 3600.0


# -- checking what was given -----------------------------------------------------------------------


def check_sha(value: str, hint: str, *, required: bool = False) -> str:
    if (value or required) and not SHA_PREFIX.match(value):
        raise click.BadParameter(
            f"{value!r} is not a commit sha or a prefix of one (4 to 40 lower-case hex digits)",
            param_hint=hint,
        )
    return value


def _text(value: str, hint: str, *, limit: int = MAX_TEXT, required: bool = False) -> str:
    value = value.strip()
    if required and not value:
        raise click.BadParameter("is empty: say it, it is kept with the record", param_hint=hint)
    if CONTROL.search(value):
        raise click.BadParameter(
            f"{value[:60]!r} holds a control character: one line, plain text", param_hint=hint
        )
    if len(value) > limit:
        raise click.BadParameter(
            f"is {len(value)} characters long: at most {limit}", param_hint=hint
        )
    return value


def check_url(value: str) -> str:
    if not re.match(r"^https?://[^\s/]+", value) or CONTROL.search(value):
        raise click.BadParameter(
            f"{value!r} is not an http(s) URL of a Dagster webserver", param_hint="--url"
        )
    return value


def who(by: str) -> str:
    """`--by`, else the login name: who is recorded as having asked."""
    if by:
        return _text(by, "--by", limit=MAX_BY)
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container's uid without a passwd entry)
        name = ""
    if not name:
        raise click.UsageError("no login name to record as who asked: say who you are with --by")
    return _text(name, "--by (the login name)", limit=MAX_BY)


_by = click.option(
    "--by",
    default="",
    metavar="WHO",
    help="Who asks, recorded with the run (default: the login name).",
)
_web = click.option(
    "--url",
    default=DEFAULT_URL,
    show_default=True,
    callback=lambda c, p, v: check_url(v),
    help="The Dagster webserver to launch through (needs only this URL, no database access).",
)
_json = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of the log."
)


# -- launching and following a run -----------------------------------------------------------------


def _config(op: str, config: Mapping[str, object]) -> dict[str, object]:
    return {"ops": {op: {"config": dict(config)}}}


def launch(
    web: Webserver, *, job: str, op: str, config: Mapping[str, object], by: str, command: str
) -> tuple[str, str]:
    """Launch `job` with `config` (plus `by`) and the tags that say who and what asked; the run id,
    and a note when the webserver's code has no `by`
    in that job's config (an older deployment: the tag
    still carries it)."""
    tags = {"lockstep/by": by, "lockstep/cli": command}
    try:
        return web.launch(
            location=LOCATION, job=job, run_config=_config(op, {**config, "by": by}), tags=tags
        ), ""
    except WebserverError as exc:
        if '"by"' not in str(exc) or "unexpected" not in str(exc).lower():
            raise
    run_id = web.launch(location=LOCATION, job=job, run_config=_config(op, config), tags=tags)
    return (
        run_id,
        (
            f"note: {job} on {web.url} takes no `by` in its config; who asked is in the run "
            "tag lockstep/by"
        ),
    )


def _line(event: RunEvent) -> str:
    text = (
        event.message
        if len(event.message) <= MAX_LINE_CHARS
        else event.message[:MAX_LINE_CHARS] + " [...]"
    )
    return f"{event.level or 'INFO':<7} {text}"


def follow(web: Webserver, run_id: str, *, echo: bool) -> tuple[str, list[str], list[str]]:
    """Follow the run to its end: its final status,
    the error classes of its failures, their messages.
    `echo`: print its log (not the engine's DEBUG chatter) as it comes, at most MAX_LINES lines."""
    classes: list[str] = []
    failures: list[str] = []
    shown = skipped = 0
    status = ""
    for item in web.run_events(run_id, deadline_s=FOLLOW_S):
        if isinstance(item, str):
            status = item
            break
        if item.error_classes:
            classes.extend(item.error_classes)
            failures.append((item.error_message or item.message)[:MAX_LINE_CHARS])
        if not echo or item.level == "DEBUG":
            continue
        if shown < MAX_LINES:
            click.echo(_line(item))
            # a failure's message is only "step failed": say what the op raised
            if item.error_message:
                click.echo(f"{'':<7} {item.error_message[:MAX_LINE_CHARS]}")
            shown += 1
        else:
            skipped += 1
    if skipped:
        click.echo(f"... {skipped} more log lines: {web.url}/runs/{run_id}")
    return status, classes, failures


def final_move(web: Webserver, run_id: str) -> dict[str, object] | None:
    """The floating-tag record this run wrote (its newest),
    or None (a runtime-only rollback, a refusal)."""
    _, materializations = web.asset_events(["tpu", "floating_tag"], limit=10)
    for event in materializations:
        if event.get("runId") == run_id:
            meta = event["metadata"]
            keys = (
                "action",
                "from_digest",
                "to_digest",
                "build",
                "hold",
                "by",
                "note",
                "must_contain",
            )
            return {k: meta[k] for k in keys if k in meta}
    return None


def run_job(
    *,
    url: str,
    job: str,
    op: str,
    config: Mapping[str, object],
    by: str,
    command: str,
    as_json: bool,
    moves_tag: bool,
) -> NoReturn:
    """Launch, follow, report, exit: 0 succeeded, 1 refused, 3 failed otherwise or not reachable."""
    web = Webserver(url)
    try:
        run_id, note = launch(web, job=job, op=op, config=config, by=by, command=command)
    except LockstepError as exc:
        hint = (
            (
                f" (is the {LOCATION} code location loaded, and this lockstep's version? "
                f"Deployment on {web.url})"
            )
            if "NotFoundError" in str(exc)
            else ""
        )
        raise OperationalError(f"{job} was not launched: {exc}{hint}") from None
    run_url = f"{web.url}/runs/{run_id}"
    if not as_json:
        click.echo(f"{command}: launched {job} as {by}: {run_url}")
        if note:
            click.echo(note)
    try:
        status, classes, failures = follow(web, run_id, echo=not as_json)
        move = final_move(web, run_id) if moves_tag and status == "SUCCESS" else None
    except LockstepError as exc:
        raise OperationalError(f"{command}: lost the run {run_url}: {exc}") from None
    except KeyboardInterrupt:  # only the following stops: the run is the webserver's
        click.echo(f"\n{command}: stopped following; the run goes on: {run_url}", err=True)
        sys.exit(130)
    refused = status == "FAILURE" and any(c in REFUSALS for c in classes)
    code = OK if status == "SUCCESS" else NEGATIVE if refused else OPERATIONAL
    outcome = {OK: "ok", NEGATIVE: "refused", OPERATIONAL: "failed"}[code]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "command": command,
                    "job": job,
                    "run_id": run_id,
                    "status": status,
                    "url": run_url,
                    "by": by,
                    "outcome": outcome,
                    "move": move,
                    "errors": failures,
                }
            )
        )
    else:
        if move:
            click.echo(
                f"{move.get('action')}: {move.get('from_digest') or 'nothing'} -> "
                f"{move.get('to_digest') or 'nothing'}"
                + (f" (build {str(move['build'])[:12]})" if move.get("build") else "")
                + (", hold set" if move.get("hold") else "")
            )
        click.echo(
            f"{command}: run {run_id} {status}: {outcome}"
            + ("" if code == OK else f"; see {run_url}")
        )
    sys.exit(code)


# -- plans -----------------------------------------------------------------------------------------


def _fast_plan(url: str, action: Literal["promote", "rollback"], as_json: bool) -> NoReturn:
    """What would happen, read from the precomputed status observation through the webserver."""
    try:  # lazily: the status command's module, and only here
        from lockstep.status_cmd import plan_text
    except ImportError:
        raise OperationalError(
            "this lockstep has no status observation reader (lockstep/status_cmd.py): "
            "plan with a selector (--build ...) on the instance at $DAGSTER_HOME"
        ) from None

    web = Webserver(url)
    try:
        text, positive = plan_text(web, action=action)
    except LockstepError as exc:
        raise OperationalError(str(exc)) from None
    _print_plan(
        action, text, positive, as_json=as_json, source=f"the status observation on {web.url}"
    )


def _print_plan(
    action: str,
    text: str,
    positive: bool,
    *,
    as_json: bool,
    source: str,
    extra: Mapping[str, Any] | None = None,
) -> NoReturn:
    if as_json:
        click.echo(
            json.dumps(
                {
                    "action": action,
                    "plan": True,
                    "ok": positive,
                    "text": text,
                    "source": source,
                    **(extra or {}),
                }
            )
        )
    else:
        click.echo(text)
        click.echo(f"(a plan from {source}: nothing was changed)")
    sys.exit(OK if positive else NEGATIVE)


def _local_rollback_plan(*, must_contain: str, build: str, scope: str, as_json: bool) -> NoReturn:
    """The in-process planner on the instance at
    $DAGSTER_HOME: which build a rollback would move the tag
    to and why each other one is refused, then what each scope would change."""
    from lockstep.cli import _guard, _instance
    from resources.git import git_for
    from resources.registry import registry_for
    from resources.site.load import load_site
    from tpu_assets.history import tag_history, verified_history
    from tpu_assets.promotion import plan_for
    from tpu_assets.runtime_rollback import explain_scopes

    def plan():  # type: ignore[no-untyped-def]
        site = load_site()
        git = git_for(site)
        with _instance() as instance:
            # Read once, newest first and only as far back as the two plans walk.
            verified, moves = verified_history(instance), tag_history(instance)
            found = plan_for(
                site,
                instance,
                git,
                registry_for(site),
                must_contain=must_contain,
                build=build,
                verified=verified,
                moves=moves,
            )
            return found, explain_scopes(
                site,
                instance,
                git,
                found,
                must_contain=must_contain,
                build=build,
                verified=verified,
                moves=moves,
            )

    result, scopes = _guard(plan)
    text = f"{result.explain()}\n{scopes}" + (f"\nasked scope: {scope}" if scope != "auto" else "")
    _print_plan(
        "rollback",
        text,
        result.ok,
        as_json=as_json,
        source="the instance at $DAGSTER_HOME",
        extra={"target": result.target.model_dump() if result.target else None, "scope": scope},
    )


def _local_promote_plan(*, build: str, override_freeze: bool, note: str, as_json: bool) -> NoReturn:
    """The promotion policy's verdict (rejection, soak,
    freeze) for `build` (or the newest), judged in
    process on the instance at $DAGSTER_HOME as promote_tpu judges it; changes nothing."""
    from lockstep.cli import _guard, _instance
    from resources.registry import ImageRef, registry_for
    from resources.site.load import load_site
    from tpu_assets.history import verified_history
    from tpu_assets.promotion_policy import PolicyRefused
    from tpu_assets.rejection import now_utc, policy_gate

    def plan() -> tuple[str, bool, dict[str, object]]:
        site = load_site()
        ref = ImageRef.parse(site.tpu.image)
        current = registry_for(site).resolve(
            repository=ref.repository, reference=site.tpu.floating_tag
        )
        with _instance() as instance:
            verified = verified_history(instance)
            try:
                target, override = policy_gate(
                    instance,
                    site.tpu.promotion,
                    verified=verified,
                    build=build,
                    now=now_utc(),
                    override_freeze=override_freeze,
                    note=note,
                )
            except PolicyRefused as exc:
                return f"promote: REFUSED by the promotion policy: {exc}", False, {"target": None}
            found = next((v for v in verified if v.build == target), None)
        if found is None:
            return (
                f"promote: no verified build {target or '(none)'} to promote",
                False,
                {"target": None},
            )
        facts: dict[str, object] = {"target": found.model_dump(), "current_digest": current}
        if found.digest == current:
            return (
                (
                    f"promote: :{site.tpu.floating_tag} already points at build "
                    f"{found.build[:12]} ({current}): nothing to do"
                ),
                False,
                facts,
            )
        text = (
            f"promote: would move :{site.tpu.floating_tag} from {current or 'nothing'} to "
            f"{found.digest} "
            f"(build {found.build[:12]}, harbor {found.harbor_commit[:12]}); the policy allows it"
        )
        if override is not None:
            text += f", overriding the freeze {override.window}"
        return text, True, facts

    text, positive, facts = _guard(plan)
    _print_plan(
        "promote",
        text,
        positive,
        as_json=as_json,
        source="the instance at $DAGSTER_HOME",
        extra=facts,
    )


# -- the commands ----------------------------------------------------------------------------------


@click.command()
@click.option(
    "--build",
    default="",
    metavar="SHA",
    help="Promote this build (a tpu_builds sha or its prefix); default the newest verified.",
)
@click.option(
    "--note",
    default="",
    help="Why, in your words (kept in the promotion log; needed to override a freeze).",
)
@click.option(
    "--override-freeze",
    is_flag=True,
    help="Go through an open [[tpu.promotion.freeze]] window (needs --note).",
)
@_by
@_web
@click.option(
    "--plan",
    is_flag=True,
    help="Show the promotion policy's verdict and the changelog; change nothing.",
)
@_json
def promote(
    build: str, note: str, override_freeze: bool, by: str, url: str, plan: bool, as_json: bool
) -> None:
    """Move the floating tag to a verified build: launches
    promote_tpu through the webserver and follows it.
    Exit 0 moved, 1 refused (policy, rejection, already there), 3 failed or unreachable."""
    check_sha(build, "--build")
    note = _text(note, "--note", required=override_freeze)
    if plan:
        if build or override_freeze:
            _local_promote_plan(
                build=build, override_freeze=override_freeze, note=note, as_json=as_json
            )
        _fast_plan(url, "promote", as_json)
    run_job(
        url=url,
        job="promote_tpu",
        op="tpu__floating_tag",
        by=who(by),
        command="promote",
        as_json=as_json,
        config={
            "action": "promote",
            "build": build,
            "note": note,
            "override_freeze": override_freeze,
        },
        moves_tag=True,
    )


@click.group(invoke_without_command=True)
@click.option(
    "--build",
    default="",
    metavar="SHA",
    help="Roll back to this build (a tpu_builds sha or its prefix).",
)
@click.option(
    "--must-contain",
    default="",
    metavar="SHA",
    help="A harbor commit (the fix) the target must contain.",
)
@click.option(
    "--scope",
    type=click.Choice(["auto", "image", "runtime", "both"]),
    default="auto",
    show_default=True,
    help="image: the tag; runtime: pin harbor in the consumer's uv.lock and hold it; both; auto: "
    "both when "
    "the target bakes another harbor than the lock.",
)
@click.option("--note", default="", help="Why, in your words (kept in the promotion log).")
@_by
@_web
@click.option(
    "--plan",
    is_flag=True,
    help="Show the target, the refusals and what each scope changes; change nothing.",
)
@_json
@click.pass_context
def rollback(
    ctx: click.Context,
    build: str,
    must_contain: str,
    scope: str,
    note: str,
    by: str,
    url: str,
    plan: bool,
    as_json: bool,
) -> None:
    """Move the floating tag back to an earlier verified build and set the hold: launches
    rollback_tpu through the webserver and follows it. Exit 0 rolled
    back, 1 refused (no target), 3 failed or unreachable.
    `lockstep rollback plan` is the in-process planner
    on $DAGSTER_HOME (as `--plan` with selectors)."""
    if ctx.invoked_subcommand is not None:
        return
    check_sha(build, "--build")
    check_sha(must_contain, "--must-contain")
    note = _text(note, "--note")
    if plan:
        if build or must_contain or scope != "auto":
            _local_rollback_plan(
                must_contain=must_contain, build=build, scope=scope, as_json=as_json
            )
        _fast_plan(url, "rollback", as_json)
    run_job(
        url=url,
        job="rollback_tpu",
        op="tpu__floating_tag",
        by=who(by),
        command="rollback",
        as_json=as_json,
        config={
            "action": "rollback",
            "build": build,
            "must_contain": must_contain,
            "note": note,
            "scope": scope,
        },
        moves_tag=True,
    )


@rollback.command("plan")
@click.option(
    "--must-contain",
    default="",
    metavar="SHA",
    help="A harbor commit (the fix) the target must contain.",
)
@click.option(
    "--build",
    default="",
    metavar="SHA",
    help="Judge this build (a tpu_builds partition or its prefix) only.",
)
@_json
def rollback_plan(must_contain: str, build: str, as_json: bool) -> None:
    """Print which build a rollback would move the floating tag to, and why each other one is
    refused, then what each scope (image: the tag;
    runtime: the consumer's uv.lock) would change, from the
    instance at $DAGSTER_HOME. Changes nothing. Exit
    0 when there is a target, 1 when there is none."""
    check_sha(must_contain, "--must-contain")
    check_sha(build, "--build")
    _local_rollback_plan(must_contain=must_contain, build=build, scope="auto", as_json=as_json)


@click.group()
def hold() -> None:
    """The holds a rollback sets: on the floating tag (no promotion) and on harbor (no re-lock)."""


@hold.command("release")
@click.argument("which", type=click.Choice(["tag", "harbor"]))
@_by
@_web
@_json
def hold_release(which: str, by: str, url: str, as_json: bool) -> None:
    """Release a hold: `tag` launches release_tpu_hold (promotions resume); `harbor` launches
    release_harbor_hold (re-lock harbor to its branch
    tip, pushed). Exit 0 released, 1 refused (no hold),
    3 failed or unreachable."""
    if which == "tag":
        run_job(
            url=url,
            job="release_tpu_hold",
            op="tpu__floating_tag",
            by=who(by),
            command="hold release tag",
            as_json=as_json,
            config={"action": "release_hold"},
            moves_tag=True,
        )
    run_job(
        url=url,
        job="release_harbor_hold",
        op="tpu__harbor_lock",
        by=who(by),
        command="hold release harbor",
        as_json=as_json,
        config={"release_hold": True},
        moves_tag=False,
    )


@click.group()
def build() -> None:
    """Reject a build so nothing promotes it, or release it: through the webserver."""


@build.command("reject")
@click.argument("sha", metavar="BUILD")
@click.option("--reason", required=True, help="Why: shown in every refusal to promote it.")
@_by
@_web
@_json
def build_reject(sha: str, reason: str, by: str, url: str, as_json: bool) -> None:
    """Reject BUILD (a tpu_builds commit sha or its
    prefix): launches reject_tpu_build. Exit 0 recorded,
    1 refused, 3 failed (e.g. already rejected, no such build) or unreachable."""
    check_sha(sha, "BUILD", required=True)
    reason = _text(reason, "--reason", required=True)
    run_job(
        url=url,
        job="reject_tpu_build",
        op="reject_build",
        by=who(by),
        command="build reject",
        as_json=as_json,
        config={"build": sha, "reason": reason},
        moves_tag=False,
    )


@build.command("release")
@click.argument("sha", metavar="BUILD")
@_by
@_web
@_json
def build_release(sha: str, by: str, url: str, as_json: bool) -> None:
    """Undo `lockstep build reject BUILD`: launches release_tpu_build; it may be promoted again."""
    check_sha(sha, "BUILD", required=True)
    run_job(
        url=url,
        job="release_tpu_build",
        op="release_build",
        by=who(by),
        command="build release",
        as_json=as_json,
        config={"build": sha},
        moves_tag=False,
    )


COMMANDS = (promote, rollback, hold, build)
