"""The site file's ``[jovian]`` tables: the lab's locks,
the build repo and its lineages, boot gates, the lane.

SiteConfig (resources/site/schema.py) holds a `JovianSection`: the jovian code location's table.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator, model_validator

from resources.names import check_name, check_relative_path
from resources.site.fields import (
    Branch,
    LocationSection,
    NodeName,
    Owners,
    PackageName,
    RepoUrl,
    Table,
    checked,
    placeholders,
)
from resources.site.rules import KeyRefused, check_env_key, check_local_image_tag, refuse

DEFAULT_VERSIONS_KEYS = {
    "vllm.commit": "VLLM_COMMIT",
    "vllm.tree": "VLLM_TREE",
    "vllm.version": "VLLM_PRETEND_VERSION",
    "b12x.commit": "B12X_COMMIT",
    "b12x.tree": "B12X_TREE",
    "lmcache.commit": "LMCACHE_COMMIT",
    "lmcache.tree": "LMCACHE_TREE",
    "lmcache.version": "LMCACHE_PRETEND_VERSION",
}


# A rev's fork can come from another owner (one lab rev's b12x did): its URL follows the commit into
# the profile, but only where versions.env pins repository URLs at all.
DEFAULT_REPOSITORY_KEYS = {
    "vllm.repository": "VLLM_REPO",
    "b12x.repository": "B12X_REPO",
    "lmcache.repository": "LMCACHE_REPO",
}


def rev_order(rev: str) -> tuple[str | int, ...]:
    """How the lab's revs order: digit runs compare as numbers (r2 < r10 < r39), the rest as text.

    `re.split` with a capturing group alternates text and digit runs, so every position of two keys
    holds the same type and any two revs compare."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", rev)))


class Lineage(Table):
    """``[[jovian.lineages]]``: from `from_rev` on, revs build from `dir` (its own versions.env,
    fetch-deps.sh gate list and profiles/), e.g. the
    runbook's r39 split into jovian-judgement-r39/."""

    dir: Annotated[str, checked(check_relative_path, "lineage dir")] = Field(
        description="In the build repo."
    )
    from_rev: Annotated[str, checked(check_name, "lineage from_rev")] = Field(
        description="The first rev of the lineage."
    )


