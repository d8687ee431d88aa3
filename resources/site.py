"""SiteConfig: one TOML file describes a site — every URL, branch, path and policy lockstep uses.

The path comes from ``LOCKSTEP_SITE``; unset, the embedded sandbox's ``.sandbox/site.toml``.
Secrets are never stored in the file: it names environment variables (keys ending in ``_env``)
and the values are read when needed, never written back or logged.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import dagster as dg
from dagster._core.definitions.utils import is_valid_owner
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from resources.errors import FileFormatError, LockstepError, decode_utf8
from resources.iris_output import IRIS_NAME
from resources.names import (
    DEFAULT_SCHEMES,
    KNOWN_SCHEMES,
    NameRefused,
    check_name,
    check_ref,
    check_relative_path,
    check_url,
    url_scheme,
)
from resources.secrets import redact
from resources.site_rules import (
    KeyRefused,
    check_env_key,
    check_host,
    check_image_repository,
    check_local_image_tag,
    check_oci_tag,
    check_size,
    check_user,
)
from resources.tomlfile import SECRET_KEY, key_line, load_toml

DEFAULT_SITE = Path(".sandbox") / "site.toml"
SITE_ENV = "LOCKSTEP_SITE"

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# A key whose name says it holds a credential: its value must live in the environment.
_SECRETISH = SECRET_KEY


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _env_names_only(cls, value: Any, info: Any) -> Any:
        if info.field_name.endswith("_env") and value is not None and not _ENV_NAME.match(value):
            raise ValueError(
                "must be the NAME of an environment variable (like GHCR_TOKEN), "
                "never the secret itself"
            )
        return value


def _check_owners(value: list[str]) -> list[str]:
    # Dagster's own rule, so a bad owner fails here with file:line rather than at definitions load.
    for owner in value:
        if not is_valid_owner(owner):
            raise ValueError(f"owner {owner!r} must be an email address or 'team:<name>'")
    return value


Owners = Annotated[list[str], AfterValidator(_check_owners)]


def _repo_url(value: str) -> str:
    """A repository URL's shape (never an option, a remote helper or a bare path); whether its scheme
    is one this site allows is SiteConfig's check, which sees [site] url_schemes."""
    return check_url("repository URL", value, KNOWN_SCHEMES)


def _checked(check: Callable[[str, object], str], kind: str) -> AfterValidator:
    return AfterValidator(lambda value: check(kind, value))


# Outside names as field types: each key is checked by its kind's rule in resources/names.py.
RepoUrl = Annotated[str, AfterValidator(_repo_url)]
Branch = Annotated[str, _checked(check_ref, "branch")]
RepoPath = Annotated[str, _checked(check_relative_path, "path")]
PackageName = Annotated[str, _checked(check_name, "package name")]
NodeName = Annotated[str, _checked(check_name, "node name")]


class SiteSection(_Table):
    """``[site]``: who this site is and who owns what lockstep makes."""

    name: str = "site"
    commit_author: str = Field(
        default="lockstep <lockstep@localhost>",
        description="Author of the commits lockstep pushes (re-locks, profiles).",
    )
    owners: Owners = Field(
        default_factory=list, description="Owners of every asset: emails or 'team:<name>' (as Dagster requires)."
    )
    url_schemes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SCHEMES),
        description="Transports every repository URL may use (git@host:path is ssh); the sandbox adds 'file'.",
    )

    @field_validator("url_schemes")
    @classmethod
    def _schemes(cls, value: list[str]) -> list[str]:
        # ext:: and fd:: are not transports a site can opt into: they run commands or read descriptors.
        if unknown := [s for s in value if s not in KNOWN_SCHEMES]:
            raise ValueError(
                f"{', '.join(repr(s) for s in unknown)} is not a scheme lockstep lets git use "
                f"(known: {', '.join(sorted(KNOWN_SCHEMES))})"
            )
        if not value:
            raise ValueError("allows no scheme: no repository URL could load (the default is https, ssh)")
        return value

    @field_validator("commit_author")
    @classmethod
    def _name_email(cls, value: str) -> str:
        if not re.match(r"^[^<>]+ <[^<>@\s]+@[^<>\s]*>$", value):
            raise ValueError("must look like 'Name <email@host>'")
        return value


class Probe(_Table):
    """A file probe: in the INSTALLED file, what must (and must not) follow an anchor line."""

    name: str
    path: str = Field(description="Path in the image; relative paths are under [tpu].site_packages. Globs allowed.")
    anchor: str = Field(description="Regex for the anchor line, e.g. the guard `if existing_config != self.config:`")
    within: int = Field(default=4, ge=1, description="How many lines after the anchor are looked at.")
    must_follow: str | None = Field(default=None, description="Regex that must match one of those lines.")
    must_not_follow: str | None = Field(default=None, description="Regex that must match none of those lines.")

    @field_validator("anchor", "must_follow", "must_not_follow")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regex: {exc}") from None
        return value


