"""The malformed-file corpus (tests/corpus/): each file is a realistic site file, uv.lock or iris
answer with ONE defect, and says beside it how it must be refused. Every one must be a LockstepError
(never another exception) naming the file, the line (or JSON path) and the value, except a secret's
value, which is never echoed.

Expectations: a first-line comment `# expect: line=N value=TEXT [secret=TEXT]` in TOML files; a
sidecar `<name>.expect` (`where=...`, `value=...`) for iris's JSON and text. `value` is what the
message must show; `secret` what it must not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from resources.errors import FileFormatError, LockstepError
from resources.iris.output import parse_state_output
from resources.names import check_name, check_ref, check_relative_path, check_url
from resources.reader import read_text
from resources.site.load import load_site
from resources.site.rules import check_oci_tag
from resources.uv import UvLock
from tests.support.hostile import HOSTILE_NAMES, HOSTILE_URLS
from tests.support.report import REFUSED, count, tried
from tpu_assets.dockerfile import find_pin

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
_EXPECT = re.compile(rb"^# expect: line=(\d+) value=(.*?)(?: secret=(\S+))?$")
MARKERS = [Path("/tmp/lockstep-pwned"), Path("/tmp/lockstep-escape"), Path("/tmp/lockstep-abs")]


def _files(kind: str, pattern: str) -> list[Path]:
    return sorted((CORPUS / kind).glob(pattern))


def _with_line(exc: Exception) -> bool:
    return isinstance(exc, FileFormatError) and exc.line is not None


# An iris answer is stdout, not a file: its refusal names
# the JSON path (`$.tasks[0].exit_code`) or the line.
_IRIS_WHERE = re.compile(r"\$|\blines? \d+")


def _refusal(
    read: Callable[[], object], located: Callable[[Exception], bool] = _with_line
) -> LockstepError:
    """The reader's refusal; any other outcome (no location,
    accepted, a crash) fails here, and is counted."""
    outcome, exc, shown = tried(read, located)
    assert outcome == REFUSED, f"{outcome}:\n{shown}"
    assert isinstance(exc, LockstepError)
    return exc


def _toml_case(path: Path, read) -> None:  # type: ignore[no-untyped-def]
    m = _EXPECT.match(path.read_bytes().split(b"\n", 1)[0])
    assert m, f"{path}: no `# expect: line=N value=...` first line"
    line, value, secret = int(m[1]), m[2].decode(), (m[3] or b"").decode()
    exc = _refusal(read)
    assert isinstance(exc, FileFormatError), f"{type(exc).__name__}: {exc}"
    assert str(exc).startswith(f"{path}:{line}: "), f"expected {path.name}:{line}, got: {exc}"
    assert value in str(exc), f"the value {value!r} is not in: {exc}"
    if secret:
        assert secret not in str(exc) and secret not in repr(exc.__cause__), str(exc)


@pytest.mark.parametrize("path", _files("site", "*.toml"), ids=lambda p: p.stem)
def test_a_malformed_site_file_is_refused_with_file_line_and_value(path: Path) -> None:
    _toml_case(path, lambda: load_site(path))


@pytest.mark.parametrize(
    "path", _files("uv_lock", "*.uv.lock"), ids=lambda p: p.name.removesuffix(".uv.lock")
)
def test_a_malformed_uv_lock_is_refused_with_file_line_and_value(path: Path) -> None:
    # What a re-lock and a build do with the consumer's
    # lock: read it, then find harbor's git source.
    _toml_case(path, lambda: UvLock.read(path).git_package("harbor"))


@pytest.mark.parametrize("path", _files("iris", "*.expect"), ids=lambda p: p.stem)
def test_a_garbled_iris_answer_is_refused_naming_the_field_and_value(path: Path) -> None:
    expect = dict(line.split("=", 1) for line in path.read_text().splitlines())
    answer = next(p for p in path.parent.glob(f"{path.stem}.*") if p.suffix != ".expect")
    # The job id stands for the answer's origin: every iris message names the job it is about.
    exc = _refusal(
        lambda: parse_state_output(
            answer.read_text(), job_id=str(answer), json_output=answer.suffix == ".json"
        ),
        lambda e: bool(_IRIS_WHERE.search(str(e))),
    )
    for shown in (str(answer), expect["where"], expect["value"]):
        assert shown in str(exc), f"{shown!r} is not in: {exc}"


@pytest.mark.parametrize("path", _files("dockerfile", "*.Dockerfile"), ids=lambda p: p.stem)
def test_a_malformed_dockerfile_pin_is_refused_with_file_line_and_value(path: Path) -> None:
    # What a build and a re-lock do with the consumer's
    # Dockerfile: read it, then find harbor's pin line.
    _toml_case(path, lambda: find_pin(read_text(path), path, "HARBOR_COMMIT"))


def test_the_corpus_holds_what_the_suite_promises() -> None:
    sizes = {kind: len(list((CORPUS / kind).iterdir())) for kind in ("site", "uv_lock", "iris")}
    assert sizes["site"] >= 45 and sizes["uv_lock"] >= 5 and sizes["iris"] >= 10, sizes


# -- hostile names in every kind of site key ------------------------------------------------------

GOOD = (
    (CORPUS / "site" / "memory_lots.toml").read_text().replace('memory = "lots"', 'memory = "64GB"')
)
# kind -> (the key's line in the good file, the rule the loader must apply, the hostile values)
KINDS = {
    "branch": (
        'harbor_branch = "penfever/working"',
        lambda v: check_ref("branch", v),
        HOSTILE_NAMES,
    ),
    "url": (
        'harbor_repo = "https://github.com/marin-community/harbor.git"',
        lambda v: check_url("url", v, ("https", "ssh")),
        HOSTILE_URLS + HOSTILE_NAMES,
    ),
    "node": ('name = "spark-a"', lambda v: check_name("node", v), HOSTILE_NAMES),
    "build_dir": (
        'build_dir = "jovian-judgement"',
        lambda v: check_relative_path("path", v),
        HOSTILE_NAMES,
    ),
    "floating_tag": ('floating_tag = "tpu"', lambda v: check_oci_tag("tag", v), HOSTILE_NAMES),
}


def _toml_string(value: str) -> str:
    """`value` as a TOML basic string: JSON's escapes,
    but an astral character as itself (TOML has no
    surrogate pairs) and DEL escaped (TOML forbids it raw)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _rule_refuses(rule, value: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        rule(value)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_names_in_each_kind_of_site_key_are_refused_at_load(
    kind: str, tmp_path: Path
) -> None:
    line_text, rule, values = KINDS[kind]
    key = line_text.split(" = ")[0]
    assert GOOD.count(line_text) == 1
    at = GOOD.splitlines().index(line_text) + 1
    refused = 0
    for value in values:
        site = tmp_path / "site.toml"
        # A JSON string is a TOML basic string: newlines and
        # quotes arrive escaped, as a person would write them.
        site.write_text(GOOD.replace(line_text, f"{key} = {_toml_string(value)}"), encoding="utf-8")
        if not _rule_refuses(rule, value):
            # e.g. `r1|id` is a branch git accepts: it reaches git as data, never a shell
            load_site(site)
            continue
        with pytest.raises(FileFormatError) as info:
            load_site(site)
        assert str(info.value).startswith(f"{site}:{at}: "), str(info.value)
        refused += 1
    # A branch may be `r1|id` or `ｒ１`: git takes many,
    # as data; every other kind refuses nearly all.
    assert refused >= (len(values) // 2 if kind == "branch" else len(values) - 6), (
        "the rule let most hostile values through"
    )
    assert not any(m.exists() for m in MARKERS) and sorted(p.name for p in tmp_path.iterdir()) == [
        "site.toml"
    ]
    count("hostile names refused (site)", refused)