class JovianSection(LocationSection):
    """``[jovian]``: the lab's source locks, the engine
    forks they pin, and the build repo that adopts them."""

    REPOSITORY_KEYS: ClassVar[tuple[str, ...]] = ("lab_repo", "build_repo")

    lab_repo: RepoUrl
    lab_branch: Branch = "master"
    lock_glob: str = Field(
        default="models/glm-5.3-flash/**/*.source.lock", description="Source locks in the lab repo."
    )
    build_repo: RepoUrl = Field(description="The docker-images repo.")
    build_branch: Branch = "main"
    build_dir: Annotated[str, checked(check_relative_path, "build_dir")] = Field(
        default="jovian-judgement",
        description="In the build repo: versions.env, fetch-deps.sh, profiles/.",
    )
    recipes_glob: str = Field(
        default="recipes/*/recipe.toml", description="Recipe TOML files in the build repo."
    )
    packages: list[PackageName] = Field(
        default_factory=lambda: ["vllm", "b12x", "lmcache"],
        description="Engine forks audited as one cut.",
    )
    integration_branches: dict[str, str] = Field(
        default_factory=lambda: {"vllm": "integration/*", "b12x": "integration/*", "lmcache": "*"},
        description=(
            "Per package, a glob of the fork's integration branch names (ls-remote pattern)."
        ),
    )
    cut_window_minutes: float = Field(
        default=30.0, gt=0, description="All pins of one rev are cut within this window."
    )
    versions_keys: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_VERSIONS_KEYS),
        description="Source-lock key -> versions.env key.",
    )
    repository_keys: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_REPOSITORY_KEYS),
        description=(
            "Source-lock repository key -> versions.env key; applied only where versions.env "
            "has that key."
        ),
    )
    cmake_package: PackageName = Field(
        default="vllm", description="The package whose tree declares the cmake deps."
    )
    build_node: NodeName | None = Field(
        default=None, description="The [[spark.nodes]] name that builds images."
    )
    image_tag: str = Field(
        default="jovian-judgement:{rev}-glm53", description="Image tag; {rev} is the lab rev."
    )
    build_command: list[str] = Field(
        default_factory=lambda: ["bash", "build.sh"],
        description="Run in the shipped build dir with TAG and PROFILE set.",
    )
    build_timeout_s: float = Field(default=4 * 3600.0, gt=0)
    poll_s: float = Field(default=30.0, gt=0)
    boot_gates: list[BootGate] = Field(default_factory=lambda: list(DEFAULT_BOOT_GATES))
    lane: LaneSection | None = None
    distribute: str = Field(
        default="star",
        description="star: lockstep streams to every lane node; relay: to the first, each node "
        "forwards to the next with its own ssh (its [[spark.nodes]] relay_key / "
        "relay_known_hosts).",
    )
    lineages: list[Lineage] = Field(
        default_factory=list,
        description="Build dirs by rev: a rev before every lineage builds from build_dir.",
    )
    owners: Owners | None = Field(
        default=None, description="Owners of the jovian assets; unset: [site] owners."
    )

    @model_validator(mode="after")
    def _one_lineage_per_rev(self) -> JovianSection:
        seen: dict[tuple[str | int, ...], Lineage] = {}
        problems: list[KeyRefused] = []
        for i, lineage in enumerate(self.lineages):
            key = rev_order(lineage.from_rev)
            if key in seen:
                problems.append(
                    KeyRefused(
                        ("lineages", i, "from_rev"),
                        (
                            f"from_rev {lineage.from_rev!r} already starts lineage "
                            f"{seen[key].dir!r}: one rev cannot build "
                            "from two dirs; give each lineage its own first rev"
                        ),
                    )
                )
            else:
                seen[key] = lineage
        refuse(problems)
        return self

    def build_dir_for(self, rev: str) -> str:
        """The build dir of `rev`: the lineage with the
        latest `from_rev` at or before it, else build_dir."""
        started = [lin for lin in self.lineages if rev_order(lin.from_rev) <= rev_order(rev)]
        return (
            max(started, key=lambda lin: rev_order(lin.from_rev)).dir if started else self.build_dir
        )

    @field_validator("distribute")
    @classmethod
    def _distribute(cls, value: str) -> str:
        if value not in ("star", "relay"):
            raise ValueError(
                f'{value!r} is not a distribution mode: "star" (the default) or "relay"'
            )
        return value

    @field_validator("versions_keys", "repository_keys")
    @classmethod
    def _env_keys(cls, value: dict[str, str]) -> dict[str, str]:
        # The values become `KEY=...` lines of versions.env and of every profile lockstep writes.
        return {k: check_env_key("versions.env key", v) for k, v in value.items()}

    @field_validator("image_tag")
    @classmethod
    def _image_tag(cls, value: str) -> str:
        placeholders(value, {"rev"})
        # A rev is a plain name (names.check_name), so
        # any tag that is valid for one is valid for all.
        check_local_image_tag(
            "image_tag", value.replace("{rev}", "r35"), shown=f"{value!r} (for rev r35)"
        )
        return value


class BootGate(Table):
    """A boot gate: `docker run --rm --network none IMG
    python -c CODE` on the build node; exit 0 and, when given,
    `expect` (a regex; `{vllm_version}`, `{rev}` and
    `{<pkg>_commit8}` are filled from the lock) in stdout."""

    name: str
    code: str
    expect: str | None = None


# patch_cuda_sm12x.py + the eugr set, in the order they run (runbook: GB10 adaptation deltas).
SM12X_PATCHES = (
    "preserve_sm12x_target",
    "sm120_cooperative_topk",
    "spark_kv_cache_cleanup",
    "b12x_c128a_alignment",
    "flashinfer_swigluoai",
    "speculator_cudagraph_pool",
    "routed_expert_weight_shape",
)

