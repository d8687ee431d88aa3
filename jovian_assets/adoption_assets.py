"""The rev-adoption assets, all partitioned by `lab_revs`:
lock -> fork cut -> profile -> dep table -> dep trees.

The cmake parser (`dep_table`), the GB10 rules (`gb10`), the profile writer and the tree fetcher are
imported by the bodies that use them: every process that loads the location (code server, run
worker, sensor tick) pays for what it imports, and only a run of these assets needs them
(docs/PERFORMANCE.md, code-location load).
"""

from pathlib import Path

import dagster as dg

from jovian_assets.asset_results import (
    AdoptionRefused,
    check_result,
    jovian_of,
    rev_of,
    string_table,
)
from jovian_assets.fork_cut import (
    audit_package,
    collect_commits_after,
    findings,
    fork_changelogs,
    holds,
    previous_lock,
    spread_minutes,
)
from jovian_assets.inputs import inside, path_under, read_text
from jovian_assets.keys import (
    BUILD_PROFILE,
    CMAKE_PINS_RESOLVED,
    CUDA_PINS_GATED,
    DEP_TABLE,
    DEP_TREES,
    FORK_CUT,
    GB10_DEVIATIONS_CURRENT,
    GITLINKS_POPULATED,
    NEWER_CUT,
    ONE_CUT,
    PINS_REACHABLE,
    PROFILE_KEYS_KNOWN,
    RECIPES_NO_SCATTERED_PINS,
    RECIPES_TOP_LEVEL,
    SOURCE_LOCK,
    TREES_MATCH,
)
from jovian_assets.models import (
    AdoptedLock,
    BuildProfile,
    DepRow,
    DepTrees,
    Finding,
    ForkCut,
    HeldPin,
)
from jovian_assets.partitions import lab_revs
from jovian_assets.revs import LAB_COMMIT_TAG, find_rev_lock
from resources.atomic import write_atomic
from resources.errors import FileFormatError, LockstepError
from resources.git import SHA_RE, GitRemotes, glob_match
from resources.links import commit_entries
from resources.secrets import redact
from resources.site.resource import SiteResource


@dg.asset(
    key=SOURCE_LOCK,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"git"},
    code_version="1",
    description=(
        "The rev's `<rev>.source.lock` as the lab published it (format "
        "local-inference-source-lock/v1), "
        "parsed at the lab commit the sensor saw: packages with repository, commit, tree, "
        "package tree, "
        "bundle sha256 and version; every other key kept verbatim. Abbreviated shas and branch "
        "names are errors."
    ),
)
def source_lock(
    context: dg.AssetExecutionContext, site: SiteResource, git: GitRemotes
) -> dg.Output[AdoptedLock]:
    jovian = jovian_of(site)
    lab_commit = context.run.tags.get(LAB_COMMIT_TAG) or git.ls_remote(
        url=jovian.lab_repo, branch=jovian.lab_branch
    )
    if lab_commit is None:
        raise AdoptionRefused(
            f"branch {jovian.lab_branch} does not exist on {redact(jovian.lab_repo)}"
        )
    if not SHA_RE.fullmatch(lab_commit):
        raise AdoptionRefused(
            f"run tag {LAB_COMMIT_TAG}={lab_commit!r} is not a full commit sha; nothing was read"
        )
    adopted = find_rev_lock(git, jovian, lab_commit=lab_commit, rev=context.partition_key)
    lock = adopted.lock
    return dg.Output(
        adopted,
        metadata={
            "rev": dg.MetadataValue.text(adopted.rev),
            **commit_entries(site.config().links, "lab_commit", jovian.lab_repo, lab_commit),
            "lock": dg.MetadataValue.text(f"{adopted.path} (blob {adopted.blob[:12]})"),
            "release": dg.MetadataValue.text(lock.release_name or ""),
            "packages": string_table(
                [
                    {
                        "package": p.name,
                        "repository": p.repository,
                        "commit": p.commit,
                        "tree": p.tree,
                        "version": p.version,
                    }
                    for p in lock.packages.values()
                ],
                ["package", "repository", "commit", "tree", "version"],
            ),
            "keys": dg.MetadataValue.int(len(lock.keys)),
        },
    )


