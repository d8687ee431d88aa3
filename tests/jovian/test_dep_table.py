"""The vLLM tree's cmake dependency table, the fetch-deps.sh gate list, and the diffs between them.

Each real cmake pattern lives in its own small tree under cmake_samples/; rev_a and rev_b are an
r35-like and an r39-like tree (cutlass v4.4.2 -> v4.7.1, DeepGEMM moved to the vllm-project fork,
DeepSelect added, qutlass dropped).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jovian_assets.dep_table import (
    DepRow,
    diff_gates,
    diff_tables,
    is_cuda_path,
    parse_gates,
    parse_tree,
    to_rows_json,
    unresolved_finding,
)
from resources.errors import FileFormatError

SAMPLES = Path(__file__).parent / "cmake_samples"
EP = "cmake/external_projects"


def rows_of(tree: str) -> list[DepRow]:
    return parse_tree(SAMPLES / tree)


def by_name(rows: list[DepRow]) -> dict[str, DepRow]:
    return {r.name: r for r in rows}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


# -- the real cmake patterns -----------------------------------------------------------------------


def test_literal_pairs_with_comments_multiline_and_quoted_arguments() -> None:
    rows = rows_of("literal_pair")
    # the pins inside comments (line and bracket) are not rows
    assert [r.name for r in rows] == ["qutlass", "flashmla"]
    qutlass, flashmla = rows
    assert qutlass.repository == "https://github.com/IST-DASLab/qutlass.git"
    assert qutlass.tag == "e74319e3a1b2c3d4e5f60718293a4b5c6d7e8f90"
    assert (qutlass.file, qutlass.line, qutlass.kind) == (f"{EP}/qutlass.cmake", 8, "declare")
    assert qutlass.condition is None and qutlass.unresolved == [] and qutlass.submodules == []
    assert qutlass.source_dir_override is None
    assert (flashmla.repository, flashmla.tag, flashmla.line) == (
        "https://github.com/vllm-project/FlashMLA",
        "a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0",
        18,
    )


def test_set_indirection_earlier_in_the_same_file() -> None:
    [row] = rows_of("same_file_set")
    # ${_FLASHKDA_OWNER} resolved too
    assert row.repository == "https://github.com/vllm-project/FlashKDA.git"
    assert row.tag == "3b225bf26bb8e218928a1fe14751cb48cf31d11b"  # not the set() after the declare
    assert row.submodules == ["cutlass"]
    assert row.unresolved == []


def test_tag_variable_from_the_top_level_cmakelists() -> None:
    rows = by_name(rows_of("top_level_var"))
    assert rows["cutlass_fa3"].tag == "v4.7.1"
    assert rows["cutlass_fa3"].repository == "https://github.com/nvidia/cutlass.git"
    # a file's own set() shadows the top-level one
    assert rows["deepgemm"].tag == "8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5"


def test_else_branch_of_rocm_gives_two_rows_with_their_conditions() -> None:
    rows = [r for r in rows_of("rocm_branches") if r.name == "triton_kernels"]
    assert [(r.repository, r.tag, r.condition) for r in rows] == [
        ("https://github.com/ROCm/triton.git", "v3.5.1", 'VLLM_GPU_LANG STREQUAL "HIP"'),
        (
            "https://github.com/triton-lang/triton.git",
            "v3.5.1",
            'NOT (VLLM_GPU_LANG STREQUAL "HIP")',
        ),
    ]
    assert [is_cuda_path(r) for r in rows] == [False, True]
    assert all(r.line == 9 for r in rows)  # both rows come from the one declare


def test_if_elseif_else_declares_carry_the_negated_earlier_conditions() -> None:
    rows = [r for r in rows_of("rocm_branches") if r.name == "vllm-flash-attn"]
    assert [r.condition for r in rows] == [
        "USE_ROCM",
        (
            'NOT (USE_ROCM) AND (VLLM_GPU_LANG STREQUAL "CUDA" AND CMAKE_CUDA_COMPILER_VERSION '
            "VERSION_GREATER_EQUAL 12.8)"
        ),
        (
            'NOT (USE_ROCM) AND NOT (VLLM_GPU_LANG STREQUAL "CUDA" AND '
            "CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)"
        ),
    ]
    assert [r.tag[:8] for r in rows if r.tag] == ["11111111", "f3e1a4f7", "22222222"]
    assert [is_cuda_path(r) for r in rows] == [False, True, True]


def test_git_submodules_lists_quoted_from_a_variable_and_empty() -> None:
    rows = by_name(rows_of("submodules"))
    assert rows["deepgemm"].submodules == ["third-party/cutlass", "third-party/deep_jit"]
    assert rows["msa"].submodules == ["csrc/cutlass", "csrc/kerutils"]
    assert rows["tvm_ffi"].submodules == []
    assert rows["tvm_ffi"].tag == "v0.1.0"


def test_fetchcontent_populate_with_download_arguments_is_a_row() -> None:
    rows = rows_of("populate")
    assert [(r.name, r.kind) for r in rows] == [("fmha_sm100", "populate"), ("tml_fa4", "declare")]
    fmha = rows[0]
    assert fmha.repository == "https://github.com/example-lab/fmha-sm100.git"
    assert fmha.tag == "5a5b5c5d5e5f505152535455565758595a5b5c5d"
    # SOURCE_DIR next to a download is where it lands, not an override
    assert fmha.source_dir_override is None
    # FetchContent_Populate(tml_fa4) of the earlier declare adds no second row
    assert rows[1].line == 1


def test_src_dir_override_is_recorded_and_the_download_row_kept() -> None:
    rows = by_name(rows_of("src_dir_override"))
    deepgemm = rows["deepgemm"]
    assert deepgemm.source_dir_override == "DEEPGEMM_SRC_DIR"
    assert deepgemm.tag == "8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5"
    assert deepgemm.condition == "NOT (DEEPGEMM_SRC_DIR)"
    assert deepgemm.submodules == ["third-party/cutlass", "third-party/deep_jit"]
    triton = rows["triton_kernels"]
    assert triton.source_dir_override == "$ENV{TRITON_KERNELS_SRC_DIR}"
    assert triton.condition == "NOT (DEFINED ENV{TRITON_KERNELS_SRC_DIR})"
    assert is_cuda_path(deepgemm) and is_cuda_path(triton)
    assert len(rows_of("src_dir_override")) == 2  # the SOURCE_DIR-only declares are not rows


def test_unresolvable_variables_are_reported_and_the_row_kept() -> None:
    [row] = rows_of("unresolved")
    assert row.tag == "${NOPE}"
    assert row.repository == "https://github.com/$ENV{MYSTERY_OWNER}/mystery.git"
    assert row.unresolved == ["ENV{MYSTERY_OWNER}", "NOPE"]


def test_top_level_cmakelists_declare_is_a_row_with_its_cache_variable_and_override() -> None:
    cutlass = by_name(rows_of("rev_a"))["cutlass"]
    # set(... CACHE STRING "doc")
    assert (cutlass.file, cutlass.tag) == ("CMakeLists.txt", "v4.4.2")
    assert cutlass.condition == 'VLLM_GPU_LANG STREQUAL "CUDA" AND NOT (VLLM_CUTLASS_SRC_DIR)'
    assert cutlass.source_dir_override == "VLLM_CUTLASS_SRC_DIR"
    assert is_cuda_path(cutlass)


def test_rows_come_in_file_order_cmakelists_first_then_sorted_project_files() -> None:
    assert [(r.name, r.file) for r in rows_of("rev_a")] == [
        ("cutlass", "CMakeLists.txt"),
        ("deepgemm", f"{EP}/deepgemm.cmake"),
        ("flashmla", f"{EP}/flashmla.cmake"),
        ("qutlass", f"{EP}/qutlass.cmake"),
        ("triton_kernels", f"{EP}/triton_kernels.cmake"),
        ("triton_kernels", f"{EP}/triton_kernels.cmake"),
    ]


def test_to_rows_json_is_plain_json_with_the_cli_keys() -> None:
    data = json.loads(json.dumps(to_rows_json(rows_of("src_dir_override"))))
    assert data[0] == {
        "name": "deepgemm",
        "repository": "https://github.com/deepseek-ai/DeepGEMM.git",
        "tag": "8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5",
        "submodules": ["third-party/cutlass", "third-party/deep_jit"],
        "condition": "NOT (DEEPGEMM_SRC_DIR)",
        "unresolved": [],
    }


# -- the tokenizer on awkward but legal cmake ------------------------------------------------------


def test_escaped_quotes_brackets_generator_expressions_and_lowercase_commands(
    tmp_path: Path,
) -> None:
    root = write_tree(
        tmp_path,
        {
            "CMakeLists.txt": (
                'install(CODE "file(WRITE \\"${X}\\" \\"(unbalanced\\")" COMPONENT x)\n'
            ),
            f"{EP}/odd.cmake": (
                "target_compile_options(t PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-UPy_LIMITED_API>)\n"
                "set(_TAG [=[v1.2.3]=])\n"
                "fetchcontent_declare(odd\n"
                "  GIT_REPOSITORY https://github.com/example-lab/odd.git\n"
                '  GIT_TAG "${_TAG}")  # trailing comment (with parens)\n'
                'message(STATUS "a ) inside quotes and a \\" too")\n'
            ),
        },
    )
    [row] = parse_tree(root)
    assert (row.name, row.tag, row.line) == ("odd", "v1.2.3", 3)


def test_set_with_parent_scope_and_a_list_value(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            f"{EP}/x.cmake": "set(_REPO https://github.com/example-lab/x.git PARENT_SCOPE)\n"
            "FetchContent_Declare(x GIT_REPOSITORY ${_REPO} GIT_TAG v1)\n",
        },
    )
    [row] = parse_tree(root)
    assert row.repository == "https://github.com/example-lab/x.git"


def test_cache_reference_resolves_like_the_variable(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "CMakeLists.txt": (
                'set(CUTLASS_REVISION "v4.4.2" CACHE STRING "CUTLASS revision to use" FORCE)\n'
            ),
            f"{EP}/x.cmake": (
                "FetchContent_Declare(x GIT_REPOSITORY https://github.com/nvidia/cutlass "
                "GIT_TAG $CACHE{CUTLASS_REVISION})\n"
            ),
        },
    )
    [row] = parse_tree(root)
    assert (row.tag, row.unresolved) == ("v4.4.2", [])


def test_variable_set_in_one_branch_only_keeps_that_branch_condition(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            f"{EP}/x.cmake": 'set(_TAG v1)\nif(VLLM_GPU_LANG STREQUAL "HIP")\n  set(_TAG '
            "v1-rocm)\nendif()\n"
            "FetchContent_Declare(x GIT_REPOSITORY https://github.com/example-lab/x.git GIT_TAG "
            "${_TAG})\n",
        },
    )
    rows = parse_tree(root)
    assert [(r.tag, r.condition) for r in rows] == [
        ("v1", None),
        ("v1-rocm", 'VLLM_GPU_LANG STREQUAL "HIP"'),
    ]
    assert [is_cuda_path(r) for r in rows] == [True, False]


def test_declare_inside_a_branch_ignores_sets_from_the_sibling_branch(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            f"{EP}/x.cmake": "if(USE_ROCM)\n  set(_TAG rocm)\nelse()\n  set(_TAG cuda)\n"
            "  FetchContent_Declare(x GIT_REPOSITORY https://github.com/example-lab/x.git "
            "GIT_TAG ${_TAG})\nendif()\n",
        },
    )
    [row] = parse_tree(root)
    assert (row.tag, row.condition) == ("cuda", "NOT (USE_ROCM)")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("FetchContent_Declare(x\n  GIT_TAG v1\n", 1, "never closed"),
        ('set(A "v1)\nset(B v2)\n', 1, "quoted argument is never closed"),
        ("set(A v1)\nendif()\n", 2, "endif() without an open if()"),
        ("set(A v1)\nif(X)\n  set(A v2)\n", 2, "no matching endif()"),
        ("if(X)\nelse()\nelse()\nendif()\n", 3, "after the else()"),
        ("set(A v1)\n= oops\n", 2, "expected a cmake command"),
        ("set(A v1)\nmessage STATUS\n", 2, "not followed by '('"),
        ("#[[ never closed\nset(A v1)\n", 1, "bracket comment"),
    ],
)
def test_malformed_cmake_is_an_error_naming_file_and_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    write_tree(tmp_path, {"CMakeLists.txt": "project(x)\n", f"{EP}/bad.cmake": text})
    with pytest.raises(FileFormatError) as info:
        parse_tree(tmp_path)
    assert (info.value.path, info.value.line) == (f"{EP}/bad.cmake", line)
    assert words in info.value.message


def test_a_directory_that_is_not_a_vllm_tree_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileFormatError, match="not a vLLM source tree"):
        parse_tree(tmp_path)


# -- which rows a CUDA build fetches ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "cuda"),
    [
        (None, True),
        ('VLLM_GPU_LANG STREQUAL "HIP"', False),
        ('NOT (VLLM_GPU_LANG STREQUAL "HIP")', True),
        ('VLLM_GPU_LANG STREQUAL "CUDA"', True),
        ('NOT (VLLM_GPU_LANG STREQUAL "CUDA")', False),
        ('(VLLM_GPU_LANG STREQUAL "CUDA" OR VLLM_GPU_LANG STREQUAL "HIP")', True),
        ('VLLM_GPU_LANG STREQUAL "CUDA" AND NOT (VLLM_CUTLASS_SRC_DIR)', True),
        ('NOT (DEEPGEMM_SRC_DIR) AND VLLM_GPU_LANG STREQUAL "HIP"', False),
        ("USE_ROCM", False),
        ("NOT (USE_ROCM)", True),
        ("DEFINED ENV{ROCM_PATH}", False),
        ("HIP_FOUND AND NOT CUDA_FOUND", False),
        ("NOT (DEFINED CUDA_ARCHS)", True),  # mentions CUDA but picks no platform
        ("CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.9", True),
        ('VLLM_GPU_LANG MATCHES "HIP|CUDA"', True),
        ("CHIPSET_FOUND", True),  # HIP inside a word is not HIP
    ],
)
def test_is_cuda_path(condition: str | None, cuda: bool) -> None:
    assert is_cuda_path(DepRow(name="x", condition=condition, file="f", line=1)) is cuda


# -- fetch-deps.sh gates ---------------------------------------------------------------------------

GATES = "jovian-judgement/fetch-deps.sh"


def sample_gates() -> str:
    return (SAMPLES / "rev_a.fetch-deps.sh").read_text(encoding="utf-8")


def test_gate_lines_parse_with_continuations_comments_and_subdirs() -> None:
    gates = parse_gates(sample_gates(), GATES)
    assert [(g.name, g.line) for g in gates] == [
        ("cutlass", 12),
        ("flashmla", 13),
        ("DeepGEMM", 14),
        ("triton_kernels", 16),
        ("qutlass", 17),
        ("tilelang", 18),
    ]
    deepgemm = gates[2]
    assert deepgemm.repository == "https://github.com/deepseek-ai/DeepGEMM"
    assert deepgemm.tag == "8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5"
    assert deepgemm.subdirs == ["third-party/cutlass", "third-party/fmt"]
    assert gates[3].subdirs == []  # the trailing '# ...' is a comment


def test_a_comment_ending_in_backslash_does_not_swallow_the_next_gate() -> None:
    gates = parse_gates(
        "# see below \\\ngate flashmla https://github.com/vllm-project/FlashMLA v1\n", GATES
    )
    assert [(g.name, g.line) for g in gates] == [("flashmla", 2)]


@pytest.mark.parametrize(
    "line",
    [
        "gate cutlass https://github.com/NVIDIA/cutlass",
        'gate "$name" "$repo" "$tag"',
        "gate cutlass 'https://github.com/NVIDIA/cutlass v4.4.2",
    ],
)
def test_malformed_gate_line_names_file_and_line(line: str) -> None:
    with pytest.raises(FileFormatError) as info:
        parse_gates(f"#!/usr/bin/env bash\n\n{line}\n", GATES)
    assert (info.value.path, info.value.line) == (GATES, 3)
    assert str(info.value).startswith(f"{GATES}:3: ")


def test_matching_tree_and_gates_have_nothing_ungated_and_skip_the_rocm_row() -> None:
    diff = diff_gates(rows_of("rev_a"), parse_gates(sample_gates(), GATES))
    # names compare case-insensitively, repositories without .git and case
    assert sorted(m.row.name for m in diff.matched) == [
        "cutlass",
        "deepgemm",
        "flashmla",
        "qutlass",
        "triton_kernels",
    ]
    assert diff.added == [] and diff.moved == [] and diff.ungated_cuda_pins == []
    assert not diff.blocking
    assert [g.name for g in diff.removed] == ["tilelang"]  # a gate no row declares


def test_new_rev_tree_against_old_gates_shows_added_moved_removed_and_ungated() -> None:
    diff = diff_gates(rows_of("rev_b"), parse_gates(sample_gates(), GATES))
    assert [r.name for r in diff.added] == ["deepselect"]
    moved = {m.name: m for m in diff.moved}
    assert set(moved) == {"cutlass", "deepgemm"}
    assert moved["cutlass"].change == "tag v4.4.2 -> v4.7.1"
    assert (moved["cutlass"].old_tag, moved["cutlass"].new_tag, moved["cutlass"].gate_line) == (
        "v4.4.2",
        "v4.7.1",
        12,
    )
    assert moved["deepgemm"].change == (
        "tag 8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5 -> c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00; "
        "repository https://github.com/deepseek-ai/DeepGEMM -> https://github.com/vllm-project/DeepGEMM.git"
    )
    assert [g.name for g in diff.removed] == ["qutlass", "tilelang"]
    assert sorted(r.name for r in diff.ungated_cuda_pins) == ["cutlass", "deepgemm", "deepselect"]
    assert diff.blocking
    assert sorted(m.row.name for m in diff.matched) == ["flashmla", "triton_kernels"]


def test_repository_swap_with_the_same_tag_is_still_ungated() -> None:
    rows = [
        DepRow(
            name="b12x",
            repository="https://github.com/other-owner/b12x.git",
            tag="v1",
            file="f",
            line=1,
        )
    ]
    gates = parse_gates("gate b12x https://github.com/voipmonitor/b12x v1\n", GATES)
    diff = diff_gates(rows, gates)
    assert [m.change for m in diff.moved] == [
        "repository https://github.com/voipmonitor/b12x -> https://github.com/other-owner/b12x.git"
    ]
    assert diff.ungated_cuda_pins == rows


def test_unresolved_tag_can_never_be_gated() -> None:
    rows = rows_of("unresolved")
    diff = diff_gates(
        rows, parse_gates("gate mystery https://github.com/x/mystery.git v1\n", GATES)
    )
    assert diff.ungated_cuda_pins == rows


# -- this rev against the previous rev -------------------------------------------------------------


def test_table_diff_across_two_revs() -> None:
    diff = diff_tables(rows_of("rev_a"), rows_of("rev_b"))
    assert [r.name for r in diff.added] == ["deepselect"]
    assert [r.name for r in diff.removed] == ["qutlass"]
    moved = {m.name: m for m in diff.moved}
    assert set(moved) == {"cutlass", "deepgemm"}
    assert moved["cutlass"].change == "tag v4.4.2 -> v4.7.1"
    assert (
        moved["cutlass"].condition == 'VLLM_GPU_LANG STREQUAL "CUDA" AND NOT (VLLM_CUTLASS_SRC_DIR)'
    )
    assert (
        "repository https://github.com/deepseek-ai/DeepGEMM.git -> https://github.com/vllm-project/DeepGEMM.git"
        in moved["deepgemm"].change
    )
    assert (
        "submodules ['third-party/cutlass', 'third-party/fmt'] -> ['third-party/cutlass', "
        "'third-party/deep_jit']"
    ) in moved["deepgemm"].change


def test_table_diff_of_a_tree_with_itself_is_empty_and_rows_json_round_trips() -> None:
    rows = rows_of("rev_b")
    assert diff_tables(rows, rows).model_dump() == {"added": [], "moved": [], "removed": []}
    # the asset rebuilds the previous rev's rows from
    # rows_json: the diff must still key the same way
    again = [DepRow(file="", line=0, **r) for r in to_rows_json(rows)]  # type: ignore[arg-type]
    assert diff_tables(again, rows).model_dump() == {"added": [], "moved": [], "removed": []}


# -- outside values held to their rules; unresolved variables named --------------------------------


def test_unresolved_variables_are_a_failed_finding_naming_file_line_and_variable() -> None:
    finding = unresolved_finding(rows_of("unresolved"))
    assert not finding.passed
    assert f"{EP}/mystery.cmake:1: mystery $ENV{{MYSTERY_OWNER}}, ${{NOPE}}" in finding.description
    assert unresolved_finding(rows_of("rev_a")).passed


def test_lab_dep_table_cli_marks_unresolved_rows_in_json_and_on_stderr() -> None:
    from click.testing import CliRunner

    from lockstep.cli import main

    tree = SAMPLES / "unresolved"
    out = CliRunner().invoke(main, ["lab", "dep-table", str(tree)])
    assert out.exit_code == 1  # the table is printed, but a pin nobody can fetch fails the command
    assert json.loads(out.stdout)[0]["unresolved"] == ["ENV{MYSTERY_OWNER}", "NOPE"]
    assert (
        f"{tree}/{EP}/mystery.cmake:1: mystery: unresolved $ENV{{MYSTERY_OWNER}} (set nowhere "
        "that reaches this use), "
        "${NOPE} (set nowhere that reaches this use)"
    ) in out.stderr
    assert "1 of 1 pins did not resolve" in out.stderr and "Traceback" not in out.output


def test_lab_dep_table_cli_fails_on_a_recursive_tag_and_an_option_shaped_repository(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from lockstep.cli import main

    recursive = write_tree(
        tmp_path / "recursive",
        {
            f"{EP}/dep.cmake": 'set(DEP_TAG "${DEP_TAG}")\nFetchContent_Declare(dep\n'
            "  GIT_REPOSITORY https://github.com/example-lab/dep.git\n  GIT_TAG ${DEP_TAG})\n"
        },
    )
    out = CliRunner().invoke(main, ["lab", "dep-table", str(recursive)])
    assert out.exit_code == 1
    assert (
        f"{recursive}/{EP}/dep.cmake:2: dep: unresolved ${{DEP_TAG}} (recursive: its only "
        "set() refers to itself)"
    ) in out.stderr
    option = write_tree(
        tmp_path / "option",
        {
            f"{EP}/dep.cmake": "FetchContent_Declare(dep\n"
            '  GIT_REPOSITORY "--upload-pack=${HOOK}"\n  GIT_TAG v1.0)\n'
        },
    )
    out = CliRunner().invoke(main, ["lab", "dep-table", str(option)])
    # a file that cannot be read as a table
    assert out.exit_code == 3 and "Traceback" not in out.output
    assert (
        f"{option}/{EP}/dep.cmake:2: GIT_REPOSITORY '--upload-pack=${{HOOK}}' starts with '-'"
        in out.output
    )


def test_a_pin_from_a_top_level_set_is_refused_at_that_set(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "CMakeLists.txt": 'project(vllm)\nset(CUTLASS_REVISION "--upload-pack=x")\n',
            f"{EP}/cutlass.cmake": "FetchContent_Declare(cutlass\n  GIT_REPOSITORY https://github.com/NVIDIA/cutlass.git\n"
            "  GIT_TAG ${CUTLASS_REVISION})\n",
        },
    )
    with pytest.raises(FileFormatError) as info:
        parse_tree(root)
    assert (info.value.path, info.value.line) == ("CMakeLists.txt", 2)
    assert (
        "'--upload-pack=x' is not a valid git ref name" in info.value.message
        and f"{EP}/cutlass.cmake:3" in info.value.message
    )


def test_a_well_formed_tree_still_parses_with_every_rule_applied() -> None:
    for tree in (
        "literal_pair",
        "populate",
        "rev_a",
        "rev_b",
        "rocm_branches",
        "same_file_set",
        "src_dir_override",
        "submodules",
        "top_level_var",
    ):
        assert rows_of(tree), tree