# What each patch of the set leaves in the installed vLLM
# package: (file under vllm/, a regex of the patched line).
SM12X_PATCH_EFFECTS = {
    "spark_kv_cache_cleanup": ("config/cache.py", r"MemFree"),
    "b12x_c128a_alignment": (
        "model_executor/layers/fused_moe/__init__.py",
        r"c128a|ALIGNMENT\s*=\s*128\b",
    ),
    "flashinfer_swigluoai": ("model_executor/layers/fused_moe/__init__.py", r"swigluoai"),
    "speculator_cudagraph_pool": ("config/__init__.py", r"cudagraph_pool"),
    "routed_expert_weight_shape": ("model_executor/models/__init__.py", r"routed_expert"),
}

DEFAULT_BOOT_GATES = [
    BootGate(
        name="vllm_import_carries_pin",
        code="import vllm; print(vllm.__version__)",
        expect=r"^{vllm_version}$",
    ),
    BootGate(name="b12x_import", code="import b12x; print(b12x.__name__)"),
    BootGate(
        name="lmcache_native",
        code=(
            "import lmcache, lmcache.cuda_ops, lmcache.lmcache_native, lmcache.lmcache_fs; "
            "print('ok')"
        ),
    ),
    BootGate(name="flashkda_extension", code="import vllm._flashkda_C; print('ok')"),
    BootGate(
        name="b12x_enum_resolves",
        code=(
            "from vllm.model_executor.layers.fused_moe import MoEBackend; "
            "print(MoEBackend['B12X'].value)"
        ),
        expect=r"^b12x$",
    ),
    BootGate(
        name="nvfp4_ds_mla_present",
        code="import pathlib, vllm; t = (pathlib.Path(vllm.__file__).parent / 'config' / "
        "'cache.py').read_text(); "
        "assert 'nvfp4_ds_mla' in t, 'nvfp4_ds_mla missing from vllm/config/cache.py'; print('ok')",
    ),
    # GB10 (runbook: GB10 adaptation deltas). No GPU at gate time, so not torch.cuda: what the
    # kernels were really compiled for, read off every built extension with `cuobjdump --list-elf`
    # (the CUDA devel base the runner stage comes from has it). It shows 12.1a silently collapsed to
    # sm_120 where the build args say 12.1a.
    BootGate(
        name="cuda_arch_sm121a",
        code=(
            "import pathlib, re, subprocess, vllm, lmcache\n"
            "for m in (vllm, lmcache):\n"
            "    d = pathlib.Path(m.__file__).parent\n"
            "    sos = sorted(str(p) for p in d.rglob('*.so'))\n"
            "    assert sos, m.__name__ + ' has no compiled extension (*.so) under ' + str(d)\n"
            "    a = set()\n"
            "    for so in sos:\n"
            "        out = subprocess.run(['cuobjdump', '--list-elf', so], capture_output=True, "
            "text=True).stdout\n"
            "        a |= set(re.findall(r'[.](sm_[0-9]+[af]?)[.]cubin', out))\n"
            "    assert 'sm_121a' in a, (m.__name__ + ' kernels are compiled for ' + (' "
            "'.join(sorted(a)) or 'nothing') + ', not sm_121a '\n"
            "                            '(TORCH_CUDA_ARCH_LIST=12.1a collapses to 12.0 without "
            "preserve_sm12x_target)')\n"
            "    print(m.__name__, ' '.join(sorted(a)))\n"
        ),
    ),
    # The patch set by its effect in the installed vLLM source (the patches record nothing): the
    # line each patch of the set leaves in the file it rewrites. preserve_sm12x_target shows in the
    # compiled kernels (cuda_arch_sm121a); sm120_cooperative_topk changes
    # only CUDA sources, which an image does not carry.
    BootGate(
        name="sm12x_patch_set_applied",
        code=(
            "import pathlib, re, vllm\n"
            "d = pathlib.Path(vllm.__file__).parent\n"
            f"effects = {SM12X_PATCH_EFFECTS!r}\n"
            "missing = []\n"
            "for name, (rel, pattern) in effects.items():\n"
            "    f = d / rel\n"
            "    if not (f.is_file() and re.search(pattern, f.read_text(encoding='utf-8'), "
            "re.M)):\n"
            "        missing.append(name + ' (vllm/' + rel + ')')\n"
            "assert not missing, 'the sm12x patch set did not run in full: no effect of ' + ', "
            "'.join(missing)\n"
            "print(' '.join(effects))\n"
        ),
    ),
]


