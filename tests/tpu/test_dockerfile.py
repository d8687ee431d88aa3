"""The Dockerfile's HARBOR_COMMIT line: found exactly
once, rewritten without touching anything else."""

from __future__ import annotations

import pytest

from resources.errors import FileFormatError
from tpu_assets.dockerfile import find_pin, pin_variable, set_pin

A, B = "a" * 40, "b" * 40
DOCKERFILE = f"""FROM python:3.12-slim\r
# 0.8.1, carries c49064a8\r
ENV HARBOR_COMMIT={A}   \r
RUN uv pip install --force-reinstall "harbor @ git+https://x@${{HARBOR_COMMIT}}"\r
"""


def test_pin_variable_follows_the_runbook_convention() -> None:
    assert (
        pin_variable("harbor") == "HARBOR_COMMIT"
        and pin_variable("tpu-inference") == "TPU_INFERENCE_COMMIT"
    )


def test_set_pin_changes_only_the_sha() -> None:
    out = set_pin(DOCKERFILE, "Dockerfile.tpu", "HARBOR_COMMIT", B)
    assert out == DOCKERFILE.replace(f"HARBOR_COMMIT={A}", f"HARBOR_COMMIT={B}")
    assert find_pin(out, "Dockerfile.tpu", "HARBOR_COMMIT").commit == B


def test_space_form_is_recognised() -> None:
    pin = find_pin(f"FROM x\nENV HARBOR_COMMIT {A}\n", "Dockerfile.tpu", "HARBOR_COMMIT")
    assert pin.line == 2 and pin.commit == A


def test_missing_line_is_an_error_naming_the_file() -> None:
    with pytest.raises(
        FileFormatError, match=r"^docker/Dockerfile.tpu:2: no `ENV HARBOR_COMMIT=<sha>` line"
    ):
        find_pin("# a comment\nFROM x\n", "docker/Dockerfile.tpu", "HARBOR_COMMIT")


def test_two_lines_are_an_error_naming_both() -> None:
    with pytest.raises(FileFormatError, match=r":3: `ENV HARBOR_COMMIT` is set on lines 1, 3"):
        find_pin(
            f"ENV HARBOR_COMMIT={A}\nFROM x\nENV HARBOR_COMMIT={B}\n",
            "Dockerfile.tpu",
            "HARBOR_COMMIT",
        )


def test_abbreviated_sha_is_an_error_naming_line_and_value() -> None:
    with pytest.raises(
        FileFormatError, match=r"Dockerfile.tpu:1: HARBOR_COMMIT='2dde0bbf' is not a full 40-hex"
    ):
        find_pin("ENV HARBOR_COMMIT=2dde0bbf\n", "Dockerfile.tpu", "HARBOR_COMMIT")


@pytest.mark.parametrize(
    ("text", "line", "shown"),
    [
        (f"FROM x\nENV HARBOR_COMMIT={A} OTHER=1\n", 2, "sets more than HARBOR_COMMIT"),
        (f"FROM x\nENV OTHER=1 HARBOR_COMMIT={A}\n", 2, "sets more than HARBOR_COMMIT"),
        (f"FROM x\nENV HARBOR_COMMIT=\\\n    {A}\n", 2, "continued onto line 3"),
        (f"FROM x\nENV HARBOR_COMMIT={A} \\\n    OTHER=1\n", 2, "continued onto line 3"),
        (
            f"FROM x\nRUN <<EOF\nENV HARBOR_COMMIT={A}\nEOF\n",
            3,
            "inside the here-document opened on line 2",
        ),
        (
            f"FROM x\nRUN <<-'EOF' bash\n\tENV HARBOR_COMMIT={A}\n\tEOF\n",
            3,
            "inside the here-document opened on line 2",
        ),
    ],
    ids=[
        "second_variable_after",
        "second_variable_before",
        "value_continued",
        "line_continued",
        "only_in_heredoc",
        "only_in_quoted_heredoc",
    ],
)
def test_the_pin_is_one_env_instruction_on_its_own_line_or_refused_at_it(
    text: str, line: int, shown: str
) -> None:
    with pytest.raises(FileFormatError) as info:
        find_pin(text, "Dockerfile.tpu", "HARBOR_COMMIT")
    assert str(info.value).startswith(f"Dockerfile.tpu:{line}: ") and shown in str(info.value), str(
        info.value
    )


def test_a_pin_beside_a_heredoc_that_mentions_it_is_the_one_found() -> None:
    text = f"FROM x\nENV HARBOR_COMMIT={A}\nRUN <<EOF\necho ENV HARBOR_COMMIT=$HARBOR_COMMIT\nEOF\n"
    assert find_pin(text, "Dockerfile.tpu", "HARBOR_COMMIT").line == 2
