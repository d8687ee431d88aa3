"""The lab's source lock: the real r35 lock parses with
every key kept; each bad variant names file:line."""

from __future__ import annotations

import json

import pytest

from jovian_assets.source_lock import FORMAT, parse_source_lock, to_json
from resources.errors import FileFormatError
from tests.support.jovian.source_lock import R35_PATH, line_no, replace_line

LOCK = "models/glm-5.3-flash/build/r35.source.lock"


@pytest.fixture(scope="module")
def r35_text() -> str:
    assert R35_PATH.is_file(), (
        f"{R35_PATH} is missing: the tests read the lab's real r35 lock from tests/corpus/lab"
    )
    return R35_PATH.read_text(encoding="utf-8")


def error(text: str, **kwargs: object) -> FileFormatError:
    with pytest.raises(FileFormatError) as info:
        parse_source_lock(text, LOCK, **kwargs)  # type: ignore[arg-type]
    return info.value


# -- the real lock ---------------------------------------------------------------------------------


def test_real_r35_lock_parses_with_rev_and_release(r35_text: str) -> None:
    lock = parse_source_lock(r35_text, LOCK, required=["vllm", "b12x", "lmcache"])
    assert lock.format == FORMAT
    assert lock.rev == "r35"
    assert lock.release_name == "jovian-judgement-community-20260911-r35"
    assert lock.path == LOCK


def test_real_r35_lock_has_exactly_the_three_engine_packages_in_file_order(r35_text: str) -> None:
    lock = parse_source_lock(r35_text, LOCK)
    # model.repository has no commit and flashkda.base.commit no repository: neither is a package.
    assert list(lock.packages) == ["vllm", "b12x", "lmcache"]
    vllm, b12x, lmcache = lock.packages["vllm"], lock.packages["b12x"], lock.packages["lmcache"]
    assert vllm.model_dump() == {
        "name": "vllm",
        "repository": "https://github.com/voipmonitor/vllm.git",
        "commit": "de982a50c6a3e4718e5cf9f00423a92192718da1",
        "tree": "6d5cc3490735a53e849a4f0909183cb5e3a22e8b",
        "package_tree": "92f94391ade24a31903e3c4911e1a9ef23a7d3ad",
        "bundle_sha256": "cfba3877f0d4090ff5665eaa550a8d57c71d4f702dedb45c706d903b6a1ac13f",
        "version": "0.26.1rc0+glm53.r35.vllmde982a50",
        "line": 25,
    }
    assert (b12x.repository, b12x.commit, b12x.tree) == (
        "https://github.com/voipmonitor/b12x.git",
        "98086604c86ec1e78977e5023ce282ecb97ab8a7",
        "d963f030c72a426753d2afa412b35d29eeb045f7",
    )
    assert b12x.package_tree == "91a6bb77304bd7ebf2abb122bd3dc23a135115be"
    assert b12x.version is None  # only some packages carry P.version
    assert b12x.line == 30
    assert (lmcache.repository, lmcache.commit, lmcache.tree) == (
        "https://github.com/local-inference-lab/LMCache.git",
        "29bc5a2efde737c436b04499eb62cd1776cebeec",
        "5a88a1ea9d2627c76288d056e7193f7454669b64",
    )
    assert lmcache.version == "0.5.5.dev0+glm53checkpoints.29bc5a2e"
    assert (
        lmcache.bundle_sha256 == "ebe56ce7553309704a93064d73e8d96b1fd577154d132efdc23fcc0198b81370"
    )


def test_real_r35_lock_keeps_every_key_verbatim_in_file_order(r35_text: str) -> None:
    lock = parse_source_lock(r35_text, LOCK)
    file_pairs = [line.split("=", 1) for line in r35_text.splitlines() if line.strip()]
    assert list(lock.keys.items()) == [(k, v) for k, v in file_pairs]
    assert lock.keys["runtime.lmcache.transfer"] == "engine-driven asynchronous shared memory"
    assert lock.keys["runtime.base.image"].startswith("voipmonitor/vllm@sha256:93ac5228")
    assert lock.keys["flashkda.base.commit"] == "3b225bf26bb8e218928a1fe14751cb48cf31d11b"
    assert lock.keys["flashinfer.commit"] == "803c4664f4771ddc418f20a57f752469a237a825"
    assert lock.keys["vllm.native.csrc.tree"] == "b0ef9c9361a4b22d6f90840192210a9d0c1e5049"
    assert lock.keys["runtime.lmcache.checkpoints"].endswith(
        "independent chunks for explicit aligned"
    )
    assert lock.line_of("release.version") == 5
    assert lock.line_of("runtime.lmcache.transfer") == 19
    assert lock.line_of("no.such.key") is None
    assert lock.lines == {k: line_no(r35_text, k) for k in lock.keys}


