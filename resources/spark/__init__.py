"""SparkNodes: the DGX Spark node inventory and how commands reach it.

A package: `results` (errors and result records), `transports` (the sh script, streams, ssh and
local transports and the settings they take), `transfer` (drains, feeders, the tar sink and the tree
manifest), `nodes` (the resource and `spark_for`). Every name other modules import is here.

Two transports behind one internal interface (`_Transport` opens a `_Stream`: one running command
with its stdin, stdout, stderr and exit code):

- ``ssh``: paramiko. Host keys are checked against the site's known_hosts with a `RejectPolicy`
  (never auto-added); key auth from ``key_path``, its passphrase read from the environment variable
  ``passphrase_env`` names (the value is never stored, logged or shown); keepalives; a connect
  timeout and a command timeout. One cached connection per node carries the short commands and is
  replaced when it died; bulk streams (`put_tree`, `pipe`) get a connection of their own.
- ``local``: a subprocess on this machine, in the node's ``root`` directory, with ``root/bin`` first
  on PATH and ``HOME=root/home`` — the embedded sandbox's nodes.

Every command is an argv list. It reaches the node as ONE ``sh -c <script>`` whose script is built
with `shlex.join`/`shlex.quote` only, so a tag or directory named ``r28; touch /tmp/x`` is a name,
never a command, whatever login shell the node's user has.

Long jobs (a 2-hour image build, a 16 GB distribution) are started detached (``setsid nohup``)
and followed by STATE — the pid and an exit file — never by log strings: a dead output pipe exits
120 with an empty log (runbook: "Bench pipe pump"). Reads are idempotent, so a dropped connection
is reconnected for them; a dropped connection never fails a poll or the build behind it.
"""

from resources.spark.nodes import SparkNodes, spark_for
from resources.spark.results import (
    ConnectionLost,
    DetachedHandle,
    DetachedState,
    HostKeyRefused,
    PipeEnd,
    PipeFailed,
    PipeResult,
    PutResult,
    RunResult,
    SparkError,
    Unreachable,
)
from resources.spark.transfer import local_manifest
from resources.spark.transports import TransportSettings

__all__ = [
    "ConnectionLost",
    "DetachedHandle",
    "DetachedState",
    "HostKeyRefused",
    "PipeEnd",
    "PipeFailed",
    "PipeResult",
    "PutResult",
    "RunResult",
    "SparkError",
    "SparkNodes",
    "TransportSettings",
    "Unreachable",
    "local_manifest",
    "spark_for",
]