@dg.asset(
    key=FORK_CUT,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"git"},
    code_version="2",
    check_specs=[
        dg.AssetCheckSpec(
            PINS_REACHABLE,
            asset=FORK_CUT,
            blocking=True,
            description="Every pinned commit fetches by exact sha.",
        ),
        dg.AssetCheckSpec(
            TREES_MATCH,
            asset=FORK_CUT,
            blocking=True,
            description="`git rev-parse <commit>^{tree}` equals the lock's tree for every package.",
        ),
        dg.AssetCheckSpec(
            ONE_CUT,
            asset=FORK_CUT,
            blocking=True,
            description="The moved pins lie within the cut window of each other, and a pin "
            "unchanged since the previous "
            "rev is a hold only when its fork had no commits in that window: a half-cut set "
            "fails with the spread "
            "or the commits a left-behind fork skipped; a hold is reported.",
        ),
        dg.AssetCheckSpec(
            NEWER_CUT,
            asset=FORK_CUT,
            description="WARN when an integration branch has commits after its pin.",
        ),
    ],
    description=(
        "The fork set audited as ONE cut: for each engine package the pin is fetched through the "
        "shared "
        "object cache, its tree compared with the lock's, its commit time read, and each "
        "integration "
        "branch's tip compared (ahead/behind). A pin unchanged since the lab's previous rev is a "
        "hold (reported) "
        "when its fork had no commits within the cut window of the moved pins. A half-cut rev "
        "(vLLM advanced, "
        "b12x/LMCache left behind while their branches were cut) fails `one_cut` and nothing "
        "downstream runs. "
        "`changelog` lists each fork's commits between the previous rev's pin and this rev's."
    ),
)
def fork_cut(
    context: dg.AssetExecutionContext, site: SiteResource, git: GitRemotes, source_lock: AdoptedLock
):
    from resources.changelog import changelog_metadata

    jovian = jovian_of(site)
    lock = source_lock.lock
    missing = [p for p in jovian.packages if p not in lock.packages]
    if missing:
        raise AdoptionRefused(
            f"{source_lock.path}: no {', '.join(missing)} package (site [jovian].packages); "
            "nothing was adopted"
        )
    try:
        before = previous_lock(git, jovian, source_lock)
    # no hold can be shown then: every pin is judged as part of the cut
    except LockstepError as exc:
        context.log.warning(
            f"the previous rev's lock could not be read, so no pin counts as held: {exc}"
        )
        before = None
    earlier = before.lock.packages if before is not None else {}
    cut = ForkCut(
        rev=source_lock.rev,
        window_minutes=jovian.cut_window_minutes,
        previous_rev=before.rev if before is not None else None,
        packages=[
            audit_package(
                git,
                lock.packages[name],
                jovian.integration_branches.get(name, "*"),
                earlier.get(name),
            )
            for name in jovian.packages
        ],
    )
    urls = {name: lock.packages[name].repository for name in jovian.packages}
    collect_commits_after(git, cut, urls)
    cut.holds = holds(cut)
    results = findings(cut)
    spread = spread_minutes(cut)
    for held in cut.holds:
        context.log.info(held.description)
    yield dg.Output(
        cut,
        metadata={
            "spread_minutes": dg.MetadataValue.float(
                round(spread, 1) if spread is not None else -1.0
            ),
            "window_minutes": dg.MetadataValue.float(cut.window_minutes),
            "previous_rev": dg.MetadataValue.text(
                cut.previous_rev or "(none: every pin is part of the cut)"
            ),
            "holds": _holds_table(cut.holds),
            "pins": string_table(
                [
                    {
                        "package": p.name,
                        "commit": p.commit,
                        "committed_at": p.committed_at.isoformat() if p.committed_at else "",
                        "tree ok": str(p.tree == p.lock_tree),
                        "error": p.error or "",
                    }
                    for p in cut.packages
                ],
                ["package", "commit", "committed_at", "tree ok", "error"],
            ),
            "branches": string_table(
                [
                    {
                        "package": p.name,
                        "branch": b.name,
                        "tip": b.tip[:12],
                        "ahead": b.ahead,
                        "behind": b.behind,
                    }
                    for p in cut.packages
                    for b in p.branches
                ],
                ["package", "branch", "tip", "ahead", "behind"],
            ),
            **changelog_metadata(fork_changelogs(git, cut, urls)),
        },
    )
    for name, finding in results.items():
        severity = dg.AssetCheckSeverity.WARN if name == NEWER_CUT else dg.AssetCheckSeverity.ERROR
        extra = {"holds": _holds_table(cut.holds)} if name == ONE_CUT else None
        yield check_result(FORK_CUT, name, finding, severity, extra)


