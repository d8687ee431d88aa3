"""The sandbox's harbor fork: an installable package whose job.py carries the runbook's two guards.

Near the top of `Job`, the config-drift guard ``if existing_config != self.config:`` — the resume
killer: it raised ``FileExistsError`` (the bug) until the fix made it ``logger.warning(...)``.
Far below, the per-trial reconciler's ``raise FileExistsError`` is legitimate and stays, so a
naive grep for the raise finds a hit even in a fixed build (runbook §4).
"""

from __future__ import annotations

import re
from pathlib import Path

GUARD = "        if existing_config != self.config:\n"
BUG = (
    "            raise FileExistsError(\n"
    '                f"job dir {self.job_dir} already holds a different config; refusing to '
    'resume"\n'
    "            )\n"
)
FIX = (
    "            logger.warning(\n"
    '                "job dir %s holds a different config; resuming with the new one", '
    "self.job_dir\n"
    "            )\n"
)
GUARD_LINE = 275  # about where the guard sits on :tpu-abd6dc86
TRIAL_RAISE_LINE = 841  # about where the legitimate per-trial raise sits


def _filler(first: int, count: int) -> str:
    # Small real methods so the file has the shape (and line numbers) of the real job.py.
    return "".join(
        f"    def _stage_{n:03d}(self, value: int) -> int:\n        return value + {n}\n\n"
        for n in range(first, first + count)
    )


def pyproject(version: str) -> str:
    return f"""[project]
name = "harbor"
version = "{version}"
description = "Agent evaluation harness (lockstep sandbox copy of the marin-community fork)"
requires-python = ">=3.10"
dependencies = []

[project.optional-dependencies]
daytona = []

[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
"""


# harbor's in-tree build backend (written as backend.py): uv builds harbor from git with no package
# index, inside the image build as on the host.
BACKEND_PY = (Path(__file__).resolve().parent / "templates" / "harbor_backend.py").read_text(
    encoding="utf-8"
)


def init_py(version: str, revision: int) -> str:
    return (
        f'"""harbor: agent evaluation harness."""\n\n__version__ = "{version}"\nREVISION = '
        f"{revision}\n"
    )


def job_py(fixed: bool) -> str:
    head = (
        '"""harbor.job: runs a job of trials, resumable from its job dir."""\n\n'
        "from __future__ import annotations\n\n"
        "import json\nimport logging\nfrom pathlib import Path\n\n"
        "logger = logging.getLogger(__name__)\n\n\n"
        "class Job:\n"
        "    def __init__(self, config: dict, job_dir: Path) -> None:\n"
        "        self.config = config\n"
        "        self.job_dir = Path(job_dir)\n\n"
        "    def _load_existing_config(self) -> dict | None:\n"
        '        path = self.job_dir / "config.json"\n'
        "        return json.loads(path.read_text()) if path.exists() else None\n\n"
    )
    resume = (
        "    def _check_resume(self) -> None:\n"
        "        existing_config = self._load_existing_config()\n"
        "        if existing_config is None:\n"
        "            return\n" + GUARD + (FIX if fixed else BUG)
    )
    trial = (
        "    def _reconcile_trial(self, trial_dir: Path) -> None:\n"
        '        if trial_dir.exists() and not (trial_dir / "result.json").exists():\n'
        '            raise FileExistsError(f"trial dir {trial_dir} exists without a result; '
        'remove it to rerun")\n'
    )
    lines_before_guard = head.count("\n") + 4
    text = head + _filler(1, (GUARD_LINE - lines_before_guard - 1) // 3) + resume
    text += "\n" + _filler(200, (TRIAL_RAISE_LINE - text.count("\n") - 4) // 3) + trial
    return text


def apply_fix(text: str) -> str:
    if GUARD + BUG not in text:
        raise ValueError("harbor/job.py has no unfixed config-drift guard to fix")
    return text.replace(GUARD + BUG, GUARD + FIX)


def bump_patch(version: str) -> str:
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"cannot bump version {version!r}")
    return f"{m[1]}.{m[2]}.{int(m[3]) + 1}"
