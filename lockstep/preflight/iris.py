"""The iris CLI a site names, asked the way lockstep asks it, submitting nothing.

Found (``[iris] binary``, relative to the site file); its contract learned from its own help screens
(`IrisCli.capabilities`): `job run` with every option lockstep's kaniko job uses, `describe` or
`summary`, `cancel` or `kill`; and not too old for the controller: one cheap read (`job list
--prefix` of a job name lockstep never submits), which a controller 14+ days newer than the client
refuses ("client is too old"). The push token's
variable is set, and is not a Docker Hub token for ghcr.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from lockstep.preflight.findings import Finding, Section, fail, ok, site_where
from resources.iris.capabilities import ClientTooOld, MissingCapability
from resources.iris.cli import IrisCli, iris_for
from resources.iris.output import IrisError
from resources.kaniko import KanikoSettings, kaniko_job
from resources.registry import ImageRef
from resources.site.schema import SiteConfig
from tpu_assets.build import DOCKER_HUB_PAT

AREA = "iris"
# A name lockstep never gives a job: `job list --prefix` of it reads (almost) nothing, cheaply.
PROBE_JOB = "lockstep-preflight-probe"
UPGRADE = "`uv pip install -U marin-iris` (or `pip install -U marin-iris`) where lockstep runs"


def check_iris(site: SiteConfig, *, timeout_s: float) -> list[Section]:
    section = site.iris
    assert section is not None
    text = site.path.read_text(encoding="utf-8")
    target_key = next(
        k for k in ("cluster", "config", "controller_url") if getattr(section, k) is not None
    )
    target_where = site_where(site.path, text, ("iris",), target_key)
    binary_where = site_where(
        site.path,
        text,
        ("iris",),
        "binary",
        default=f"[iris] binary = {section.binary!r}, the default",
    )
    located = (
        site.resolve_path(section.binary) if "/" in section.binary else shutil.which(section.binary)
    )
    title = f"iris CLI {located or section.binary} ({target_key} {getattr(section, target_key)})"
    findings = [_push_token(site, text)]
    if located is None or not Path(located).is_file() or not os.access(located, os.X_OK):
        shown = located or f"{section.binary!r} (not on PATH)"
        findings.append(
            fail(
                AREA,
                "iris.binary",
                f"no executable iris CLI at {shown}",
                binary_where,
                "Install the iris CLI (`pip install marin-iris`, the cw-capable one) and set "
                "[iris] binary "
                "to its path (a relative path is relative to the site file)",
            )
        )
        return [Section(area=AREA, title=title, findings=findings)]
    findings.append(ok(AREA, "iris.binary", f"{located} is executable", binary_where))
    iris = iris_for(site).model_copy(update={"binary": str(located), "timeout_s": timeout_s})
    findings.append(_contract(iris, site, binary_where))
    findings.append(_controller(iris, target_where, binary_where))
    return [Section(area=AREA, title=title, findings=findings)]


def _push_token(site: SiteConfig, text: str) -> Finding:
    section = site.iris
    assert section is not None
    name = section.docker_token_env
    where = site_where(
        site.path, text, ("iris",), "docker_token_env", default="[iris] docker_token_env, unset"
    )
    if not name:
        return ok(
            AREA,
            "iris.push_token",
            "no [iris] docker_token_env: the kaniko job gets no DOCKER_TOKEN (a registry "
            "that takes anonymous pushes)",
            where,
        )
    value = os.environ.get(name, "")
    if not value:
        return fail(
            AREA,
            "iris.push_token",
            f"[iris] docker_token_env names ${name}, which is not set (or empty) here: "
            "the kaniko job would get no push token",
            where,
            f"Export {name} with the registry push token (ghcr: a GitHub PAT with "
            "write:packages) in the "
            "environment lockstep runs in",
        )
    if ImageRef.parse(site.tpu.image).registry == "ghcr.io" and re.search(DOCKER_HUB_PAT, value):
        return fail(
            AREA,
            "iris.push_token",
            f"${name} holds a Docker Hub personal access token (dckr_pat_...), but the "
            "push goes to ghcr.io",
            where,
            (
                f"Put a GitHub token with write:packages in {name} (`gh auth token`), not the "
                "Docker Hub one"
            ),
        )
    return ok(AREA, "iris.push_token", f"${name} is set (its value is never shown)", where)


def _contract(iris: IrisCli, site: SiteConfig, binary_where: str) -> Finding:
    """What lockstep needs of the binary: the kaniko job's
    options cover the smoke job's, so one spec tells."""
    assert site.iris is not None
    try:
        caps = iris.capabilities()
    except IrisError as exc:
        return fail(
            AREA,
            "iris.contract",
            f"cannot read what the iris CLI offers: {exc}",
            binary_where,
            f"Make `{iris.binary} job --help` work here (reinstall it: {UPGRADE})",
        )
    section = site.iris
    spec = kaniko_job(
        KanikoSettings(
            gitsha="0" * 7,
            image=site.tpu.image,
            docker_user=section.docker_user,
            docker_token_env=section.docker_token_env,
            cpu=section.cpu,
            memory=section.memory,
            disk=section.disk,
            timeout_s=section.build_timeout_s,
        ),
        b"# preflight\n",
    )
    missing = []
    try:
        # `job run`, describe-or-summary, and every `job run` option lockstep renders
        iris.require(spec=spec)
    except MissingCapability as exc:
        missing.append(str(exc))
    if caps.cancel_command is None:
        missing.append(
            f"`{iris.binary} job` has no cancel, kill or stop: lockstep could not end a job it "
            "started"
        )
    if missing:
        return fail(
            AREA,
            "iris.contract",
            "; ".join(missing),
            binary_where,
            f"Upgrade marin-iris: {UPGRADE}",
        )
    return ok(
        AREA,
        "iris.contract",
        f"speaks {caps.contract}: `job {caps.state_command}`, `job {caps.cancel_command}` "
        "and every `job run` option lockstep uses",
        binary_where,
    )


def _controller(iris: IrisCli, target_where: str, binary_where: str) -> Finding:
    try:
        iris.listed(job_id=iris.job_id(PROBE_JOB))
    except ClientTooOld as exc:
        return fail(
            AREA,
            "iris.client_age",
            str(exc),
            binary_where,
            f"Upgrade marin-iris ({UPGRADE}), or point [iris] binary at a current one: the "
            "controller accepts "
            "clients at most 14 days older than itself",
        )
    except IrisError as exc:
        return fail(
            AREA,
            "iris.controller",
            str(exc),
            target_where,
            "Make the cluster answer from here (KUBECONFIG, the network, the tunnel; [iris] "
            "cluster, config or "
            "controller_url), or give a slow tunnel more time with --timeout",
        )
    return ok(
        AREA,
        "iris.controller",
        "the controller answers `job list` and accepts this client",
        target_where,
    )
