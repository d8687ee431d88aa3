"""Hostile names through the Jovian lane's doors: a lab lock's release.version and repositories, the
vLLM tree's cmake GIT_REPOSITORY, a dependency's .gitmodules, the lab_revs partition itself.

Every name of tests/support/hostile.py is tried at parse level (milliseconds). A representative few
are then published in the sandbox's lab repo and adopted in-process, build included, on ONE
module-wide sandbox: each run must fail at jovian/source_lock naming the lock's file:line and the
value, with the build repo's refs unchanged, no node command run,
and nothing created outside the module's own directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import git
import pytest

from jovian_assets.dep_table import parse_cmake
from jovian_assets.dep_trees import submodule_urls
from jovian_assets.inputs import PathRefused, path_under
from jovian_assets.keys import DEP_TABLE
from jovian_assets.node_build import image_tag
from jovian_assets.source_lock import parse_source_lock
from resources.errors import FileFormatError
from sandbox.jovian_world import LAB_BRANCH, Commit, fast_import, lock_path
from sandbox.world import Sandbox, up
from tests.conftest import remote_file, sandbox_resources
from tests.support.hostile import HOSTILE_NAMES, HOSTILE_URLS
from tests.support.jovian.lab import Lab, done
from tests.support.jovian.source_lock import R35_PATH, line_no, replace_line
from tests.support.report import count
from tests.support.runs import failure_message

R35 = R35_PATH.read_text(encoding="utf-8")
LOCK = "models/glm-5.3-flash/build/hostile.source.lock"
MARKERS = ("/tmp/lockstep-pwned", "/tmp/lockstep-escape", "/tmp/lockstep-abs")


def _shown(value: str) -> str:
    """How a refusal shows a value: repr, so a newline or a quote is visible."""
    return repr(value)[1:-1]


# -- parse level: every hostile name at every door -------------------------------------------------


# A line-based file cannot hold a value that ends in a
# newline: `r1\n` there is the line `r1` and an empty one.
@pytest.mark.parametrize(
    "name", [n for n in HOSTILE_NAMES if not (n.endswith("\n") and n.count("\n") == 1)], ids=repr
)
def test_hostile_release_version_is_refused_with_its_line(name: str) -> None:
    n = line_no(R35, "release.version")
    with pytest.raises(FileFormatError) as info:
        parse_source_lock(replace_line(R35, "release.version", f"release.version={name}"), LOCK)
    exc = info.value
    # A newline ends the value: the lock then holds a
    # line that is not key=value, refused on its own.
    first, _, second = name.partition("\n")
    assert (exc.path, exc.line) == (LOCK, n + 1 if second else n)
    if "\0" in name:  # refused as a NUL, whatever the rest of the value
        assert "NUL" in exc.message, exc.message
    else:
        assert (
            _shown(second or first) in exc.message
            if name
            else "release.version is empty" in exc.message
        )
    count("hostile names refused (jovian)")


@pytest.mark.parametrize("url", [u for u in HOSTILE_URLS if "\n" not in u], ids=repr)
def test_hostile_package_repository_is_refused_with_its_line(url: str) -> None:
    # (A lock value cannot hold a newline: the URL with one is two lines, tried as a name above.)
    n = line_no(R35, "b12x.repository")
    with pytest.raises(FileFormatError) as info:
        parse_source_lock(replace_line(R35, "b12x.repository", f"b12x.repository={url}"), LOCK)
    assert info.value.line == n and (
        _shown(url) in info.value.message or "is empty" in info.value.message
    )
    count("hostile names refused (jovian)")


def _cmake_quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.mark.parametrize("url", HOSTILE_URLS, ids=repr)
def test_hostile_cmake_git_repository_is_refused_with_its_line(url: str) -> None:
    text = (
        f"FetchContent_Declare(\n  flashmla\n  GIT_REPOSITORY {_cmake_quoted(url)}\n  GIT_TAG "
        "v1.0.0\n)\n"
    )
    with pytest.raises(FileFormatError) as info:
        parse_cmake(text, "cmake/external_projects/flashmla.cmake")
    assert info.value.line == 3 and (
        _shown(url) in info.value.message or "empty" in info.value.message
    )
    count("hostile names refused (jovian)")


def _git_config_quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.mark.parametrize("url", [u for u in HOSTILE_URLS if not u.startswith("../")], ids=repr)
def test_hostile_submodule_url_is_refused_with_its_line(url: str) -> None:
    # (`../x.git` is git's own relative submodule URL: it
    # resolves against the parent's URL, which is checked.)
    text = f'[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = {_git_config_quoted(url)}\n'
    with pytest.raises(FileFormatError) as info:
        submodule_urls(text, "https://github.com/vllm-project/FlashMLA.git", ".gitmodules")
    assert info.value.line == 3 and (
        _shown(url) in info.value.message or "is empty" in info.value.message
    )
    count("hostile names refused (jovian)")


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_hostile_rev_never_names_a_directory_or_a_path(name: str, tmp_path: Path) -> None:
    root = tmp_path / "trees"
    root.mkdir()
    with pytest.raises(PathRefused):
        path_under(root, "jovian", name, "deps")
    assert list(root.iterdir()) == []
    count("hostile names refused (jovian)")


def test_a_percent_in_a_submodule_url_is_just_a_character() -> None:
    # The configparser crash: any sandbox path with a space is %20 in its file:// URL.
    text = (
        '[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = '
        "file:///tmp/my%20sandbox/cutlass.git ; a comment\n"
    )
    assert submodule_urls(text, "file:///tmp/my%20sandbox/flashmla.git") == {
        "csrc/cutlass": "file:///tmp/my%20sandbox/cutlass.git"
    }


def test_an_image_tag_a_docker_cli_would_misread_is_refused() -> None:
    assert image_tag("jovian-judgement:{rev}-glm53", "r35") == "jovian-judgement:r35-glm53"
    for rev in ("-rf", ".hidden", "r1;id", "r1 r2"):
        with pytest.raises(Exception, match="is not a docker name:tag"):
            image_tag("{rev}" if rev == "-rf" else "jovian-judgement:{rev}", rev)


# -- end to end: a hostile lock published and adopted on one sandbox -------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Lab]]:
    home = tmp_path_factory.mktemp("hostile-jovian")
    sb = up(home / "sandbox")
    # the object cache is made on first use: made here, so a snapshot only sees what a run adds
    (home / "cache").mkdir()
    resources = sandbox_resources(sb, home / "cache")
    with dg.instance_for_test() as instance:
        yield home, Lab(sb, {k: resources[k] for k in ("site", "git", "spark")}, instance)


def _refs(bare: Path) -> str:
    return git.Repo(bare).git.for_each_ref("--format=%(objectname) %(refname)")


def _snapshot(home: Path, sb: Sandbox) -> dict[str, object]:
    """What a hostile run must leave alone: the build
    repo's refs, the module dir and its siblings, the
    trees lockstep checks out, every file on the sandbox
    nodes, and the markers the hostile names aim at."""
    base = home.parent
    return {
        "build_refs": _refs(sb.repos / "docker-images.git"),
        "siblings": sorted(p.name for p in base.iterdir()),
        "home": sorted(p.name for p in home.iterdir()),
        "trees": sorted(str(p.relative_to(home)) for p in (home / "trees").rglob("*"))
        if (home / "trees").exists()
        else [],
        "nodes": sorted(str(p.relative_to(sb.root)) for p in (sb.root / "nodes").rglob("*")),
        "markers": {m: Path(m).exists() for m in MARKERS} | {"/tmp/tmp": Path("/tmp/tmp").exists()},
    }


def _publish(lab: Lab, push_repo: Callable[..., str], name: str, text: str) -> str:
    path = lock_path(name)

    def add(wt: Path) -> None:
        (wt / path).write_text(text, encoding="utf-8")

    push_repo(lab.lab_repo, LAB_BRANCH, add, f"publish {name}")
    return path


REPRESENTATIVE = [
    "../../../../tmp/lockstep-escape",
    "/tmp/lockstep-abs",
    "$(touch /tmp/lockstep-pwned)",
    "--upload-pack=touch /tmp/lockstep-pwned",
    "..",
]


@pytest.mark.parametrize("name", REPRESENTATIVE, ids=repr)
def test_hostile_rev_fails_at_source_lock_and_touches_nothing(
    world: tuple[Path, Lab], push_repo: Callable[..., str], name: str
) -> None:
    home, lab = world
    r27 = remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH)
    path = _publish(
        lab,
        push_repo,
        f"hostile-{REPRESENTATIVE.index(name)}",
        r27.replace("release.version=r27", f"release.version={name}"),
    )
    line = line_no(r27, "release.version")
    before = _snapshot(home, lab.sb)

    # as if someone added the partition by hand: the sensor never would
    result = lab.adopt(name, build=True)

    assert not result.success and done(result) == set()
    message = failure_message(result)
    assert f"{path}:{line}: release.version {name!r} is not a plain name" in message
    assert _snapshot(home, lab.sb) == before
    count("hostile names refused (jovian)")


def test_the_sensor_skips_hostile_locks_and_adds_no_partition(
    world: tuple[Path, Lab], push_repo: Callable[..., str]
) -> None:
    _, lab = world
    r27 = remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH)
    _publish(
        lab,
        push_repo,
        "hostile-sensor",
        r27.replace("release.version=r27", "release.version=r1;touch /tmp/lockstep-pwned"),
    )
    known = set(lab.instance.get_dynamic_partitions("lab_revs"))
    tick = lab.tick(None)
    revs = {r.partition_key for r in tick.run_requests}
    assert "r1;touch /tmp/lockstep-pwned" not in revs and revs <= {"r27"} | known
    assert set(lab.instance.get_dynamic_partitions("lab_revs")) <= known | {"r27"}


def test_hostile_cmake_repository_fails_dep_table_with_file_line_and_fetches_nothing(
    world: tuple[Path, Lab], push_repo: Callable[..., str]
) -> None:
    home, lab = world
    r27 = remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH)
    keys = dict(line.split("=", 1) for line in r27.splitlines() if "=" in line)
    vllm = lab.sb.repos / "vllm.git"
    repo = git.Repo(vllm)
    pin = repo.commit(keys["vllm.commit"])
    cmake = "cmake/external_projects/flashmla.cmake"
    hostile = re.sub(
        r"GIT_REPOSITORY \S+",
        'GIT_REPOSITORY "--upload-pack=touch /tmp/lockstep-pwned"',
        pin.tree[cmake].data_stream.read().decode(),
    )
    # Cut at the pin's own time, on a branch the audit does not list: only the cmake is wrong.
    sha = fast_import(
        vllm,
        [
            Commit(
                "hostile/cmake",
                "flashmla: fetch from elsewhere",
                pin.committed_datetime,
                {cmake: hostile},
                parent=pin.hexsha,
            )
        ],
    )[0]
    lock = (
        r27.replace("release.version=r27", "release.version=r27h")
        .replace(keys["vllm.commit"], sha)
        .replace(keys["vllm.tree"], repo.commit(sha).tree.hexsha)
    )
    _publish(lab, push_repo, "r27h", lock)
    before = _snapshot(home, lab.sb)

    result = lab.adopt("r27h", build=True)

    assert not result.success and DEP_TABLE.to_user_string() not in done(result)
    assert "jovian/dep_trees" not in done(result) and "jovian/image" not in done(result)
    line = next(n for n, text in enumerate(hostile.splitlines(), 1) if "--upload-pack" in text)
    assert (
        f"{cmake}:{line}: GIT_REPOSITORY '--upload-pack=touch /tmp/lockstep-pwned' starts with '-'"
        in failure_message(result)
    )
    after = _snapshot(home, lab.sb)
    # The profile of a well-named rev is adopted before
    # the dep table (runbook order); nothing else moves.
    assert {k: v for k, v in after.items() if k != "build_refs"} == {
        k: v for k, v in before.items() if k != "build_refs"
    }
    assert not (home / "trees" / "jovian" / "r27h").exists()
    count("hostile names refused (jovian)")


def test_a_rev_that_slipped_past_the_parser_still_names_no_path(
    world: tuple[Path, Lab], push_repo: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: with the lock parser's and the lookup's name rule switched off, the assets'
    own checks (the partition as a rev, every path through names.under) still write nothing."""
    import jovian_assets.revs
    import jovian_assets.source_lock

    home, lab = world
    name = "../../../../tmp/lockstep-escape-slipped"
    monkeypatch.setattr(jovian_assets.source_lock, "name_at", lambda path, line, kind, value: value)
    monkeypatch.setattr(jovian_assets.revs, "check_name", lambda kind, value: value)
    r27 = remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH)
    _publish(
        lab,
        push_repo,
        "hostile-slipped",
        r27.replace("release.version=r27", f"release.version={name}"),
    )
    before = _snapshot(home, lab.sb)

    result = lab.adopt(name, build=True)

    assert (
        not result.success
        and "jovian/build_profile" not in done(result)
        and "jovian/dep_trees" not in done(result)
    )
    assert f"lab_revs partition {name!r} is not a plain name" in failure_message(result)
    assert (
        _snapshot(home, lab.sb) == before and not Path("/tmp/lockstep-escape-slipped.env").exists()
    )
    count("hostile names refused (jovian)")