def _holds_table(held: list[HeldPin]) -> dg.MetadataValue:
    return string_table(
        [
            {"package": h.package, "commit": h.commit, "since": h.since_rev, "hold": h.description}
            for h in held
        ],
        ["package", "commit", "since", "hold"],
    )


@dg.asset(
    key=BUILD_PROFILE,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"git"},
    code_version="2",
    check_specs=[
        dg.AssetCheckSpec(
            PROFILE_KEYS_KNOWN,
            asset=BUILD_PROFILE,
            blocking=True,
            description=(
                "Every profile key exists in versions.env (a typo is an error, not a silent "
                "extra key)."
            ),
        ),
        dg.AssetCheckSpec(
            RECIPES_TOP_LEVEL,
            asset=BUILD_PROFILE,
            blocking=True,
            description=(
                "Every recipe that names build_profile has it as a TOP-LEVEL key, as tomllib "
                "reads it."
            ),
        ),
        dg.AssetCheckSpec(
            RECIPES_NO_SCATTERED_PINS,
            asset=BUILD_PROFILE,
            description="WARN when a recipe's own [build.versions] sets a pin key of the profile "
            "(scattered "
            "per-recipe pins), naming the recipe file, line and keys.",
        ),
        dg.AssetCheckSpec(
            GB10_DEVIATIONS_CURRENT,
            asset=BUILD_PROFILE,
            description="WARN when the vLLM tree's requirements/cuda.txt runtime pins (CUDA, "
            "torch, flashinfer, "
            "NCCL) moved since the build dir's gb10-deviations.toml was written: re-evaluate the "
            "GB10 deviations.",
        ),
    ],
    description=(
        "`<lineage dir>/profiles/<rev>.env` in the build repo (the rev's `[[jovian.lineages]]` "
        "dir, else "
        "`[jovian] build_dir`): KEY=VAL for every pin that differs from that dir's versions.env "
        "(source shas, "
        "trees, pretend versions), the whole set at once, held pins named in a comment, "
        "committed and pushed "
        "fast-forward only. Nothing is written when a key is unknown."
    ),
)
def build_profile(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    git: GitRemotes,
    source_lock: AdoptedLock,
    fork_cut: ForkCut,
):
    from jovian_assets import gb10
    from jovian_assets.profile import parse_env, plan_profile, recipe_finding, render_profile

    jovian = jovian_of(site)
    author = site.config().site.commit_author
    rev = rev_of(context)
    if source_lock.rev != rev:
        raise AdoptionRefused(
            f"{source_lock.path} is release.version={source_lock.rev!r}, not the run's rev {rev!r}"
        )
    lineage = jovian.build_dir_for(rev)
    rel = f"{lineage}/profiles/{rev}.env"
    with git.checkout(url=jovian.build_repo, branch=jovian.build_branch) as wt:
        versions_path = f"{lineage}/versions.env"
        versions_file = inside(wt.path, versions_path)
        if not versions_file.is_file():
            raise AdoptionRefused(
                f"{versions_path} is not in {redact(jovian.build_repo)} ({jovian.build_branch}): "
                f"rev {rev} "
                f"builds from {lineage!r} ([[jovian.lineages]] / [jovian] build_dir); create "
                "that dir first"
            )
        versions = parse_env(read_text(versions_file, versions_path), versions_path)
        diff, unknown = plan_profile(
            source_lock.lock, versions, jovian.versions_keys, jovian.repository_keys
        )
        text = render_profile(
            rev=rev,
            lab_commit=source_lock.lab_commit,
            lock_path=source_lock.path,
            diff=diff,
            holds=[h.description for h in fork_cut.holds],
        )
        recipes = {
            p: recipe_finding(wt.path, p)
            for p in sorted(
                str(f.relative_to(wt.path))
                for f in wt.path.rglob("*.toml")
                if glob_match(jovian.recipes_glob, str(f.relative_to(wt.path)))
            )
        }
        pin_keys = {
            *jovian.versions_keys.values(),
            *jovian.repository_keys.values(),
            *(d.key for d in diff),
        }
        scattered = {p: _scattered_finding(wt.path, p, pin_keys) for p in recipes}
        deviations_rel = f"{lineage}/{gb10.DEVIATIONS_FILE}"
        deviations_file = inside(wt.path, lineage, gb10.DEVIATIONS_FILE)
        deviations_text = (
            read_text(deviations_file, deviations_rel) if deviations_file.is_file() else None
        )
        target = inside(wt.path, lineage, "profiles", f"{rev}.env")
        pushed, commit = False, wt.base_sha
        if not unknown and (not target.exists() or target.read_text(encoding="utf-8") != text):
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, text)
            git.commit_all(
                worktree=wt,
                message=(
                    f"jovian: adopt {rev} as one profile "
                    f"({source_lock.path if source_lock.path.isprintable() else repr(source_lock.path)}"  # noqa: E501
                    " "
                    f"@ {source_lock.lab_commit[:8]})"
                ),
                author=author,
                paths=[rel],
            )
            commit, pushed = git.push_fast_forward(worktree=wt), True
    profile = BuildProfile(
        rev=rev,
        build_dir=lineage,
        path=rel,
        text=text,
        diff=diff,
        unknown_keys=unknown,
        build_commit=commit,
        pushed=pushed,
    )
    outcome = (
        ("NOT written: " + "; ".join(unknown))
        if unknown
        else (f"pushed {commit[:8]}" if pushed else f"unchanged at {commit[:8]}")
    )
    yield dg.Output(
        profile,
        metadata={
            "outcome": dg.MetadataValue.text(outcome),
            "build_dir": dg.MetadataValue.text(lineage),
            "profile": dg.MetadataValue.md(f"`{rel}`\n\n```\n{text}```"),
            "diff_vs_versions_env": string_table(
                [d.model_dump() for d in diff], ["key", "base", "profile"]
            ),
            **commit_entries(site.config().links, "build_commit", jovian.build_repo, commit),
        },
    )
    yield check_result(
        BUILD_PROFILE,
        PROFILE_KEYS_KNOWN,
        Finding(
            passed=not unknown,
            description="; ".join(f"{versions_path}: {u}" for u in unknown)
            or f"all {len(diff)} profile keys are versions.env keys",
        ),
    )
    placed = [f for f in recipes.values() if f is not None]
    yield check_result(
        BUILD_PROFILE,
        RECIPES_TOP_LEVEL,
        Finding(
            passed=all(f.passed for f in placed),
            description="; ".join(f.description for f in placed if not f.passed)
            or f"{len(placed)} recipe(s) name build_profile at the top level",
        ),
    )
    overriding = [f for f in scattered.values() if f is not None]
    yield check_result(
        BUILD_PROFILE,
        RECIPES_NO_SCATTERED_PINS,
        Finding(
            passed=all(f.passed for f in overriding),
            description="; ".join(f.description for f in overriding if not f.passed)
            or f"no recipe sets a profile pin in its [build.versions] ({len(overriding)} have one)",
        ),
        dg.AssetCheckSeverity.WARN,
    )
    vllm = source_lock.lock.packages[jovian.cmake_package]
    yield check_result(
        BUILD_PROFILE,
        GB10_DEVIATIONS_CURRENT,
        gb10.deviations_finding(
            tree=f"{jovian.cmake_package}@{vllm.commit[:12]}",
            cuda_txt=git.show_file(
                url=vllm.repository, sha=vllm.commit, path=gb10.CUDA_REQUIREMENTS
            ),
            deviations_path=deviations_rel,
            deviations_text=deviations_text,
        ),
        dg.AssetCheckSeverity.WARN,
    )


