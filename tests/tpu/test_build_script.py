"""The build script's pre-flight (pure): where it
pushes, whether it traces the token, the GITSHA guard.

The "real order" script below is the sandbox's copy with the order of OpenThoughts-Agent's own
docker/build_tpu_kaniko.sh (`open-thoughts/OpenThoughts-Agent` at 7951edcd, 2026-07-03): `set -euxo
pipefail` on line 23, the three `${VAR:?}` guards on lines 25-27, the auth line traced.
"""

from __future__ import annotations

import pytest

from sandbox.consumer_source import build_script
from tpu_assets.build_script import check_build_script

IMAGE = "ghcr.io/open-thoughts/openthoughts-agent"
PATH = "docker/build_tpu_kaniko.sh"


def real_order() -> str:
    """The sandbox script rearranged as the real one is: xtrace on for the whole script."""
    lines = build_script(IMAGE).splitlines()
    lines = [
        l
        for l in lines
        if l.strip()
        not in (
            "set -x   # traced from here on: nothing below expands the token while tracing",
            "{ set +x; } 2>/dev/null",
            "set -x",
        )
    ]
    body = [l for l in lines[1:] if not l.startswith("#") and l != "set -euo pipefail"]
    header = ["#!/usr/bin/env bash"] + [f"# comment line {n}" for n in range(2, 23)]
    text = "\n".join([*header, "set -euxo pipefail", *body]) + "\n"
    assert text.splitlines()[22] == "set -euxo pipefail"
    return text


def errors(text: str, **kw: object) -> list[str]:
    report = check_build_script(text, path=PATH, image=IMAGE, **kw)  # type: ignore[arg-type]
    return [f"{PATH}:{f.line}: {f.message}" for f in report.errors]


def test_the_sandbox_script_passes() -> None:
    report = check_build_script(build_script(IMAGE), path=PATH, image=IMAGE)
    assert report.errors == [] and report.warnings == []
    assert report.destination == f"{IMAGE}:tpu-${{GITSHA}}"
    assert report.requires == ["DOCKER_USER_ID", "DOCKER_TOKEN", "GITSHA"]


def test_the_real_xtrace_order_is_refused_at_the_lines_that_expand_the_token() -> None:
    text = real_order()
    lines = text.splitlines()
    guard = lines.index(': "${DOCKER_TOKEN:?}"') + 1
    auth = next(i for i, l in enumerate(lines, 1) if l.startswith("AUTH=$(printf"))
    found = errors(text)
    assert found[0] == (
        f"{PATH}:{guard}: `set -x` (line 23) is on when $DOCKER_TOKEN is expanded: the token would "
        "be printed into the iris job log; put `set +x` before this line (and `set -x` after, if "
        "wanted)"
    )
    assert guard == 26  # where the real script has it
    assert any(
        e.startswith(f"{PATH}:{auth}: `set -x` (line 23) is on when $DOCKER_TOKEN") for e in found
    )
    assert len(found) == 2  # the heredoc body that writes $AUTH is not traced by bash


@pytest.mark.parametrize("spelling", ["set -x", "set -o xtrace", "set -eux", "#!/bin/bash -x"])
def test_every_way_of_turning_xtrace_on_is_seen(spelling: str) -> None:
    base = build_script(IMAGE)
    if spelling.startswith("#!"):
        text = base.replace("#!/usr/bin/env bash", spelling, 1)
    else:
        text = base.replace("set -euo pipefail\n", f"set -euo pipefail\n{spelling}\n", 1)
    assert any("is on when $DOCKER_TOKEN is expanded" in e for e in errors(text))


def test_a_variable_assigned_from_the_token_is_a_secret_too() -> None:
    text = (
        build_script(IMAGE)
        .replace('{"auths"', "x", 1)
        .replace("set -x\n\n# --- 4.", 'echo "$AUTH"\nset -x\n\n# --- 4.', 1)
    )
    text = text.replace("{ set +x; } 2>/dev/null\n", "", 1)
    found = [e for e in errors(text) if "AUTH" in e]
    assert found and "$AUTH (assigned from $DOCKER_TOKEN at line" in found[0]


def test_set_plus_x_before_the_token_line_is_enough() -> None:
    text = real_order().replace(
        ': "${DOCKER_USER_ID:?}"', '{ set +x; } 2>/dev/null\n: "${DOCKER_USER_ID:?}"', 1
    )
    text = text.replace("AUTH=$(printf", "{ set +x; } 2>/dev/null\nAUTH=$(printf", 1)
    assert [e for e in errors(text) if "DOCKER_TOKEN" in e] == []


def test_a_hard_coded_destination_that_is_not_the_site_image_is_refused_naming_both() -> None:
    text = build_script("ghcr.io/open-thoughts/openthoughts-agent")
    found = errors(text.replace(IMAGE, "ghcr.io/someone-else/agent"))
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("  --destination"))
    assert found == [
        (
            f"{PATH}:{line}: the script pushes to ghcr.io/someone-else/agent:tpu-${{GITSHA}}, "
            "but the site's [tpu].image is "
            f"{IMAGE} (lockstep expects {IMAGE}:tpu-${{GITSHA}}): the script never reads "
            "lockstep's IMAGE, so the push "
            "would go where the script says. Make the two agree"
        )
    ]


def test_a_script_that_reads_image_from_the_environment_pushes_where_lockstep_says() -> None:
    text = build_script(IMAGE).replace(
        f"DEST_PINNED={IMAGE}:tpu-${{GITSHA}}",
        'IMAGE="${IMAGE:?}"\nDEST_PINNED="${IMAGE}:tpu-${GITSHA}"',
    )
    assert errors(text) == []


@pytest.mark.parametrize(("destination", "says"), [
    ("$(cat /etc/dest)", "not a literal lockstep can read"),
    (f"{IMAGE}:tpu", "the script pushes to"),
    (f"{IMAGE}:latest-${{GITSHA}}", "the script pushes to"),
])  # fmt: skip
def test_destinations_that_are_not_the_pinned_tag(destination: str, says: str) -> None:
    text = build_script(IMAGE).replace(
        '--destination "${DEST_PINNED}"', f'--destination "{destination}"'
    )
    assert any(says in e for e in errors(text))


def test_no_gitsha_guard_and_a_missing_token_are_errors() -> None:
    text = build_script(IMAGE).replace(': "${GITSHA:?}"\n', "")
    assert any('no `: "${GITSHA:?}"` guard' in e for e in errors(text))
    found = errors(build_script(IMAGE), token_given=False)
    assert found == [
        (
            f"{PATH}:16: the script requires DOCKER_TOKEN, but the site passes none: set [iris] "
            "docker_token_env to the NAME of the env var holding the push token (ghcr: a GitHub "
            "PAT with "
            "write:packages)"
        )
    ]


def test_an_unpinned_executor_of_the_archived_upstream_is_a_warning() -> None:
    text = build_script(IMAGE).replace(
        "executor:v1.23.2 - | tar -xf - -C /", "executor:latest - | tar -xf - -C / || true"
    )
    report = check_build_script(text, path=PATH, image=IMAGE)
    assert report.errors == []
    assert [w.message.split(":")[0] for w in report.warnings] == [
        "the kaniko executor is gcr.io/kaniko-project/executor",
        "`|| true` hides a failed executor export",
    ]