def test_an_unfetchable_pin_is_refused_at_the_fork_cut_naming_package_and_sha_and_nothing_is_built(
    world: tuple[Path, Lab], push_repo: Callable[..., str]
) -> None:
    """Not hostile, just wrong: a lock that pins a commit
    the fork does not have (a force-push, a typo)."""
    home, lab = world
    r27 = remote_file(lab.lab_repo, lock_path("r27"), LAB_BRANCH)
    keys = dict(line.split("=", 1) for line in r27.splitlines() if "=" in line)
    gone = "0badc0de" * 5
    _publish(
        lab,
        push_repo,
        "r27gone",
        r27.replace("release.version=r27", "release.version=r27gone").replace(
            f"b12x.commit={keys['b12x.commit']}", f"b12x.commit={gone}"
        ),
    )
    before = _snapshot(home, lab.sb)

    result = lab.adopt("r27gone", build=True)

    assert not result.success and done(result) == {"jovian/source_lock", "jovian/fork_cut"}
    reachable = {e.check_name: e for e in result.get_asset_check_evaluations()}["pins_reachable"]
    assert not reachable.passed and f"b12x {gone[:12]} from" in (reachable.description or "")
    after = _snapshot(home, lab.sb)
    # nothing built or pushed
    assert after["nodes"] == before["nodes"] and after["build_refs"] == before["build_refs"]
