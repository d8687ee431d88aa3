"""The plain rules of a runtime rollback: which
scope does what (the pyproject edit that pins harbor:
tests/tpu/test_harbor_declaration.py)."""

from __future__ import annotations

from tpu_assets.rollback import TagMove, VerifiedBuild, plan_rollback
from tpu_assets.runtime_rollback import resolve_scope, scope_summary

H1, H2 = "1" * 40, "2" * 40


def test_auto_scope_pins_the_runtime_only_when_the_target_bakes_another_harbor() -> None:
    assert resolve_scope("auto", target_harbor=H1, locked=H2) == (True, True)
    assert resolve_scope("auto", target_harbor=H1, locked=H1) == (True, False)
    assert resolve_scope("image", target_harbor=H1, locked=H2) == (True, False)
    assert resolve_scope("runtime", target_harbor=H1, locked=H2) == (False, True)
    assert resolve_scope("both", target_harbor=H1, locked=H1) == (True, True)


def test_the_plan_says_what_each_scope_changes() -> None:
    b1 = VerifiedBuild(
        build="c1" * 20, digest="sha256:" + "a" * 64, harbor_commit=H1, verified_at=1
    )
    b2 = VerifiedBuild(
        build="c2" * 20, digest="sha256:" + "b" * 64, harbor_commit=H2, verified_at=2
    )
    moves = [
        TagMove(action="promote", from_digest=b1.digest, to_digest=b2.digest, build=b2.build),
        TagMove(action="promote", from_digest=None, to_digest=b1.digest, build=b1.build),
    ]
    plan = plan_rollback(
        verified=[b1, b2], moves=moves, current_digest=b2.digest, contains=lambda a, b: True
    )
    alone = plan_rollback(
        verified=[b1, b2], moves=moves, current_digest=None, contains=lambda a, b: True
    )
    text = scope_summary(
        plan, tag="tpu", consumer_branch="main", consumer_head="f" * 40, locked=H2, runtime=alone
    )
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()[1:]}
    assert b1.digest in lines["image"] and f"still install harbor {H2[:8]}" in lines["image"]
    assert f"{H2[:8]} -> {H1[:8]}" in lines["runtime (with both)"]
    assert f"already pins harbor {H2[:8]}" in lines["runtime alone (the tag stays)"]
    assert lines["default (auto)"].startswith("  default (auto): both")