HARBOR_GUARD_PROBE = Probe(
    name="harbor_config_drift_guard",
    path="harbor/job.py",
    anchor=r"^\s*if existing_config != self\.config:\s*$",
    within=4,
    must_follow=r"logger\.warning\(",
    must_not_follow=r"^\s*raise\b",
)


class RegistrySection(_Table):
    """``[registry]``: where images live. `layout` is an OCI image-layout directory (the sandbox)."""

    kind: Literal["http", "layout"] = "http"
    layout_dir: str = Field(default="registry", description="kind = layout: directory, relative to the site file.")
    username: str | None = Field(default=None, description="User for token exchange (ghcr: the GitHub user).")
    token_env: str | None = Field(default=None, description="NAME of the env var with the registry token.")


class IrisSection(_Table):
    """``[iris]``: the cluster CLI that runs kaniko builds and smoke jobs."""

    binary: str = Field(default="iris", description="Path to the iris CLI (relative: to the site file).")
    cluster: str | None = Field(default=None, description="--cluster=<name>, e.g. cw-us-east-02a.")
    config: str | None = Field(default=None, description="--config=<cluster YAML> instead of a cluster name.")
    controller_url: str | None = Field(default=None, description="--controller-url=<url> (a local controller).")
    user: str = Field(description="--user: jobs are /<user>/<name>, so the id is known before the submit.")
    docker_user: str = Field(description="DOCKER_USER_ID for the kaniko push (ghcr: the GitHub user).")
    docker_token_env: str | None = Field(
        default=None, description="NAME of the env var with the push token (ghcr: a GitHub PAT, never Docker Hub's)."
    )
    cpu: int = Field(default=16, gt=0)
    memory: str = "64GB"
    disk: str = "120GB"
    build_timeout_s: int = Field(default=10800, gt=0)
    smoke_timeout_s: int = Field(default=3600, gt=0)
    poll_min_s: float = Field(default=10.0, gt=0)
    poll_max_s: float = Field(default=60.0, gt=0)
    call_timeout_s: float = Field(default=180.0, gt=0, description="One CLI call; opening the cluster tunnel is slow.")
    sandbox_contract: Literal["2026-08", "2026-07", "2026-06"] = Field(
        default="2026-08",
        description="Sandbox only: which iris CLI generation the sandbox's iris speaks (describe/cancel; "
        "summary text/kill; summary --json/kill). A real site's iris is whatever is installed.",
    )

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not IRIS_NAME.match(value):
            raise ValueError("must be an iris user name (letters, digits, '.', '_', '@', '-'), e.g. benjaminfeuer")
        return value

    @field_validator("memory", "disk")
    @classmethod
    def _size(cls, value: str, info: Any) -> str:
        return check_size(info.field_name, value)

    @field_validator("controller_url")
    @classmethod
    def _controller(cls, value: str | None) -> str | None:
        return None if value is None else check_url("controller URL", value, {"http", "https"})

    @model_validator(mode="after")
    def _one_target(self) -> IrisSection:
        given = [k for k in ("cluster", "config", "controller_url") if getattr(self, k) is not None]
        if len(given) != 1:
            where: tuple[str, ...] = (given[1],) if given else ()
            raise KeyRefused(where, f"set exactly one of cluster, config, controller_url (got {', '.join(given) or 'none'})")
        if self.poll_min_s > self.poll_max_s:
            raise KeyRefused(
                ("poll_min_s",), f"poll_min_s ({self.poll_min_s:g}) must not exceed poll_max_s ({self.poll_max_s:g})"
            )
        return self


class TpuSection(_Table):
    """``[tpu]``: the harbor fork, the consumer repo that locks it, and the image it builds."""

    harbor_repo: RepoUrl
    harbor_branch: Branch
    harbor_package: PackageName = "harbor"
    consumer_repo: RepoUrl
    consumer_branch: Branch
    dockerfile: RepoPath = "docker/Dockerfile.tpu"
    build_script: RepoPath = "docker/build_tpu_kaniko.sh"
    image: Annotated[str, _checked(check_image_repository, "image")] = Field(
        description="Image repository, e.g. ghcr.io/open-thoughts/openthoughts-agent")
    floating_tag: Annotated[str, _checked(check_oci_tag, "floating tag")] = Field(
        default="tpu", description="The tag other users pull; moved only by promote/rollback.")
    site_packages: str = "/opt/openthoughts/.venv/lib/python3.12/site-packages"
    smoke_command: list[str] = Field(
        default_factory=lambda: [
            "bash", "-lc",
            "/opt/openthoughts/.venv/bin/python -c 'import harbor.job, importlib.metadata as m; "
            "print(\"harbor\", m.version(\"harbor\"))'",
        ],
        description="Run on the pinned tag as an iris job; exit 0 = smoke passed.",
    )
    probes: list[Probe] = Field(default_factory=lambda: [HARBOR_GUARD_PROBE])
    min_layers: int = Field(default=2, ge=1, description="One giant layer is not pullable over ghcr egress.")
    max_layer_bytes: int = Field(default=8 * 1024**3, gt=0)
    rebuild_on_lock_change: StrictBool = Field(
        default=False, description="Rebuild when only the lock moved (first-serve latency; not needed for correctness)."
    )
    auto_promote: StrictBool = Field(default=False, description="Promote each newly verified build (never while on hold).")
    owners: Owners | None = Field(default=None, description="Owners of the tpu assets; unset: [site] owners.")


