"""The order CI's workers take the modules in (`./dev test`): heavy first, heaviest first, as
tests/conftest.py sorts them. pytest-xdist's --dist loadfile requeues the modules by their number of
tests, most first, unless told not to: the heavy modules (minutes each, one to five tests) then ran
last, and one worker ended alone on a long one."""

from __future__ import annotations

import re
from pathlib import Path

from _pytest.config.argparsing import Parser
from xdist.plugin import pytest_addoption as xdist_options

DEV = Path(__file__).resolve().parents[1] / "dev"


def dev_test_args() -> list[str]:
    """The pytest arguments of `./dev test`, its continuation lines joined."""
    text = DEV.read_text(encoding="utf-8").replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if re.match(r"\s*test\)", ln)]
    return [a for a in line.split(" pytest ", 1)[1].split() if a not in ('"$@"', ";;")]


def parsed(args: list[str]) -> dict[str, object]:
    """`args` as xdist's own options read them."""
    parser = Parser(_ispytest=True)
    xdist_options(parser)
    return vars(parser.parse_known_args(args))


def test_dev_test_keeps_the_heavy_first_order() -> None:
    options = parsed(dev_test_args())
    assert options["dist"] == "loadfile"  # a module's fixtures start once, on one worker
    assert options["loadscopereorder"] is False


def test_xdist_reorders_by_test_count_unless_told_not_to() -> None:
    """Why ./dev says so: the default would undo the heavy-first order."""
    assert parsed(["--dist", "loadfile"])["loadscopereorder"] is True