def test_values_keep_equals_signs_semicolons_and_spaces(r35_text: str) -> None:
    text = (
        r35_text
        + "runtime.env=VLLM_USE_V1=1; NCCL_P2P_LEVEL=NVL @ node:dgx4 \n"
        + "runtime.empty=\n"
    )
    lock = parse_source_lock(text, LOCK)
    assert lock.keys["runtime.env"] == "VLLM_USE_V1=1; NCCL_P2P_LEVEL=NVL @ node:dgx4 "
    assert lock.keys["runtime.empty"] == ""


def test_comments_and_blank_lines_are_skipped_but_line_numbers_stay_true(r35_text: str) -> None:
    text = "# published by the lab\n\n" + r35_text.replace(
        "release.version=r35\n", "\n# the rev\nrelease.version=r35\n"
    )
    lock = parse_source_lock(text, LOCK)
    assert lock.rev == "r35"
    assert lock.line_of("format") == 3
    assert lock.line_of("release.version") == 9
    assert lock.packages["vllm"].line == line_no(text, "vllm.commit")


def test_to_json_has_rev_packages_and_every_key(r35_text: str) -> None:
    lock = parse_source_lock(r35_text, LOCK)
    data = json.loads(json.dumps(to_json(lock)))
    assert data["rev"] == "r35"
    assert data["release_name"] == "jovian-judgement-community-20260911-r35"
    assert set(data["packages"]) == {"vllm", "b12x", "lmcache"}
    assert data["packages"]["vllm"] == {
        "repository": "https://github.com/voipmonitor/vllm.git",
        "commit": "de982a50c6a3e4718e5cf9f00423a92192718da1",
        "tree": "6d5cc3490735a53e849a4f0909183cb5e3a22e8b",
        "package_tree": "92f94391ade24a31903e3c4911e1a9ef23a7d3ad",
        "bundle_sha256": "cfba3877f0d4090ff5665eaa550a8d57c71d4f702dedb45c706d903b6a1ac13f",
        "version": "0.26.1rc0+glm53.r35.vllmde982a50",
    }
    assert data["keys"] == lock.keys
    assert "runtime.cache.fingerprint" in data["keys"]


def test_repository_change_between_revs_is_just_another_value(r35_text: str) -> None:
    # One rev's b12x came from another owner: the parser records it, fork_cut audits it.
    text = replace_line(
        r35_text, "b12x.repository", "b12x.repository=https://github.com/someone-else/b12x.git"
    )
    assert (
        parse_source_lock(text, LOCK).packages["b12x"].repository
        == "https://github.com/someone-else/b12x.git"
    )


# -- bad locks: each error names the file, the line and the value ----------------------------------


def test_wrong_format_names_line_1_and_the_value(r35_text: str) -> None:
    text = r35_text.replace(FORMAT, "local-inference-source-lock/v2", 1)
    exc = error(text)
    assert (exc.path, exc.line) == (LOCK, 1)
    assert str(exc).startswith(f"{LOCK}:1: ")
    assert "local-inference-source-lock/v2" in str(exc)


def test_missing_format_line_names_the_first_line(r35_text: str) -> None:
    text = r35_text.split("\n", 1)[1]  # drop the format line
    exc = error(text)
    assert exc.line == 1
    assert f"format={FORMAT}" in str(exc) and "implementation.status" in str(exc)


def test_format_line_after_other_keys_is_not_accepted(r35_text: str) -> None:
    body = r35_text.split("\n", 1)[1]
    exc = error(
        "release.version=r35\n" + f"format={FORMAT}\n" + body.replace("release.version=r35\n", "")
    )
    assert exc.line == 1 and "release.version" in str(exc)


def test_empty_file_is_an_error() -> None:
    assert error("\n\n# nothing\n").line == 1


def test_abbreviated_commit_names_file_line_key_and_value(r35_text: str) -> None:
    n = line_no(r35_text, "vllm.commit")
    text = replace_line(r35_text, "vllm.commit", "vllm.commit=de982a50")
    exc = error(text)
    assert exc.line == n
    assert str(exc).startswith(f"{LOCK}:{n}: vllm.commit='de982a50'")
    assert "abbreviated" in str(exc) and "not the contract" in str(exc)