DEFAULT_VERSIONS_KEYS = {
    "vllm.commit": "VLLM_COMMIT", "vllm.tree": "VLLM_TREE", "vllm.version": "VLLM_PRETEND_VERSION",
    "b12x.commit": "B12X_COMMIT", "b12x.tree": "B12X_TREE",
    "lmcache.commit": "LMCACHE_COMMIT", "lmcache.tree": "LMCACHE_TREE", "lmcache.version": "LMCACHE_PRETEND_VERSION",
}


# A rev's fork can come from another owner (fixtures/README.md): its URL follows the commit into the
# profile, but only where versions.env pins repository URLs at all.
DEFAULT_REPOSITORY_KEYS = {"vllm.repository": "VLLM_REPO", "b12x.repository": "B12X_REPO", "lmcache.repository": "LMCACHE_REPO"}


def rev_order(rev: str) -> tuple[str | int, ...]:
    """How the lab's revs order: digit runs compare as numbers (r2 < r10 < r39), the rest as text.

    `re.split` with a capturing group alternates text and digit runs, so every position of two keys
    holds the same type and any two revs compare."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", rev)))


class Lineage(_Table):
    """``[[jovian.lineages]]``: from `from_rev` on, revs build from `dir` (its own versions.env,
    fetch-deps.sh gate list and profiles/), e.g. the runbook's r39 split into jovian-judgement-r39/."""

    dir: Annotated[str, _checked(check_relative_path, "lineage dir")] = Field(description="In the build repo.")
    from_rev: Annotated[str, _checked(check_name, "lineage from_rev")] = Field(description="The first rev of the lineage.")


class JovianSection(_Table):
    """``[jovian]``: the lab's source locks, the engine forks they pin, and the build repo that adopts them."""

    lab_repo: RepoUrl
    lab_branch: Branch = "master"
    lock_glob: str = Field(default="models/glm-5.3-flash/**/*.source.lock", description="Source locks in the lab repo.")
    build_repo: RepoUrl = Field(description="The docker-images repo.")
    build_branch: Branch = "main"
    build_dir: Annotated[str, _checked(check_relative_path, "build_dir")] = Field(default="jovian-judgement", description="In the build repo: versions.env, fetch-deps.sh, profiles/.")
    recipes_glob: str = Field(default="recipes/*/recipe.toml", description="Recipe TOML files in the build repo.")
    packages: list[PackageName] = Field(default_factory=lambda: ["vllm", "b12x", "lmcache"], description="Engine forks audited as one cut.")
    integration_branches: dict[str, str] = Field(
        default_factory=lambda: {"vllm": "integration/*", "b12x": "integration/*", "lmcache": "*"},
        description="Per package, a glob of the fork's integration branch names (ls-remote pattern).",
    )
    cut_window_minutes: float = Field(default=30.0, gt=0, description="All pins of one rev are cut within this window.")
    versions_keys: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_VERSIONS_KEYS), description="Source-lock key -> versions.env key."
    )
    repository_keys: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_REPOSITORY_KEYS),
        description="Source-lock repository key -> versions.env key; applied only where versions.env has that key.",
    )
    cmake_package: PackageName = Field(default="vllm", description="The package whose tree declares the cmake deps.")
    build_node: NodeName | None = Field(default=None, description="The [[spark.nodes]] name that builds images.")
    image_tag: str = Field(default="jovian-judgement:{rev}-glm53", description="Image tag; {rev} is the lab rev.")
    build_command: list[str] = Field(default_factory=lambda: ["bash", "build.sh"], description="Run in the shipped build dir with TAG and PROFILE set.")
    build_timeout_s: float = Field(default=4 * 3600.0, gt=0)
    poll_s: float = Field(default=30.0, gt=0)
    boot_gates: list[BootGate] = Field(default_factory=lambda: list(DEFAULT_BOOT_GATES))
    lane: LaneSection | None = None
    lineages: list[Lineage] = Field(
        default_factory=list, description="Build dirs by rev: a rev before every lineage builds from build_dir.")
    owners: Owners | None = Field(default=None, description="Owners of the jovian assets; unset: [site] owners.")

    @model_validator(mode="after")
    def _one_lineage_per_rev(self) -> JovianSection:
        seen: dict[tuple[str | int, ...], Lineage] = {}
        for i, lineage in enumerate(self.lineages):
            key = rev_order(lineage.from_rev)
            if key in seen:
                raise KeyRefused(("lineages", i, "from_rev"), (
                    f"from_rev {lineage.from_rev!r} already starts lineage {seen[key].dir!r}: one rev cannot build "
                    "from two dirs; give each lineage its own first rev"))
            seen[key] = lineage
        return self

    def build_dir_for(self, rev: str) -> str:
        """The build dir of `rev`: the lineage with the latest `from_rev` at or before it, else build_dir."""
        started = [lin for lin in self.lineages if rev_order(lin.from_rev) <= rev_order(rev)]
        return max(started, key=lambda lin: rev_order(lin.from_rev)).dir if started else self.build_dir

    @field_validator("versions_keys", "repository_keys")
    @classmethod
    def _env_keys(cls, value: dict[str, str]) -> dict[str, str]:
        # The values become `KEY=...` lines of versions.env and of every profile lockstep writes.
        return {k: check_env_key("versions.env key", v) for k, v in value.items()}

    @field_validator("image_tag")
    @classmethod
    def _image_tag(cls, value: str) -> str:
        _placeholders(value, {"rev"})
        # A rev is a plain name (names.check_name), so any tag that is valid for one is valid for all.
        check_local_image_tag("image_tag", value.replace("{rev}", "r35"), shown=f"{value!r} (for rev r35)")
        return value