@dg.asset(
    key=DEP_TABLE,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"git", "cmake"},
    code_version="2",
    deps=[FORK_CUT],
    check_specs=[
        dg.AssetCheckSpec(
            CUDA_PINS_GATED,
            asset=DEP_TABLE,
            blocking=True,
            description=(
                "Every CUDA-path GIT_REPOSITORY/GIT_TAG pin in the vLLM tree's cmake has a "
                "gate in fetch-deps.sh."
            ),
        ),
        dg.AssetCheckSpec(
            CMAKE_PINS_RESOLVED,
            asset=DEP_TABLE,
            description="Every pin resolved to a literal value: a `${VAR}` nothing sets is named "
            "with its file:line "
            "(such a row is never fetched; on the CUDA path it also fails cuda_pins_gated).",
        ),
    ],
    description=(
        "The dependency table of the pinned vLLM tree, parsed from "
        "`cmake/external_projects/*.cmake` and the "
        "top-level CMakeLists.txt (literal pairs, set() indirection, platform branches as "
        "separate rows, "
        "GIT_SUBMODULES, FetchContent_Populate); unresolved variables are reported, never "
        "dropped. Diffed "
        "against the rev's lineage's fetch-deps.sh gate list (a tree that moved every gated pin "
        "gets a new "
        "lineage suggested) and against the previous rev."
    ),
)
def dep_table(
    context: dg.AssetExecutionContext, site: SiteResource, git: GitRemotes, source_lock: AdoptedLock
):
    from jovian_assets import dep_table as dt

    jovian = jovian_of(site)
    pkg = source_lock.lock.packages[jovian.cmake_package]
    with git.checkout(url=pkg.repository, sha=pkg.commit) as tree:
        rows = dt.parse_tree(tree.path)
    rev = rev_of(context)
    gates_path = f"{jovian.build_dir_for(rev)}/fetch-deps.sh"
    build_head = git.ls_remote(url=jovian.build_repo, branch=jovian.build_branch)
    gates_text = (
        git.show_file(url=jovian.build_repo, sha=build_head, path=gates_path)
        if build_head
        else None
    )
    if gates_text is None:
        raise AdoptionRefused(
            f"{gates_path} is not in {redact(jovian.build_repo)} ({jovian.build_branch}): rev "
            f"{rev}'s "
            "lineage ([[jovian.lineages]] / [jovian] build_dir) needs its own fetch-deps.sh"
        )
    gates = dt.parse_gates(gates_text, gates_path)
    vs_gates = dt.diff_gates(rows, gates)
    previous = _previous_rows(context, exclude=context.partition_key)
    vs_prev = dt.diff_tables(previous, rows) if previous is not None else None
    rows_json = dt.to_rows_json(rows)
    yield dg.Output(
        rows,
        metadata={
            "deps": string_table(
                [
                    {
                        **r,
                        "submodules": " ".join(r["submodules"]),
                        "unresolved": " ".join(row.unresolved),
                    }  # type: ignore[arg-type]
                    for r, row in zip(rows_json, rows)
                ],
                ["name", "repository", "tag", "submodules", "condition", "unresolved"],
            ),
            "rows_json": dg.MetadataValue.json(rows_json),
            "gate_list": dg.MetadataValue.text(gates_path),
            "vs_fetch_deps": dg.MetadataValue.md(_diff_md(vs_gates)),
            "vs_previous_rev": dg.MetadataValue.md(
                _diff_md(vs_prev) if vs_prev is not None else "no earlier rev recorded"
            ),
        },
    )
    yield check_result(
        DEP_TABLE,
        CUDA_PINS_GATED,
        dt.gated_finding(
            vs_gates, gates, gates_path=gates_path, rev=rev, new_dir=f"{jovian.build_dir}-{rev}"
        ),
    )
    resolved = dt.unresolved_finding(rows)
    cuda_open = any(r.unresolved and dt.is_cuda_path(r) for r in rows)
    yield check_result(
        DEP_TABLE,
        CMAKE_PINS_RESOLVED,
        resolved,
        dg.AssetCheckSeverity.ERROR if cuda_open else dg.AssetCheckSeverity.WARN,
    )


