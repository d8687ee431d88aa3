"""The consumer repo (OpenThoughts-Agent's shape) as the re-lock and the kaniko build will find it.

Read from a temporary checkout of ``[tpu].consumer_branch`` (`GitRemotes.checkout`): harbor's source
in uv.lock and pyproject.toml follow the site's harbor branch on the site's harbor repo (the
re-lock's own validations), the Dockerfile has exactly one ``ENV HARBOR_COMMIT=<full sha>`` equal to
the lock's pin, and the build script passes its own pre-flight (`tpu_assets.build_script`): the
GITSHA guard, the destination is the site's image, no secret
expanded under ``set -x``, the executor pinned.
"""

from __future__ import annotations

from pathlib import Path

from lockstep.preflight.findings import Finding, Section, fail, ok, site_where, warn
from resources.errors import FileFormatError, decode_utf8
from resources.git import GitError, GitRemotes, NamedRefs
from resources.secrets import redact
from resources.site.schema import SiteConfig
from resources.site.tpu import TpuSection
from tpu_assets.build_script import ScriptFinding, check_build_script
from tpu_assets.dockerfile import find_pin, pin_variable
from tpu_assets.models import HarborPin
from tpu_assets.relock import check_follows_branch, in_checkout, read_state

AREA = "consumer"


def check_consumer(site: SiteConfig, git: GitRemotes) -> list[Section]:
    tpu = site.tpu
    repo = redact(tpu.consumer_repo)
    site_text = site.path.read_text(encoding="utf-8")
    title = f"consumer repo {repo} ({tpu.consumer_branch})"
    branch, refs = _harbor_branch(site, site_text, git)
    findings = [branch]
    try:
        with git.checkout(url=tpu.consumer_repo, branch=tpu.consumer_branch) as wt:
            title = f"consumer repo {repo} ({tpu.consumer_branch} @ {wt.base_sha[:8]})"
            findings += _in_checkout(wt.path, site, git, refs)
    except GitError as exc:
        findings.append(
            fail(
                AREA,
                "consumer.checkout",
                f"cannot check out {tpu.consumer_branch} of {repo}: {exc}",
                site_where(site.path, site_text, ("tpu",), "consumer_branch"),
                "Check [tpu].consumer_repo and consumer_branch, and that this machine can read "
                "the repo "
                "(git credentials for it, the network)",
            )
        )
    return [Section(area=AREA, title=title, findings=findings)]


def _harbor_branch(
    site: SiteConfig, site_text: str, git: GitRemotes
) -> tuple[Finding, NamedRefs | None]:
    """The branch the site watches exists: a retired branch (harbor moved to main) must be noticed,
    not skipped. Also what the harbor repo has under that
    name, which the lock check judges a `rev` by; None
    when the harbor repo could not be read."""
    tpu = site.tpu
    where = site_where(site.path, site_text, ("tpu",), "harbor_branch")
    try:
        refs = git.named_refs(url=tpu.harbor_repo, name=tpu.harbor_branch)
    except GitError as exc:
        return fail(
            AREA,
            "consumer.harbor_branch",
            str(exc),
            where,
            (
                "Check [tpu].harbor_repo and that this machine can read it (git credentials, "
                "the network)"
            ),
        ), None
    if refs.branch is None:
        return fail(
            AREA,
            "consumer.harbor_branch",
            f"branch {tpu.harbor_branch!r} does not exist on {redact(tpu.harbor_repo)}: the site "
            "watches a "
            "branch that is not there (retired?)",
            where,
            "Point [tpu].harbor_branch at the branch harbor lands on now, and make the "
            "consumer's harbor "
            "source in pyproject.toml follow the same branch",
        ), refs
    return ok(
        AREA,
        "consumer.harbor_branch",
        f"{tpu.harbor_branch} is at {refs.branch[:8]} on {redact(tpu.harbor_repo)}",
        where,
    ), refs


def _in_checkout(
    wt: Path, site: SiteConfig, git: GitRemotes, refs: NamedRefs | None
) -> list[Finding]:
    """The re-lock's own read-only checks (tpu_assets/relock.py: read_state, check_follows_branch),
    then the Dockerfile pin against the lock and the build script.
    Without the harbor repo's answer (`refs` None:
    consumer.harbor_branch failed, saying why) the lock is not judged; the rest still is."""
    tpu = site.tpu
    found: list[Finding] = []
    try:
        state = read_state(wt, tpu)
        if refs is not None:
            check_follows_branch(state, tpu, refs, git)
    except FileFormatError as exc:
        found.append(_shape_finding(exc, tpu))
    else:
        pin, source = state.pin, state.source
        if refs is not None:
            # Whatever the spelling (branch=, or a rev that
            # names the branch), the check held it to the site's.
            found.append(
                ok(
                    AREA,
                    "consumer.lock",
                    f"uv.lock pins {tpu.harbor_package} {pin.version or '(no version)'} @ "
                    f"{pin.commit[:8]} "
                    f"from {source.pinned_by} {tpu.harbor_branch} of the site's harbor repo, as "
                    f"{state.declared.where} declares it",
                    f"uv.lock:{state.lock.line_of(tpu.harbor_package) or 1}",
                )
            )
        found.append(_pins_agree(tpu, pin, state.dockerfile_text))
    found += _build_script(wt, site)
    return found