class SparkNode(_Table):
    """One DGX Spark node. `ssh` nodes are reached with paramiko; `local` nodes run commands on this
    machine in their own directory (`root`, relative to the site file), with `root/bin` first on PATH."""

    name: NodeName
    transport: Literal["ssh", "local"] = "ssh"
    host: str = ""
    port: int = Field(default=22, gt=0, lt=65536)
    user: str = Field(default="", description="Login name; empty: the user lockstep runs as (as ssh does).")
    root: str = ""
    roles: list[Literal["build", "lane"]] = Field(default_factory=list)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_host("host", value) if value else value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return check_user("user", value) if value else value

    @model_validator(mode="after")
    def _reachable(self) -> SparkNode:
        if self.transport == "ssh" and not self.host:
            raise KeyRefused(("host",), f"node {self.name!r} is an ssh node without a host: add host = \"<name or IP>\"")
        if self.transport == "local" and not self.root:
            raise KeyRefused(("root",), f"node {self.name!r} is a local node without a root directory: add root = \"...\"")
        return self


class SparkSection(_Table):
    """``[spark]``: the node inventory and how to reach it. Host keys are verified, never auto-added."""

    nodes: list[SparkNode]
    known_hosts: str = Field(default="~/.ssh/known_hosts", description="Host keys to verify against.")
    key_path: str | None = Field(default=None, description="Private key file (a path, not a secret).")
    passphrase_env: str | None = Field(default=None, description="NAME of the env var with the key's passphrase.")
    connect_timeout_s: float = Field(default=15.0, gt=0)
    command_timeout_s: float = Field(default=600.0, gt=0)
    keepalive_s: int = Field(default=30, ge=0)

    @model_validator(mode="after")
    def _unique(self) -> SparkSection:
        seen: set[str] = set()
        for i, node in enumerate(self.nodes):
            if node.name in seen:
                raise KeyRefused(("nodes", i, "name"), f"node name {node.name!r} appears more than once: names must be unique")
            seen.add(node.name)
        return self

    def node(self, name: str) -> SparkNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LockstepError(f"no [[spark.nodes]] named {name!r} (have: {', '.join(n.name for n in self.nodes)})")


class BootGate(_Table):
    """A boot gate: `docker run --rm IMG python -c CODE` on the build node; exit 0 and, when given,
    `expect` (a regex; `{vllm_version}`, `{rev}` and `{<pkg>_commit8}` are filled from the lock) in stdout."""

    name: str
    code: str
    expect: str | None = None


# patch_cuda_sm12x.py + the eugr set, in the order they run (runbook: GB10 adaptation deltas).
SM12X_PATCHES = (
    "preserve_sm12x_target", "sm120_cooperative_topk", "spark_kv_cache_cleanup", "b12x_c128a_alignment",
    "flashinfer_swigluoai", "speculator_cudagraph_pool", "routed_expert_weight_shape",
)