def test_branch_name_as_commit_is_refused_because_branches_are_not_the_contract(
    r35_text: str,
) -> None:
    n = line_no(r35_text, "lmcache.commit")
    exc = error(replace_line(r35_text, "lmcache.commit", "lmcache.commit=integration/glm53-r27"))
    assert exc.line == n
    assert "lmcache.commit='integration/glm53-r27'" in str(exc)
    assert "branch names" in str(exc) and "not the contract" in str(exc)


@pytest.mark.parametrize(
    "key",
    [
        "flashkda.base.commit",
        "vllm.native.csrc.tree",
        "b12x.package.tree",
        "vllm.tree",
        "flashinfer.commit",
    ],
)
def test_every_commit_and_tree_key_needs_a_full_sha(r35_text: str, key: str) -> None:
    value = parse_source_lock(r35_text, LOCK).keys[key]
    exc = error(replace_line(r35_text, key, f"{key}={value[:12]}"))
    assert exc.line == line_no(r35_text, key)
    assert key in str(exc) and value[:12] in str(exc)


def test_upper_case_sha_is_refused(r35_text: str) -> None:
    value = "DE982A50C6A3E4718E5CF9F00423A92192718DA1"
    exc = error(replace_line(r35_text, "vllm.commit", f"vllm.commit={value}"))
    assert exc.line == line_no(r35_text, "vllm.commit") and "upper-case" in str(exc)


def test_sha_with_trailing_space_is_refused_and_the_space_shown(r35_text: str) -> None:
    exc = error(
        replace_line(r35_text, "b12x.tree", "b12x.tree=d963f030c72a426753d2afa412b35d29eeb045f7 ")
    )
    assert "'d963f030c72a426753d2afa412b35d29eeb045f7 '" in str(exc)


def test_package_without_tree_names_the_commit_line(r35_text: str) -> None:
    exc = error(replace_line(r35_text, "b12x.tree", None))
    assert exc.line == line_no(r35_text, "b12x.commit")
    assert "b12x.tree" in str(exc)


def test_duplicate_key_names_both_lines(r35_text: str) -> None:
    text = r35_text + "vllm.commit=de982a50c6a3e4718e5cf9f00423a92192718da1\n"
    last = len(text.splitlines())
    exc = error(text)
    assert exc.line == last
    assert f"lines 25 and {last}" in str(exc) and "vllm.commit" in str(exc)


def test_missing_release_version_is_an_error(r35_text: str) -> None:
    text = replace_line(r35_text, "release.version", None)
    exc = error(text)
    assert "no release.version key" in str(exc)
    # where the file ends without it
    assert str(exc).startswith(f"{LOCK}:{len(text.splitlines())}: ")


def test_empty_release_version_names_its_line(r35_text: str) -> None:
    exc = error(replace_line(r35_text, "release.version", "release.version="))
    assert exc.line == 5


def test_required_package_missing_names_the_missing_key(r35_text: str) -> None:
    text = (
        "\n".join(line for line in r35_text.splitlines() if not line.startswith("lmcache.")) + "\n"
    )
    assert "lmcache" not in parse_source_lock(text, LOCK).packages  # fine unless required
    exc = error(text, required=["vllm", "b12x", "lmcache"])
    assert "lmcache.repository" in str(exc) and "lmcache.commit" in str(exc)


def test_required_package_half_present_names_the_line_of_the_half(r35_text: str) -> None:
    text = replace_line(r35_text, "b12x.commit", None)
    exc = error(text, required=["b12x"])
    assert exc.line == line_no(text, "b12x.repository")
    assert "missing b12x.commit" in str(exc)


def test_line_without_equals_names_the_line(r35_text: str) -> None:
    lines = r35_text.splitlines()
    lines.insert(9, "runtime.cuda.version 13.3")
    exc = error("\n".join(lines) + "\n")
    assert exc.line == 10
    assert str(exc).startswith(f"{LOCK}:10: 'runtime.cuda.version 13.3' is not key=value")


def test_empty_key_names_the_line(r35_text: str) -> None:
    exc = error(r35_text + "=orphan value\n")
    assert exc.line == len(r35_text.splitlines()) + 1 and "empty key" in str(exc)
