"""A re-lock against a consumer in each shape in the field,
and what it refuses, with pyproject's line and the fix.

The real consumer declares harbor as a PEP 508 direct reference that follows a branch (uv locks
`?rev=<branch>`); others use [tool.uv.sources] with `branch =`. A `rev` is followed only when
ls-remote shows it is the site's harbor branch; a commit, a tag or another branch is refused.
Real bare repos, real uv, Dagster in-process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from resources.git import NamedRefs
from resources.site.tpu import TpuSection
from resources.uv import UvCli
from sandbox.consumer_source import CONSUMER_SHAPES, ConsumerShape
from sandbox.world import HARBOR_BRANCH, Sandbox, advance_harbor, up
from tests.conftest import remote_file, remote_head, stop_sandbox
from tests.support.runs import failure_message, materialize, metadata
from tpu_assets.keys import HARBOR_LOCK
from tpu_assets.relock import branch_refusal

SHA = "a" * 40
TPU = TpuSection(
    harbor_repo="https://h.example/harbor.git",
    harbor_branch="main",
    consumer_repo="https://c.example/consumer.git",
    consumer_branch="main",
    image="ghcr.io/o/i",
)


@pytest.fixture(params=CONSUMER_SHAPES)
def sb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    world = up(tmp_path / "sandbox", consumer_shape=request.param)
    yield world
    stop_sandbox(world)


def shape_of(sb: Sandbox) -> ConsumerShape:
    return (
        "uv_source"
        if "[tool.uv.sources]" in remote_file(sb.consumer, "pyproject.toml")
        else "direct_reference"
    )


def declare(sb: Sandbox, kind: str, ref: str):  # type: ignore[no-untyped-def]
    """An edit that makes the consumer take harbor by
    `kind` (branch, rev, tag) `ref`, re-locked by uv."""
    shape = shape_of(sb)

    def edit(wt: Path) -> None:
        p = wt / "pyproject.toml"
        text = p.read_text()
        if shape == "direct_reference":
            text = text.replace(f'@{HARBOR_BRANCH}"', f'@{ref}"')
        else:
            text = text.replace(f'branch = "{HARBOR_BRANCH}"', f'{kind} = "{ref}"')
        p.write_text(text)
        UvCli(offline=True).lock(project_dir=wt)

    return edit


def test_each_shape_relocks_to_the_branch_tip_and_leaves_pyproject_alone(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    before = remote_file(sb.consumer, "pyproject.toml")
    tip = advance_harbor(sb.root)
    result = materialize(resources, [HARBOR_LOCK])
    assert result.success, failure_message(result)
    assert metadata(result)["pushed"] is True
    kind = "rev" if shape_of(sb) == "direct_reference" else "branch"
    assert f"?{kind}=penfever%2Fworking#{tip}" in remote_file(sb.consumer, "uv.lock")
    assert remote_file(sb.consumer, "pyproject.toml") == before


@pytest.mark.parametrize("case", ["commit", "short commit", "tag", "another branch"])
def test_a_commit_a_tag_or_another_branch_is_refused_naming_pyproject_line_and_the_fix(
    sb: Sandbox, resources: dict[str, object], push_consumer, case: str
) -> None:
    harbor = git.Repo(sb.harbor)
    tip = harbor.commit(HARBOR_BRANCH).hexsha
    harbor.git.tag("v0.8.0", tip)
    harbor.git.branch("experiments", tip)
    kind, ref, says = {
        "commit": ("rev", tip, f"is pinned to commit {tip[:12]}, which never moves"),
        "short commit": ("rev", tip[:9], f"is pinned to commit {tip[:9]}, which never moves"),
        "tag": ("tag", "v0.8.0", "tag 'v0.8.0'"),
        "another branch": (
            "branch",
            "experiments",
            "but the site watches [tpu].harbor_branch = 'penfever/working'",
        ),
    }[case]
    if shape_of(sb) == "direct_reference" and case == "another branch":
        kind = "rev"
    push_consumer(sb, declare(sb, kind, ref))
    head = remote_head(sb.consumer)
    advance_harbor(sb.root)

    result = materialize(resources, [HARBOR_LOCK])
    assert not result.success
    message = failure_message(result)
    line = next(
        n
        for n, text in enumerate(remote_file(sb.consumer, "pyproject.toml").splitlines(), 1)
        if ref in text
    )
    assert f"pyproject.toml:{line}: harbor " in message and says in message, message
    if shape_of(sb) == "direct_reference":  # the fix, in the shape the consumer uses
        assert f'Fix: write "harbor[daytona] @ git+{sb.url(sb.harbor)}@{HARBOR_BRANCH}"' in message
    else:
        assert f'Fix: write branch = "{HARBOR_BRANCH}" in [tool.uv.sources]' in message
    assert "Nothing was pushed" in message and remote_head(sb.consumer) == head


def test_a_rev_that_is_both_the_branch_and_a_tag_is_refused_as_ambiguous_a_branch_source_is_not(
    sb: Sandbox, resources: dict[str, object]
) -> None:
    harbor = git.Repo(sb.harbor)
    harbor.git.tag(HARBOR_BRANCH, harbor.commit(HARBOR_BRANCH).hexsha)
    head = remote_head(sb.consumer)
    tip = advance_harbor(sb.root)
    result = materialize(resources, [HARBOR_LOCK])
    # `branch =` makes uv fetch refs/heads only: the tag cannot be taken
    if shape_of(sb) == "uv_source":
        assert result.success, failure_message(result)
        assert f"#{tip}" in remote_file(sb.consumer, "uv.lock")
        return
    assert not result.success
    assert re.search(
        r"pyproject\.toml:\d+: harbor names 'penfever/working', which is both a branch and a tag",
        failure_message(result),
    )
    assert remote_head(sb.consumer) == head


@pytest.mark.parametrize(
    ("kind", "ref", "refs", "says"),
    [
        (None, None, NamedRefs(name="main", branch=SHA), "default branch"),
        ("rev", "main", NamedRefs(name="main", branch=SHA), None),
        ("branch", "main", NamedRefs(name="main", branch=SHA, tag=SHA), None),
        (
            "rev",
            "main",
            NamedRefs(name="main", tag=SHA),
            "not a branch of https://h.example/harbor.git (git ls-remote) (it is a tag there",
        ),
        ("rev", "main", NamedRefs(name="main"), "not a branch of"),
        # upper case: not a sha
        ("rev", "ABCDEF12", NamedRefs(name="main", branch=SHA), "follows rev 'ABCDEF12'"),
    ],
)
def test_what_a_rev_must_be_to_be_followed(
    kind: str | None, ref: str | None, refs: NamedRefs, says: str | None
) -> None:
    why = branch_refusal(kind, ref, TPU, refs)
    assert (why is None) if says is None else (says in (why or "")), why