DEFAULT_BOOT_GATES = [
    BootGate(name="vllm_import_carries_pin", code="import vllm; print(vllm.__version__)", expect=r"^{vllm_version}$"),
    BootGate(name="b12x_import", code="import b12x; print(b12x.__name__)"),
    BootGate(name="lmcache_native", code="import lmcache, lmcache.cuda_ops, lmcache.lmcache_native, lmcache.lmcache_fs; print('ok')"),
    BootGate(name="flashkda_extension", code="import vllm._flashkda_C; print('ok')"),
    BootGate(name="b12x_enum_resolves",
             code="from vllm.model_executor.layers.fused_moe import MoEBackend; print(MoEBackend['B12X'].value)", expect=r"^b12x$"),
    BootGate(name="nvfp4_ds_mla_present",
             code="import pathlib, vllm; t = (pathlib.Path(vllm.__file__).parent / 'config' / 'cache.py').read_text(); "
                  "assert 'nvfp4_ds_mla' in t, 'nvfp4_ds_mla missing from vllm/config/cache.py'; print('ok')"),
    # GB10 (runbook: GB10 adaptation deltas). No GPU at gate time, so not torch.cuda: the arch list the
    # build read off its own compiled kernels (`cuobjdump --list-elf`, <pkg>/_cuda_archs.txt). That is
    # what nvcc emitted, so it shows 12.1a silently collapsed to sm_120 where the build args say 12.1a.
    BootGate(name="cuda_arch_sm121a", code=(
        "import pathlib, vllm, lmcache\n"
        "for m in (vllm, lmcache):\n"
        "    f = pathlib.Path(m.__file__).parent / '_cuda_archs.txt'\n"
        "    assert f.is_file(), m.__name__ + '/_cuda_archs.txt is missing: the build did not record the arch of its kernels'\n"
        "    a = f.read_text().split()\n"
        "    assert 'sm_121a' in a, (m.__name__ + ' kernels are compiled for ' + (' '.join(a) or 'nothing') + ', not sm_121a '\n"
        "                            '(TORCH_CUDA_ARCH_LIST=12.1a collapses to 12.0 without preserve_sm12x_target)')\n"
        "    print(m.__name__, ' '.join(a))\n"
    )),
    # The marker patch_cuda_sm12x.py writes into the vLLM tree it patched: every patch of the set, each
    # applied once (the script is idempotent: a re-run finds its markers and changes nothing).
    BootGate(name="sm12x_patch_set_applied", code=(
        "import json, pathlib, vllm\n"
        "f = pathlib.Path(vllm.__file__).parent / '_sm12x_patches.json'\n"
        "assert f.is_file(), 'vllm/_sm12x_patches.json is missing: patch_cuda_sm12x.py did not run on this vLLM tree'\n"
        "got = json.loads(f.read_text())['patches']\n"
        f"need = {list(SM12X_PATCHES)!r}\n"
        "missing = [p for p in need if p not in got]\n"
        "assert not missing, 'the sm12x patch set did not run in full: missing ' + ', '.join(missing)\n"
        "print(' '.join(need))\n"
    )),
]


