"""What the Jovian assets record, as pydantic models
(pickled by the IO manager, shown as metadata)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from jovian_assets.source_lock import SourceLock
from resources.model import Model


class Finding(Model):
    """The outcome of one audit, ready to become an asset check result."""

    passed: bool
    description: str


class AdoptedLock(Model):
    """`jovian/source_lock`: a rev's lock as the lab published it, and where it was read."""

    rev: str
    lab_commit: str
    path: str
    blob: str
    lock: SourceLock


class BranchCommit(Model):
    sha: str
    committed_at: datetime
    summary: str


class BranchTip(Model):
    name: str
    tip: str
    ahead: int  # commits on the branch after the pin
    behind: int  # commits at the pin that the branch does not have
    # For a pin unchanged since the previous rev: the branch's commits after the pin, up to the end
    # of this rev's cut window (what a same-moment cut would have taken). Empty otherwise.
    commits: list[BranchCommit] = Field(default_factory=list)


class PackageCut(Model):
    name: str
    repository: str
    commit: str
    lock_tree: str
    # `git rev-parse <commit>^{tree}`, None when the pin could not be fetched
    tree: str | None = None
    error: str | None = None
    committed_at: datetime | None = None
    branches: list[BranchTip] = Field(default_factory=list)
    # this package's pin in the previous rev's lock; None: no such pin
    previous_commit: str | None = None


class HeldPin(Model):
    """A pin left unchanged since the previous rev
    while its fork had nothing in this rev's cut window:
    held on purpose (the runbook's r39 holds LMCache at 29bc5a2e), reported, not failed."""

    package: str
    commit: str
    since_rev: str
    # e.g. "lmcache held at 29bc5a2e (unchanged since r38;
    # no integration commits within the r39 cut window)"
    description: str


class ForkCut(Model):
    """`jovian/fork_cut`: the fork set as one cut (runbook 'Adopting a new lab rev', step 2)."""

    rev: str
    window_minutes: float
    packages: list[PackageCut]
    # the lab's preceding rev, whose lock tells a held pin from a moved one
    previous_rev: str | None = None
    holds: list[HeldPin] = Field(default_factory=list)


class ProfileDiff(Model):
    key: str
    base: str | None  # versions.env
    profile: str


class BuildProfile(Model):
    """`jovian/build_profile`: profiles/<rev>.env in the build repo."""

    rev: str
    # the rev's lineage dir ([[jovian.lineages]], else [jovian] build_dir): what the build ships
    build_dir: str
    path: str
    text: str
    diff: list[ProfileDiff]
    unknown_keys: list[str]
    build_commit: str
    pushed: bool


class DepRow(Model):
    """One GIT_REPOSITORY/GIT_TAG pin declared by the tree, under one condition."""

    name: str
    repository: str | None = None
    tag: str | None = None
    # GIT_SUBMODULES: the gitlinks that must be populated
    submodules: list[str] = Field(default_factory=list)
    # enclosing if()/elseif()/else() conditions joined with ' AND '; None at top level
    condition: str | None = None
    file: str  # relative to the tree root
    line: int  # line of the FetchContent_Declare / FetchContent_Populate
    # `$ENV{X_SRC_DIR}` or `X_SRC_DIR`: replaces the download when set
    source_dir_override: str | None = None
    # variables left as ${...} in repository/tag/submodules
    unresolved: list[str] = Field(default_factory=list)
    # those of `unresolved` whose only set() refers to itself
    recursive: list[str] = Field(default_factory=list)
    kind: Literal["declare", "populate"] = "declare"


class DepTree(Model):
    name: str
    repository: str
    tag: str
    commit: str | None
    path: str | None
    bytes_fetched: int = 0
    bytes_reused: int = 0
    gitlinks: dict[str, str] = Field(default_factory=dict)  # path in the tree -> commit
    error: str | None = None


class DepTrees(Model):
    rev: str
    root: str
    trees: list[DepTree]


class ServedImage(Model):
    """What a lane serves: the running container's image as `docker inspect` reports it."""

    rev: str | None  # None when the lane served an image lockstep did not boot
    tag: str
    image_id: str
    container: str


class LaneServing(Model):
    """`jovian/lane_serving`: a rev's image booted on
    the lane, serving, and proven to be the built image.

    The bench targets `base_url` on `bench_node` (the
    endpoint is local to that node); the report names
    `image_id`. If the quality gate fails, the lane goes back to `previous`."""

    rev: str
    lane: str
    tag: str
    image_id: str  # of the running container, equal to jovian/distributed_image's
    nodes: dict[str, str]  # lane node -> image ID of the container running there
    bench_node: str
    base_url: str  # e.g. http://127.0.0.1:8000, as seen from bench_node
    model: str  # the name `/v1/models` lists
    container: str
    warm: bool  # the node's JIT cache was populated before this start
    # readiness mark -> seconds after the start
    seconds_to: dict[str, float] = Field(default_factory=dict)
    previous: ServedImage | None = None
    # lane node -> its JIT cache held files before the start
    jit_warm: dict[str, bool] = Field(default_factory=dict)
    budget_s: float | None = None  # the readiness budget it had (warm or cold)
