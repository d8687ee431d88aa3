"""Run every check a site calls for, side by side, each outside call under a deadline.

The areas are independent (two git repos, iris, each node, the registry), so each runs in a thread
of its own and a slow one (an iris tunnel, a node that does not answer) holds up none of the others.
Each call carries its own deadline (`Limits`); on top of that the whole run has one, and an area
still running then is reported as a failure rather than waited for (its threads are daemons: nothing
is left holding the process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import get_args

from pydantic import Field

from lockstep.preflight.findings import Area, Report, Section, build_report, fail
from resources.git import git_for
from resources.model import Model
from resources.secrets import secret_values
from resources.site.schema import SiteConfig

Check = tuple[str, Callable[[], list[Section]]]


class Limits(Model):
    """How long one outside call may take. `--timeout`
    sets them all; without it each comes from the site
    where the site says (an iris call, an ssh connect) and is a minute otherwise."""

    call_s: float = Field(
        default=60.0, gt=0, description="A git fetch, a registry request, a command on a node."
    )
    iris_s: float = Field(
        default=180.0, gt=0, description="One iris CLI call (opening the cluster tunnel is slow)."
    )
    connect_s: float = Field(default=15.0, gt=0, description="An ssh connection to a node.")

    @classmethod
    def for_site(cls, site: SiteConfig, timeout_s: float | None) -> Limits:
        iris = site.iris.call_timeout_s if site.iris else 180.0
        connect = site.spark.connect_timeout_s if site.spark else 15.0
        if timeout_s is None:
            return cls(iris_s=iris, connect_s=connect)
        return cls(call_s=timeout_s, iris_s=timeout_s, connect_s=min(connect, timeout_s))

    @property
    def overall_s(self) -> float:
        # The longest area makes a handful of sequential
        # calls (iris: its help screens, then a read).
        return 6 * max(self.call_s, self.iris_s) + self.connect_s + 30


def checks_for(site: SiteConfig, limits: Limits) -> list[Check]:
    """The checks this site calls for: the consumer and
    the registry always; the build repo, iris and the
    nodes when the site has [jovian], [iris] and [spark]."""
    from lockstep.preflight.consumer import check_consumer
    from lockstep.preflight.registry import check_registry

    git = git_for(site, timeout_s=limits.call_s)
    checks: list[Check] = [("consumer", lambda: check_consumer(site, git))]
    if site.jovian is not None:
        from lockstep.preflight.build_repo import check_build_repo

        checks.append(("build repo", lambda: check_build_repo(site, git)))
    if site.iris is not None:
        from lockstep.preflight.iris import check_iris

        checks.append(("iris", lambda: check_iris(site, timeout_s=limits.iris_s)))
    if site.spark is not None:
        from lockstep.preflight.nodes import node_checks

        checks += node_checks(
            site, command_timeout_s=limits.call_s, connect_timeout_s=limits.connect_s
        )
    checks.append(("registry", lambda: check_registry(site, timeout_s=limits.call_s)))
    return checks


def run_preflight(site: SiteConfig, *, timeout_s: float | None = None) -> Report:
    """Every check of `site`, as one report (secret
    values of the site's variables masked throughout)."""
    limits = Limits.for_site(site, timeout_s)
    sections = run_concurrently(checks_for(site, limits), deadline_s=limits.overall_s)
    return build_report(site.path, sections, secrets=secret_values(site.secret_env_names()))


def _area(name: str) -> Area:
    area = name.split(" ", 1)[0] if name.startswith("node ") else name
    area = "nodes" if area == "node" else area
    return area if area in get_args(Area) else "site"  # type: ignore[return-value]


def run_concurrently(checks: list[Check], *, deadline_s: float) -> list[Section]:
    """Run each check in a daemon thread; a check that raises, or is still running at the deadline,
    becomes a failing finding of its area instead of a traceback or a hang."""
    results: dict[int, list[Section]] = {}

    def one(i: int, name: str, check: Callable[[], list[Section]]) -> None:
        try:
            results[i] = check()
        except Exception as exc:  # noqa: BLE001  # a check that broke is a finding, and the others still report
            area = _area(name)
            results[i] = [
                Section(
                    area=area,
                    title=name,
                    findings=[
                        fail(
                            area,
                            f"{area.replace(' ', '_')}.preflight",
                            f"the {name} check could not run: {type(exc).__name__}: {exc}",
                            name,
                            "Fix what the message names and run preflight again; if it names "
                            "nothing of the site, report it "
                            "as a lockstep bug",
                        )
                    ],
                )
            ]

    threads = [
        threading.Thread(target=one, args=(i, name, check), name=f"preflight {name}", daemon=True)
        for i, (name, check) in enumerate(checks)
    ]
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline_s
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    sections: list[Section] = []
    for i, (name, _) in enumerate(checks):
        if i in results:
            sections += results[i]
            continue
        area = _area(name)
        sections.append(
            Section(
                area=area,
                title=name,
                findings=[
                    fail(
                        area,
                        f"{area.replace(' ', '_')}.deadline",
                        f"the {name} check did not finish within {deadline_s:g}s",
                        name,
                        (
                            "Find what does not answer (the network, the host, the cluster), "
                            "or give it longer with --timeout"
                        ),
                    )
                ],
            )
        )
    return sections
