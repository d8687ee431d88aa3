"""The GB10 adaptation deltas as pure checks: the
runtime deviations against the tree's cuda.txt, scattered
per-recipe pins, the sm121.checksum label, and the
sm12x patch script's idempotence (milliseconds)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jovian_assets.gb10 import (
    deviations_finding,
    parse_deviations,
    recipe_pin_overrides,
    runtime_pins,
)
from jovian_assets.node_build import CHECKSUM_LABEL, label_finding
from resources.errors import FileFormatError
from resources.site.jovian import SM12X_PATCHES
from sandbox import patch_cuda_sm12x
from sandbox.jovian_sources import GB10_DEVIATIONS, recipe_toml

CUDA_TXT = (
    "# CUDA runtime\n-r common.txt\nnumba==0.61.2\ntorch==2.13.0\nflashinfer-python==0.6.17  # "
    "the JIT kernels\n"
)
PATH = "jovian-judgement/gb10-deviations.toml"


def finding(cuda_txt: str | None = CUDA_TXT, text: str | None = GB10_DEVIATIONS):
    return deviations_finding(
        tree="vllm@63a82f8d1234", cuda_txt=cuda_txt, deviations_path=PATH, deviations_text=text
    )


def test_runtime_pins_are_the_cuda_torch_flashinfer_nccl_ones() -> None:
    text = CUDA_TXT + "nvidia-nccl-cu13==2.31.2\nray[cgraph]>=2.48\nTorch_Audio==2.13.0\n"
    assert runtime_pins(text, "cuda.txt") == {
        "torch": "2.13.0",
        "flashinfer-python": "0.6.17",
        "nvidia-nccl-cu13": "2.31.2",
    }
    with pytest.raises(FileFormatError, match=r"cuda\.txt:2: not a requirement: 'torch=2\.13'"):
        runtime_pins("numba==0.61.2\ntorch=2.13\n", "cuda.txt")


def test_deviations_written_against_the_trees_pins_hold() -> None:
    ok = finding()
    assert ok.passed and "torch==2.13.0, flashinfer-python==0.6.17" in ok.description
    assert (
        "CUDA ours 13.2 aarch64 vs lab 13.3" in ok.description
        and "NCCL ours torch-bundled vs lab 2.31.2" in ok.description
    )


def test_a_tree_that_moved_its_runtime_pins_says_re_evaluate_naming_pin_and_line() -> None:
    moved = finding(
        cuda_txt=CUDA_TXT.replace("torch==2.13.0", "torch==2.14.0") + "nvidia-nccl-cu13==2.32.0\n"
    )
    line = next(
        n for n, text in enumerate(GB10_DEVIATIONS.splitlines(), 1) if text.startswith("torch =")
    )
    assert not moved.passed and moved.description.startswith(
        "re-evaluate the GB10 runtime deviations: vllm@63a82f8d1234's"
    )
    assert f"torch 2.13.0 -> 2.14.0 ({PATH}:{line})" in moved.description
    assert "nvidia-nccl-cu13 (not pinned) -> 2.32.0" in moved.description
    # unchanged pins are not listed
    assert "flashinfer" not in moved.description.split("Documented")[0]


def test_missing_or_malformed_deviations_and_a_tree_without_cuda_txt_are_named() -> None:
    absent = finding(text=None)
    assert not absent.passed and absent.description.startswith(
        f"no {PATH}: the GB10 runtime deviations"
    )
    assert "torch==2.13.0" in absent.description
    assert (
        not finding(cuda_txt=None).passed
        and "has no requirements/cuda.txt" in finding(cuda_txt=None).description
    )
    bad = GB10_DEVIATIONS.replace('lab = "13.3"', "lab = 13.3")
    line = next(n for n, text in enumerate(bad.splitlines(), 1) if text == "lab = 13.3")
    with pytest.raises(
        FileFormatError, match=rf"{PATH}:{line}: deviation\.0\.lab: Input should be a valid string"
    ):
        parse_deviations(bad, PATH)
    typo = finding(text=GB10_DEVIATIONS.replace("[tree_pins]", "[tree_pin]"))
    assert not typo.passed and f"{PATH}:" in typo.description and "tree_pin" in typo.description


RECIPE = recipe_toml(
    lane="glm53-2x",
    image_tag="jovian-judgement:r27-glm53",
    build_dir="jovian-judgement",
    profile="r27",
)
PINS = {"VLLM_COMMIT", "VLLM_TREE", "B12X_COMMIT", "LMCACHE_COMMIT"}


def test_a_recipe_that_sets_profile_pins_in_build_versions_is_named_with_file_line_and_keys() -> (
    None
):
    ok = recipe_pin_overrides(RECIPE, "recipes/glm53-2x/recipe.toml", PINS)
    # TORCH_CUDA_ARCH_LIST is the lane's runtime, not a pin of the set
    assert ok is not None and ok.passed
    scattered = (
        RECIPE
        + 'VLLM_COMMIT = "62f6385c0000000000000000000000000000beef"\nB12X_COMMIT = "7216f6b9"\n'
    )
    lines = scattered.splitlines()
    vllm, b12x = lines.index(next(t for t in lines if t.startswith("VLLM_COMMIT"))) + 1, len(lines)
    found = recipe_pin_overrides(scattered, "recipes/glm53-2x/recipe.toml", PINS)
    assert found is not None and not found.passed
    assert found.description.startswith(
        f"recipes/glm53-2x/recipe.toml:{vllm}: [build.versions] overrides the profile's pins "
        f"VLLM_COMMIT (line {vllm}), B12X_COMMIT (line {b12x}): scattered per-recipe pins"
    )
    assert recipe_pin_overrides(RECIPE.split("[build.versions]")[0], "r.toml", PINS) is None
    with pytest.raises(FileFormatError, match=r"r\.toml:\d+: build\.versions must be a table"):
        recipe_pin_overrides('[build]\nversions = "r28"\n', "r.toml", PINS)


def test_the_checksum_label_unlabeled_is_the_informational_stale_warning() -> None:
    assert CHECKSUM_LABEL == "sm121.checksum"
    assert label_finding("jj:r28", {CHECKSUM_LABEL: "ab" * 32}, "ab" * 32).passed
    unlabeled = label_finding("jj:r28", {"lockstep.profile": "r28"}, "ab" * 32)
    assert not unlabeled.passed and unlabeled.description.startswith(
        "STALE: unlabeled jj:r28: no sm121.checksum label"
    )
    other = label_finding("jj:r28", {CHECKSUM_LABEL: "cd" * 32}, "ab" * 32)
    assert not other.passed and other.description.startswith(
        "STALE: jj:r28 carries sm121.checksum=cdcdcdcdcdcdcdcd..."
    )


def test_the_sm12x_patch_script_runs_in_full_and_is_idempotent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the gate asks for exactly the set the script applies
    assert tuple(patch_cuda_sm12x.PATCHES) == SM12X_PATCHES
    tree = tmp_path / "vllm"
    for rel, before, _ in patch_cuda_sm12x.PATCHES.values():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        with (tree / rel).open("a") as f:
            f.write(f"# the vLLM tree's own text\n{before}\n")
    assert patch_cuda_sm12x.main(tree) == 0
    # Each patch rewrote its line and left no record:
    # its effect in the code is what a gate can check.
    for name, (rel, before, after) in patch_cuda_sm12x.PATCHES.items():
        lines = (tree / rel).read_text().splitlines()
        assert after in lines and before not in lines, name
    assert not [p for p in tree.rglob("*.json")]
    first = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert patch_cuda_sm12x.main(tree) == 0
    # a re-run changes nothing
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == first
    assert capsys.readouterr().out.count("already applied") == len(SM12X_PATCHES)
    shutil.rmtree(tree / "csrc")
    assert patch_cuda_sm12x.main(tree) == 1
    assert "sm120_cooperative_topk: csrc/cache_kernels.cu has no line" in capsys.readouterr().err