def _shape_finding(exc: FileFormatError, tpu: TpuSection) -> Finding:
    where = f"{exc.path}:{exc.line}" if exc.line else exc.path
    if exc.path == tpu.dockerfile:
        return fail(
            AREA,
            "consumer.dockerfile_pin",
            exc.message,
            where,
            f"Keep exactly one `ENV {pin_variable(tpu.harbor_package)}=<40-hex sha>` line in "
            f"{tpu.dockerfile}, "
            f"equal to uv.lock's {tpu.harbor_package} commit, then commit and push to "
            f"{tpu.consumer_branch}",
        )
    return fail(
        AREA,
        "consumer.lock",
        exc.message,
        where,
        f"Make {tpu.harbor_package}'s source in pyproject.toml follow [tpu].harbor_branch "
        f"({tpu.harbor_branch}) "
        f"of [tpu].harbor_repo, run `uv lock --upgrade-package {tpu.harbor_package}`, commit "
        "uv.lock and push "
        f"to {tpu.consumer_branch}",
    )


def _pins_agree(tpu: TpuSection, pin: HarborPin, docker_text: str) -> Finding:
    variable = pin_variable(tpu.harbor_package)
    # read_state found exactly one, a full sha
    baked = find_pin(docker_text, tpu.dockerfile, variable)
    where = f"{tpu.dockerfile}:{baked.line}"
    if baked.commit == pin.commit:
        return ok(
            AREA,
            "consumer.dockerfile_pin",
            f"{variable} equals uv.lock's pin {pin.commit[:8]}",
            where,
        )
    return fail(
        AREA,
        "consumer.dockerfile_pin",
        f"{variable}={baked.commit[:12]} but uv.lock pins {tpu.harbor_package} "
        f"{pin.commit[:12]}: the image "
        "would bake a different harbor than the workers run (the lock is the runtime gate)",
        where,
        f"Set that line to `ENV {variable}={pin.commit}`, commit and push to "
        f"{tpu.consumer_branch} (lockstep's "
        "relock_harbor job moves the two together)",
    )


def _build_script(wt: Path, site: SiteConfig) -> list[Finding]:
    tpu = site.tpu
    try:
        path = in_checkout(wt, tpu.build_script)
    except FileFormatError as exc:
        return [
            fail(
                AREA,
                "consumer.build_script",
                exc.message,
                tpu.build_script,
                "Make [tpu].build_script a file inside the consumer repo",
            )
        ]
    if not path.is_file():
        return [
            fail(
                AREA,
                "consumer.build_script",
                f"no {tpu.build_script} in the consumer repo",
                tpu.build_script,
                "Commit the kaniko build script there, or point [tpu].build_script at it",
            )
        ]
    try:
        text = decode_utf8(path.read_bytes(), tpu.build_script)
    except FileFormatError as exc:
        return [
            fail(
                AREA,
                "consumer.build_script",
                exc.message,
                f"{exc.path}:{exc.line}",
                "Save the script as UTF-8, commit and push",
            )
        ]
    # With no [iris] there is no token to pass yet: the
    # script's DOCKER_TOKEN guard is not held against it.
    token_given = bool(site.iris.docker_token_env) if site.iris else True
    report = check_build_script(
        text, path=tpu.build_script, image=tpu.image, token_given=token_given
    )
    by_kind: dict[str, list[ScriptFinding]] = {}
    for finding in report.findings:
        by_kind.setdefault(finding.kind, []).append(finding)
    found = []
    for kind, group in by_kind.items():  # one finding per kind of trouble, at its first line
        first = group[0]
        also = sorted({f.line for f in group[1:]} - {first.line})
        more = (
            f" (also at line{'s' if len(also) > 1 else ''} {', '.join(map(str, also))})"
            if also
            else ""
        )
        report_as = fail if first.severity == "error" else warn
        found.append(
            report_as(
                AREA,
                f"consumer.build_script.{kind}",
                first.what + more,
                f"{tpu.build_script}:{first.line}",
                _sentence(first.fix),
            )
        )
    if not report.errors:
        found.append(
            ok(
                AREA,
                "consumer.build_script",
                f"guards GITSHA, pushes to {report.destination}, expands no secret under `set -x`"
                + (
                    "" if "executor_unpinned" in by_kind else ", no unpinned kaniko executor:latest"
                ),
                tpu.build_script,
            )
        )
    return found


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]