class LaneSection(Table):
    """``[jovian.lane]``: the nodes that serve a rev, and the bench that gates it."""

    name: Annotated[str, checked(check_name, "lane name")] = "glm53-2x"
    nodes: list[NodeName]
    bench_quality: list[str] = Field(
        default_factory=lambda: [
            "tool-eval-bench",
            "run",
            "--hardmode",
            "--seed",
            "{seed}",
            "--base-url",
            "{base_url}",
            "--model",
            "{model}",
            "--no-live",
            "--json-file",
            "{out}",
        ],
        description="The quality run on the bench node, an argv list: {base_url}, {model} (the "
        "served endpoint), "
        "{seed}, {out} (where it writes its --json-file result, which lockstep reads).",
    )
    bench_perf: list[str] = Field(
        default_factory=lambda: [
            "llama-benchy",
            "--base-url",
            "{base_url}/v1",
            "--model",
            "{model}",
            "--pp",
            "2048",
            "--tg",
            "128",
            "--concurrency",
            "1",
            "2",
            "--format",
            "json",
            "--save-result",
            "{out}",
        ],
        description=(
            "The perf run (llama-benchy, pp/tg at each concurrency), same placeholders; {out} "
            "gets its JSON."
        ),
    )
    seed: int = Field(
        default=42, description="The quality run's fixed seed (runbook: seeds fixed, 42)."
    )
    tolerance: float = Field(
        default=1.0, ge=0, description="How far under the recorded baseline run a score may fall."
    )
    bench_timeout_s: float = Field(default=7200.0, gt=0)
    # Booting a rev on the lane (jovian/lane_serving). One container per lane node; the head
    # (nodes[0]) serves the endpoint, the others run as
    # workers (`worker_args` appended) and bind nothing.
    serve_command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SERVE_COMMAND),
        description=(
            "The recipe's serve argv after IMAGE; {tag} {model} {port} {rank} {nnodes} {head} "
            "are filled in."
        ),
    )
    worker_args: list[str] = Field(
        default_factory=lambda: ["--headless"],
        description="Appended to serve_command on every lane node but the head.",
    )
    serve_variables: dict[str, str] | None = Field(
        default=None, description="`-e K=V` for the serving container."
    )
    serve_port: int = Field(
        default=8000, gt=0, lt=65536, description="The head's endpoint port (on the head node)."
    )
    gpus: Annotated[
        str, Field(pattern=r"^(|all|[1-9][0-9]{0,2}|device=[0-9]{1,3}(,[0-9]{1,3})*)$")
    ] = Field(
        default="all",
        description='`docker run --gpus` for the serving container; "" for nodes without a GPU '
        "runtime (the sandbox's), where docker would refuse the flag.",
    )
    served_model: Annotated[str, checked(check_name, "served model name")] = Field(
        default="glm-5.3-flash", description="The name `/v1/models` lists (`--served-model-name`)."
    )
    ready_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_READY_PATTERNS),
        description=(
            "Regexes the head container's log must show, in this order, before the endpoint is "
            "asked."
        ),
    )
    jit_cache_dir: str = Field(
        default="~/sm121-cache/jit-121f",
        description="The node's JIT cache: populated = a warm start, empty = cold.",
    )
    jit_cache_mount: str = Field(
        default="/root/.cache/jit-121f", description="Where the container sees it."
    )
    warm_budget_s: float = Field(
        default=20 * 60.0,
        gt=0,
        description="Readiness budget when every JIT cache is warm (~9 min).",
    )
    cold_budget_s: float = Field(
        default=75 * 60.0, gt=0, description="Readiness budget when a JIT cache is empty (~45 min)."
    )
    serve_poll_s: float = Field(
        default=10.0, gt=0, description="Seconds between looks at the container's state and log."
    )

    @field_validator("serve_command")
    @classmethod
    def _serve_command(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('is empty: give the recipe\'s serve argv, e.g. ["vllm", "serve", ...]')
        used: set[str] = set()
        for word in value:
            placeholders(word, set(SERVE_PLACEHOLDERS))
            used |= {f for _, f, _, _ in string.Formatter().parse(word) if f is not None}
        if missing := {"port", "model"} - used:
            raise ValueError(
                f"never uses {', '.join('{' + m + '}' for m in sorted(missing))}: the endpoint "
                "check "
                "asks serve_port for served_model, so the command must serve them"
            )
        if "{" in value[0]:
            raise ValueError(
                f"starts with {value[0]!r}: the program must be a fixed word, not a placeholder"
            )
        return value

    @field_validator("worker_args")
    @classmethod
    def _worker_args(cls, value: list[str]) -> list[str]:
        for word in value:
            placeholders(word, set(SERVE_PLACEHOLDERS))
        return value

    @field_validator("serve_variables")
    @classmethod
    def _serve_variables(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return (
            None
            if value is None
            else {check_env_key("serve_variables key", k): v for k, v in value.items()}
        )

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
        # Plain parts only: the path becomes one side of
        # `docker run -v SRC:DST`, where ':' and ',' split.
        home = info.field_name == "jit_cache_dir" and value.startswith("~/")
        if not (home or value.startswith("/")):
            where = (
                "absolute or start with ~/ (the node user's home)"
                if info.field_name == "jit_cache_dir"
                else ("an absolute path inside the container")
            )
            raise ValueError(f"{value!r} must be {where}")
        parts = (value[2:] if home else value.lstrip("/")).split("/")
        if any(p in ("", ".", "..") or not re.fullmatch(r"[A-Za-z0-9._-]+", p) for p in parts):
            raise ValueError(
                f"{value!r}: each part must be a plain name (letters, digits, '.', '_', '-'; no "
                "'..', "
                "no empty part)"
            )
        return value

    @model_validator(mode="after")
    def _budgets(self) -> LaneSection:
        if self.cold_budget_s < self.warm_budget_s:
            raise KeyRefused(
                ("cold_budget_s",),
                f"cold_budget_s {self.cold_budget_s:g} is under warm_budget_s "
                f"{self.warm_budget_s:g}: an empty JIT cache takes longer (~45 vs ~9 min)",
            )
        return self

    @field_validator("bench_quality", "bench_perf")
    @classmethod
    def _bench_command(cls, argv: list[str]) -> list[str]:
        if not argv or not argv[0] or argv[0].startswith("-") or "{" in argv[0]:
            raise ValueError(
                'must be an argv list whose first word is the tool, e.g. ["tool-eval-bench", '
                '"run", ...]'
            )
        for word in argv:
            placeholders(word, set(BENCH_PLACEHOLDERS))
        if not any("{out}" in word for word in argv):
            raise ValueError(
                "needs {out}: the file the tool writes its JSON result to, which lockstep reads "
                "back"
            )
        return argv


# What {placeholders} a serve argv may use: the image tag, the served model name, the endpoint port,
# this node's rank in the lane (0 = head), the lane's node count and the head's host.
SERVE_PLACEHOLDERS = ("tag", "model", "port", "rank", "nnodes", "head")
DEFAULT_SERVE_COMMAND = (
    "vllm",
    "serve",
    "/models/glm-5.3-flash",
    "--served-model-name",
    "{model}",
    "--host",
    "0.0.0.0",
    "--port",
    "{port}",
    "--tensor-parallel-size",
    "{nnodes}",
    "--nnodes",
    "{nnodes}",
    "--node-rank",
    "{rank}",
    "--master-addr",
    "{head}",
)
# The runbook's serve readiness: the KV-size line ~10 min in, application startup ~5 min after.
DEFAULT_READY_PATTERNS = (r"GPU KV cache size: ([\d,]+) tokens", r"Application startup complete")

BENCH_PLACEHOLDERS = ("base_url", "model", "seed", "out")
