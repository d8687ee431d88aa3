"""Each DGX Spark node, reached exactly as lockstep reaches it (resources/spark: paramiko with the
site's known_hosts, host keys verified and never added; local nodes through their transport).

On every node `docker version` must answer (the build, the distribution and the serving all drive
the node's engine); on the lane's head (``[jovian.lane] nodes[0]``) the bench tools must answer
``--version``. A node that refuses or cannot be reached gets one finding, naming the host, the
known_hosts file and what to do, and nothing more is asked of it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from lockstep.preflight.findings import Finding, Section, fail, ok
from resources.site.schema import SiteConfig
from resources.site.spark import SparkNode
from resources.spark import HostKeyRefused, SparkError, SparkNodes, Unreachable, spark_for
from resources.spark.results import RunResult

AREA = "nodes"


def node_checks(
    site: SiteConfig, *, command_timeout_s: float, connect_timeout_s: float
) -> list[tuple[str, Callable[[], list[Section]]]]:
    """One independent check per node (each on its own connection), to be run side by side."""
    section = site.spark
    assert section is not None
    lane = site.jovian.lane if site.jovian is not None else None
    head = lane.nodes[0] if lane is not None and lane.nodes else None
    tools = [lane.bench_quality[0], lane.bench_perf[0]] if lane is not None else []

    def check(node: SparkNode) -> Callable[[], list[Section]]:
        return lambda: [
            _check_node(
                site,
                node,
                tools if node.name == head else [],
                command_timeout_s=command_timeout_s,
                connect_timeout_s=connect_timeout_s,
            )
        ]

    return [(f"node {node.name}", check(node)) for node in section.nodes]


def title(site: SiteConfig) -> str:
    assert site.spark is not None
    if all(node.transport == "local" for node in site.spark.nodes):
        return "Spark nodes (all local: the sandbox's)"
    return f"Spark nodes (host keys verified against {site.resolve_path(site.spark.known_hosts)})"


def _where(node: SparkNode, site: SiteConfig) -> str:
    if node.transport == "local":
        return f"node {node.name} (local:{site.resolve_path(node.root)})"
    host = f"[{node.host}]" if ":" in node.host else node.host
    return f"node {node.name} ({node.user + '@' if node.user else ''}{host}:{node.port})"


def _check_node(
    site: SiteConfig,
    node: SparkNode,
    tools: list[str],
    *,
    command_timeout_s: float,
    connect_timeout_s: float,
) -> Section:
    # A SparkNodes of its own: its connection cache is not shared with the other nodes' threads.
    spark = spark_for(site).model_copy(
        update={"connect_timeout_s": connect_timeout_s, "command_timeout_s": command_timeout_s}
    )
    where = _where(node, site)
    try:
        findings = [_docker(spark, node, where, command_timeout_s)]
        findings += [_tool(spark, node, where, tool, command_timeout_s) for tool in tools]
    except SparkError as exc:
        findings = [_refused(exc, node, where, spark.known_hosts)]
    finally:
        spark.close()
    return Section(area=AREA, title=title(site), findings=findings)


def _run(spark: SparkNodes, node: SparkNode, argv: list[str], timeout_s: float) -> RunResult:
    return spark.run(node=node.name, argv=argv, timeout_s=timeout_s)


def _tail(result: RunResult) -> str:
    text = (result.stderr or result.stdout)[-600:].decode("utf-8", "replace").strip()
    return text or "no output"


def _docker(spark: SparkNodes, node: SparkNode, where: str, timeout_s: float) -> Finding:
    result = _run(spark, node, ["docker", "version"], timeout_s)
    if result.ok:
        server = re.search(r"Server:.*?Version:\s*(\S+)", result.text(), re.DOTALL)
        return ok(
            AREA,
            "nodes.docker",
            (
                "`docker version` answers (engine "
                f"{server.group(1) if server else 'version not shown'})"
            ),
            where,
        )
    if result.exit_code == 127:
        return fail(
            AREA,
            "nodes.docker",
            f"there is no `docker` on the node's PATH ({_tail(result)})",
            where,
            (
                f"Install the Docker engine on {node.name}, with `docker` on the PATH of the "
                "user lockstep logs in as"
            ),
        )
    return fail(
        AREA,
        "nodes.docker",
        f"`docker version` exited {result.exit_code}: {_tail(result)}",
        where,
        (
            f"Start the Docker engine on {node.name} and give the login user access to its "
            "socket (the docker group)"
        ),
    )


def _tool(spark: SparkNodes, node: SparkNode, where: str, tool: str, timeout_s: float) -> Finding:
    result = _run(spark, node, [tool, "--version"], timeout_s)
    if result.ok:
        version = result.text().strip().splitlines()
        return ok(
            AREA,
            "nodes.bench_tools",
            f"`{tool} --version` answers: {version[0] if version else '(no output)'}",
            where,
        )
    missing = " (not on the node's PATH)" if result.exit_code == 127 else ""
    return fail(
        AREA,
        "nodes.bench_tools",
        f"`{tool} --version` on the lane's head exited {result.exit_code}{missing}: "
        f"{_tail(result)}",
        where,
        f"Install {tool} on {node.name} for the login user (`uv tool install {shlex.quote(tool)}`; "
        "tool-eval-bench's perf extra brings llama-benchy), so the lane's bench can run there",
    )


def _refused(exc: SparkError, node: SparkNode, where: str, known_hosts: str) -> Finding:
    """The node could not be asked anything: its host key, the network, or the login."""
    if isinstance(exc, HostKeyRefused):
        listed = node.host if node.port == 22 else f"[{node.host}]:{node.port}"
        port = "" if node.port == 22 else f"-p {node.port} "
        return fail(
            AREA,
            "nodes.host_key",
            exc.message,
            f"{where}; known_hosts {known_hosts}",
            f"Verify {node.host}'s host key fingerprint out of band (on the node's console: "
            "`ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub`), then record exactly that key: `ssh-keygen -R "
            f"'{listed}' -f "
            f"{shlex.quote(known_hosts)}` and `ssh-keyscan {port}-t ed25519 {node.host} >> "
            f"{shlex.quote(known_hosts)}`, checking the scanned fingerprint matches",
        )
    if isinstance(exc, Unreachable):
        return fail(
            AREA,
            "nodes.reachable",
            exc.message,
            where,
            (
                f"Bring {node.name} up and reachable from here, or fix its host and port in "
                "[[spark.nodes]]"
            ),
        )
    return fail(
        AREA,
        "nodes.connect",
        exc.message,
        where,
        "Fix the login as the message says ([spark] key_path, passphrase_env, the node's "
        "authorized_keys), "
        "or the command's timeout with --timeout",
    )