def _scattered_finding(root: Path, rel: str, pin_keys: set[str]) -> Finding | None:
    from jovian_assets import gb10

    try:
        return gb10.recipe_pin_overrides(read_text(root / rel, rel), rel, pin_keys)
    except FileFormatError as exc:
        return Finding(passed=False, description=str(exc))


def _previous_rows(context: dg.AssetExecutionContext, exclude: str) -> list[DepRow] | None:
    """The dep table of the most recent other rev, from this asset's own history."""
    for record in context.instance.fetch_materializations(DEP_TABLE, limit=50).records:
        if record.partition_key != exclude and record.asset_materialization is not None:
            rows = record.asset_materialization.metadata.get("rows_json")
            if rows is not None:
                return [
                    DepRow(
                        name=r["name"],
                        repository=r["repository"],
                        tag=r["tag"],
                        submodules=r["submodules"],
                        condition=r["condition"],
                        file="",
                        line=0,
                    )
                    for r in rows.value
                ]  # type: ignore[union-attr]
    return None


def _diff_md(diff: object) -> str:
    lines = []
    for field in ("added", "moved", "removed", "ungated_cuda_pins"):
        items = getattr(diff, field, None)
        if items:
            lines.append(
                f"**{field}**: "
                + ", ".join(
                    f"{getattr(i, 'name', i)} ({i.change})"
                    if getattr(i, "change", None)
                    else str(getattr(i, "name", i))
                    for i in items
                )
            )
    return "\n\n".join(lines) or "no differences"