class LaneSection(_Table):
    """``[jovian.lane]``: the nodes that serve a rev, and the bench that gates it."""

    name: Annotated[str, _checked(check_name, "lane name")] = "glm53-2x"
    nodes: list[NodeName]
    bench_quality: list[str] = Field(
        default_factory=lambda: ["tool-eval-bench", "run", "--hardmode", "--seed", "{seed}", "--base-url", "{base_url}",
                                 "--model", "{model}", "--no-live", "--json-file", "{out}"],
        description="The quality run on the bench node, an argv list: {base_url}, {model} (the served endpoint), "
        "{seed}, {out} (where it writes its --json-file result, which lockstep reads).")
    bench_perf: list[str] = Field(
        default_factory=lambda: ["llama-benchy", "--base-url", "{base_url}/v1", "--model", "{model}", "--pp", "2048",
                                 "--tg", "128", "--concurrency", "1", "2", "--format", "json", "--save-result", "{out}"],
        description="The perf run (llama-benchy, pp/tg at each concurrency), same placeholders; {out} gets its JSON.")
    seed: int = Field(default=42, description="The quality run's fixed seed (runbook: seeds fixed, 42).")
    tolerance: float = Field(default=1.0, ge=0, description="How far under the recorded baseline run a score may fall.")
    bench_timeout_s: float = Field(default=7200.0, gt=0)
    # Booting a rev on the lane (jovian/lane_serving). One container per lane node; the head (nodes[0])
    # serves the endpoint, the others run as workers (`worker_args` appended) and bind nothing.
    serve_command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SERVE_COMMAND),
        description="The recipe's serve argv after IMAGE; {tag} {model} {port} {rank} {nnodes} {head} are filled in.")
    worker_args: list[str] = Field(default_factory=lambda: ["--headless"],
                                   description="Appended to serve_command on every lane node but the head.")
    serve_variables: dict[str, str] | None = Field(default=None, description="`-e K=V` for the serving container.")
    serve_port: int = Field(default=8000, gt=0, lt=65536, description="The head's endpoint port (on the head node).")
    served_model: Annotated[str, _checked(check_name, "served model name")] = Field(
        default="glm-5.3-flash", description="The name `/v1/models` lists (`--served-model-name`).")
    ready_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_READY_PATTERNS),
        description="Regexes the head container's log must show, in this order, before the endpoint is asked.")
    jit_cache_dir: str = Field(default="~/sm121-cache/jit-121f",
                               description="The node's JIT cache: populated = a warm start, empty = cold.")
    jit_cache_mount: str = Field(default="/root/.cache/jit-121f", description="Where the container sees it.")
    warm_budget_s: float = Field(default=20 * 60.0, gt=0, description="Readiness budget when every JIT cache is warm (~9 min).")
    cold_budget_s: float = Field(default=75 * 60.0, gt=0, description="Readiness budget when a JIT cache is empty (~45 min).")
    serve_poll_s: float = Field(default=10.0, gt=0, description="Seconds between looks at the container's state and log.")

    @field_validator("serve_command")
    @classmethod
    def _serve_command(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("is empty: give the recipe's serve argv, e.g. [\"vllm\", \"serve\", ...]")
        used: set[str] = set()
        for word in value:
            _placeholders(word, set(SERVE_PLACEHOLDERS))
            used |= {f for _, f, _, _ in string.Formatter().parse(word) if f is not None}
        if missing := {"port", "model"} - used:
            raise ValueError(f"never uses {', '.join('{' + m + '}' for m in sorted(missing))}: the endpoint check "
                             "asks serve_port for served_model, so the command must serve them")
        if "{" in value[0]:
            raise ValueError(f"starts with {value[0]!r}: the program must be a fixed word, not a placeholder")
        return value

    @field_validator("worker_args")
    @classmethod
    def _worker_args(cls, value: list[str]) -> list[str]:
        for word in value:
            _placeholders(word, set(SERVE_PLACEHOLDERS))
        return value

    @field_validator("serve_variables")
    @classmethod
    def _serve_variables(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else {check_env_key("serve_variables key", k): v for k, v in value.items()}

    @field_validator("ready_patterns")
    @classmethod
    def _ready_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return value

    @field_validator("jit_cache_dir", "jit_cache_mount")
    @classmethod
    def _jit_dir(cls, value: str, info: Any) -> str:
        # Plain parts only: the path becomes one side of `docker run -v SRC:DST`, where ':' and ',' split.
        home = info.field_name == "jit_cache_dir" and value.startswith("~/")
        if not (home or value.startswith("/")):
            where = "absolute or start with ~/ (the node user's home)" if info.field_name == "jit_cache_dir" else (
                "an absolute path inside the container")
            raise ValueError(f"{value!r} must be {where}")
        parts = (value[2:] if home else value.lstrip("/")).split("/")
        if any(p in ("", ".", "..") or not re.fullmatch(r"[A-Za-z0-9._-]+", p) for p in parts):
            raise ValueError(f"{value!r}: each part must be a plain name (letters, digits, '.', '_', '-'; no '..', "
                             "no empty part)")
        return value

    @model_validator(mode="after")
    def _budgets(self) -> LaneSection:
        if self.cold_budget_s < self.warm_budget_s:
            raise KeyRefused(("cold_budget_s",), f"cold_budget_s {self.cold_budget_s:g} is under warm_budget_s "
                             f"{self.warm_budget_s:g}: an empty JIT cache takes longer (~45 vs ~9 min)")
        return self

    @field_validator("bench_quality", "bench_perf")
    @classmethod
    def _bench_command(cls, argv: list[str]) -> list[str]:
        if not argv or not argv[0] or argv[0].startswith("-") or "{" in argv[0]:
            raise ValueError("must be an argv list whose first word is the tool, e.g. [\"tool-eval-bench\", \"run\", ...]")
        for word in argv:
            _placeholders(word, set(BENCH_PLACEHOLDERS))
        if not any("{out}" in word for word in argv):
            raise ValueError("needs {out}: the file the tool writes its JSON result to, which lockstep reads back")
        return argv


# What {placeholders} a serve argv may use: the image tag, the served model name, the endpoint port,
# this node's rank in the lane (0 = head), the lane's node count and the head's host.
SERVE_PLACEHOLDERS = ("tag", "model", "port", "rank", "nnodes", "head")
DEFAULT_SERVE_COMMAND = (
    "vllm", "serve", "/models/glm-5.3-flash", "--served-model-name", "{model}", "--host", "0.0.0.0", "--port", "{port}",
    "--tensor-parallel-size", "{nnodes}", "--nnodes", "{nnodes}", "--node-rank", "{rank}", "--master-addr", "{head}",
)
# The runbook's serve readiness: the KV-size line ~10 min in, application startup ~5 min after.
DEFAULT_READY_PATTERNS = (r"GPU KV cache size: ([\d,]+) tokens", r"Application startup complete")

BENCH_PLACEHOLDERS = ("base_url", "model", "seed", "out")


def _placeholders(template: str, allowed: set[str]) -> str:
    try:
        names = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as exc:
        raise ValueError(f"is not a valid template: {exc}") from None
    if unknown := names - allowed:
        raise ValueError(
            f"uses {', '.join('{' + n + '}' for n in sorted(unknown))}; "
            f"allowed: {', '.join('{' + n + '}' for n in sorted(allowed))}"
        )
    return template


class CommitLink(_Table):
    """``[[links.commit]]``: commits of remotes whose URL starts with `remote` link to `url`."""

    remote: str = Field(description="A URL prefix, e.g. 'https://github.com/' or 'git@github.com:'.")
    url: str = Field(description="{path}: the remote URL after the prefix, without '.git'; {sha}: the commit.")

    @field_validator("url")
    @classmethod
    def _template(cls, value: str) -> str:
        return _placeholders(value, {"path", "sha"})


class LinksSection(_Table):
    """``[links]``: web pages for what lockstep records, so the UI's digests and commits are links."""

    image: str | None = Field(
        default=None, description="{registry}, {repository}, {digest}: e.g. a Harbor or GHCR package page."
    )
    commit: list[CommitLink] = Field(default_factory=list)

    @field_validator("image")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else _placeholders(value, {"registry", "repository", "digest"})


class SiteConfig(_Table):
    """The whole site file. Unknown keys are errors: a key in the wrong table must not be ignored."""

    site: SiteSection = Field(default_factory=SiteSection)
    tpu: TpuSection
    registry: RegistrySection = Field(default_factory=RegistrySection)
    iris: IrisSection | None = None
    jovian: JovianSection | None = None
    spark: SparkSection | None = None
    links: LinksSection = Field(default_factory=LinksSection)
    _path: Path = PrivateAttr(default=Path("site.toml"))
    _digest: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _across_tables(self) -> SiteConfig:
        allowed = self.site.url_schemes
        for key, url in self.repository_urls().items():
            if url_scheme(url) not in allowed:
                raise KeyRefused(key, (
                    f"repository URL {redact(url)!r} uses {url_scheme(url)!r}; this site allows "
                    f"{', '.join(allowed)} ([site] url_schemes)"
                ))
        if self.jovian is not None:
            have = [n.name for n in self.spark.nodes] if self.spark else []
            named: list[tuple[tuple[str | int, ...], str]] = []
            if self.jovian.build_node is not None:
                named.append((("jovian", "build_node"), self.jovian.build_node))
            if self.jovian.lane is not None:
                named += [(("jovian", "lane", "nodes", i), n) for i, n in enumerate(self.jovian.lane.nodes)]
            for key, name in named:
                if name not in have:
                    known = f"the [[spark.nodes]] are {', '.join(have)}" if have else "the site has no [[spark.nodes]]"
                    raise KeyRefused(key, f"node {name!r} is not a [[spark.nodes]] name ({known})")
        return self

    def repository_urls(self) -> dict[tuple[str, ...], str]:
        """Every repository URL the site names, by (table, key): what git may be asked to reach."""
        urls = {("tpu", "harbor_repo"): self.tpu.harbor_repo, ("tpu", "consumer_repo"): self.tpu.consumer_repo}
        if self.jovian is not None:
            urls |= {("jovian", "lab_repo"): self.jovian.lab_repo, ("jovian", "build_repo"): self.jovian.build_repo}
        return urls

    @property
    def path(self) -> Path:
        """The file this config was read from."""
        return self._path

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes as read: tells a run whether the file changed since a location loaded."""
        return self._digest

    def resolve_path(self, value: str) -> Path:
        """A path from the site file: relative ones are relative to the file itself."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self._path.parent / p).resolve()

    def owners(self, location: Literal["tpu", "jovian"]) -> list[str]:
        """The owners of a code location's assets: its own table's, else [site] owners."""
        section = self.tpu if location == "tpu" else self.jovian
        own = section.owners if section is not None else None
        return list(own if own is not None else self.site.owners)

    def secret_env_names(self) -> list[str]:
        """Every environment variable the site names as holding a secret."""
        names: list[str] = []
        for section in (self.site, self.tpu, self.registry, *(s for s in (self.iris, self.jovian, self.spark) if s)):
            for field, value in section:
                if field.endswith("_env") and value:
                    names.append(value)
        return names


def _table_name(table: tuple[str, ...]) -> str:
    """`("spark", "nodes", "1")` -> `[[spark.nodes]] #2`, as a person finds it in the file."""
    if table and table[-1].isdigit():
        return f"[[{'.'.join(p for p in table[:-1] if not p.isdigit())}]] #{int(table[-1]) + 1}"
    return f"[{'.'.join(p for p in table if not p.isdigit())}]"


def _line(text: str, loc: tuple[str, ...]) -> int | None:
    """The line of the key at `loc`; failing that (an inline table, a dotted key), of the nearest
    enclosing key or table header that is in the file."""
    for n in range(len(loc), 0, -1):
        table, key = loc[: n - 1], loc[n - 1]
        if (line := key_line(text, table, key)) is not None:
            return line
    return None


def _explain(exc: ValidationError, path: Path, text: str) -> FileFormatError:
    errors = exc.errors()
    # A misspelt key is both unknown and (as the key it should be) missing: name the one in the file.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    raw = list(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, KeyRefused):  # a rule over several keys names the key to fix
        raw += list(cause.key)
    while len(raw) > 1 and isinstance(raw[-1], int):  # an item of a value list: point at the list's key
        raw.pop()
    loc = tuple(str(p) for p in raw)
    msg = redact(err["msg"].removeprefix("Value error, "))
    whole_table = (
        not cause.key
        if isinstance(cause, KeyRefused)
        else isinstance(err.get("input"), dict) and err["type"] not in ("missing", "extra_forbidden")
    )
    if whole_table:
        # A rule over a whole table (a model validator): point at the table's header, not at a key.
        return FileFormatError(path, _line(text, loc) or 1, f"{_table_name(loc) if loc else 'site file'}: {msg}")
    table, key = loc[:-1], loc[-1] if loc else None
    # A key (or table) missing from a table that is not in the file either: the file as a whole, line 1.
    line = _line(text, loc) or 1
    dotted = f"{_table_name(table)} {key}" if table else f"[{key}]" if err["type"] == "missing" else str(key)
    if err["type"] == "extra_forbidden":
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == err["loc"][:-1]]
        close = difflib.get_close_matches(str(key), missing, n=1)
        hint = (
            f" (did you mean {close[0]}?)" if close
            else " (not a key of this table: check the spelling, and that it sits under the right [table] header)"
        )
        if key and _SECRETISH.search(key):
            hint = f" (secrets are never stored in the site file: put the NAME of an environment variable in {key}_env)"
        return FileFormatError(path, line, f"{dotted}: unknown key{hint}")
    if err["type"] == "missing":
        return FileFormatError(path, line, f"{dotted}: required {'key' if table else 'table'} is missing")
    value = err.get("input")
    secretish = key is not None and (key.endswith("_env") or _SECRETISH.search(key) is not None)
    # The name rules and the cross-key rules show the value in their own words.
    says_value = isinstance(cause, NameRefused | KeyRefused)
    shown = "" if secretish or says_value else f" (got {redact(repr(value))})"
    return FileFormatError(path, line, f"{dotted}: {msg}{shown}")


def load_site(path: Path | str | None = None) -> SiteConfig:
    """Read and validate a site file. Errors name the file, the line, the key and what is wrong."""
    site_path = Path(path or os.environ.get(SITE_ENV) or DEFAULT_SITE)
    if not site_path.exists():
        hint = (
            "run `lockstep sandbox up` to create the embedded sandbox"
            if not (path or os.environ.get(SITE_ENV))
            else f"check {SITE_ENV}"
        )
        raise LockstepError(f"{site_path}: no site file here ({hint})")
    raw = site_path.read_bytes()
    text = decode_utf8(raw, site_path)
    data = load_toml(site_path, text)
    try:
        config = SiteConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, site_path, text) from None
    config._path = site_path.resolve()
    config._digest = hashlib.sha256(raw).hexdigest()
    return config