@dg.asset(
    key=DEP_TREES,
    partitions_def=lab_revs,
    group_name="jovian",
    kinds={"git"},
    code_version="1",
    check_specs=[
        dg.AssetCheckSpec(
            GITLINKS_POPULATED,
            asset=DEP_TREES,
            blocking=True,
            description=(
                "Every gitlink path holds a .git or a checked-out tree; an EMPTY dir fails, "
                "naming the path."
            ),
        )
    ],
    description=(
        "Every CUDA-path dependency of the dep table fetched at its pin through the shared "
        "object cache "
        "(exact sha, so a second rev re-uses what the first fetched) and checked out, with "
        "gitlinks "
        "(submodules and vendored trees) populated recursively at the commits the parent tree "
        "records."
    ),
)
def dep_trees(context: dg.AssetExecutionContext, git: GitRemotes, dep_table: list[DepRow]):
    from jovian_assets.dep_table import is_cuda_path
    from jovian_assets.dep_trees import fetch_dep, gitlinks_populated

    rev = rev_of(context)
    root = path_under(git.trees_dir(), "jovian", rev, "deps")
    trees = []
    for row in dep_table:
        if not is_cuda_path(row) or not row.repository or not row.tag or row.unresolved:
            continue
        dest = path_under(root, row.name, kind=f"cmake dependency name ({row.file}:{row.line})")
        trees.append(
            fetch_dep(git, name=row.name, repository=row.repository, tag=row.tag, dest=dest)
        )
    result = DepTrees(rev=rev, root=str(root), trees=trees)
    errors = [f"{t.name}: {t.error}" for t in trees if t.error]
    if errors:
        raise AdoptionRefused("dependencies not fetchable at their pins: " + "; ".join(errors))
    yield dg.Output(
        result,
        metadata={
            "root": dg.MetadataValue.path(str(root)),
            "bytes_fetched": dg.MetadataValue.int(sum(t.bytes_fetched for t in trees)),
            "bytes_reused": dg.MetadataValue.int(sum(t.bytes_reused for t in trees)),
            "trees": string_table(
                [
                    {
                        "dep": t.name,
                        "commit": (t.commit or "")[:12],
                        "gitlinks": len(t.gitlinks),
                        "fetched": t.bytes_fetched,
                        "reused": t.bytes_reused,
                    }
                    for t in trees
                ],
                ["dep", "commit", "gitlinks", "fetched", "reused"],
            ),
        },
    )
    yield check_result(DEP_TREES, GITLINKS_POPULATED, gitlinks_populated(trees))