def site_at_load() -> SiteConfig | None:
    """The site file as a code location loads: owners and node pools are part of the definitions.

    No site file yet (a fresh checkout before `lockstep sandbox up`): None, and the runs say what is
    missing when they need the site. A site file that is there but wrong fails the load, naming file
    and line, so a typo cannot quietly drop owners or pools from the definitions.
    """
    explicit = os.environ.get(SITE_ENV)
    if not explicit and not DEFAULT_SITE.exists():
        return None
    return load_site(explicit or None)


def location_owners(site: SiteConfig | None, location: Literal["tpu", "jovian"]) -> list[str]:
    """Owners for a code location's assets from the site read at load time (none without one)."""
    return site.owners(location) if site else []


def with_owners(assets: Sequence[dg.AssetsDefinition], owners: Sequence[str]) -> list[dg.AssetsDefinition]:
    """`assets` with `owners` on every spec (unchanged when there are none)."""
    if not owners:
        return list(assets)
    return list(dg.map_asset_specs(lambda spec: spec.replace_attributes(owners=list(owners)), assets))


class SiteChanged(LockstepError):
    """The site file differs from the one the code location loaded its resources from."""


class SiteResource(dg.ConfigurableResource):
    """The site file, loaded when a run or sensor tick first needs it (never at import time).

    Read once per run (or tick) and kept: every step of a run sees the same site. When the code
    location built its resources (registry, iris, Spark nodes) from the site at load,
    `loaded_digest` is that file's sha256, and a run refuses a file that changed since: the run's
    site and its resources would disagree.
    """

    path: str = Field(default="", description="Site TOML; empty means $LOCKSTEP_SITE or .sandbox/site.toml.")
    loaded_digest: str = Field(
        default="", description="sha256 of the site file when the code location loaded; empty: not checked."
    )

    _cached: SiteConfig | None = PrivateAttr(default=None)
    _cache: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Only an instance initialized for one run or tick keeps what it read.
        self._cache = True

    def config(self) -> SiteConfig:
        """The validated site file (a small local read; no network), read once per run."""
        if self._cached is not None:
            return self._cached
        config = load_site(self.path or None)
        if self.loaded_digest and config.digest != self.loaded_digest:
            raise SiteChanged(
                f"{config.path} changed since this code location loaded it: the registry, iris and node "
                "resources were built from the old file. Reload the code location (UI: Deployment -> "
                "Reload), then run again"
            )
        if self._cache:
            self._cached = config
        return config


def site_resource(site: SiteConfig | None) -> SiteResource:
    """The site resource of a code location: pinned to the file it loaded, when there was one."""
    if site is None:
        return SiteResource()
    return SiteResource(path=str(site.path), loaded_digest=site.digest)


def needs_site(resource: str) -> dg.ResourceDefinition:
    """Stands in for a resource built from the site file when there was none as the location loaded."""

    def missing(_: dg.InitResourceContext) -> None:
        raise LockstepError(
            f"resource {resource!r} is built from the site file when the code location loads, and there was "
            f"none (${SITE_ENV} unset and no {DEFAULT_SITE}): run `lockstep sandbox up` or set {SITE_ENV}, "
            "then reload the code location"
        )

    return dg.ResourceDefinition(resource_fn=missing, description=f"{resource}: needs a site file at load")
