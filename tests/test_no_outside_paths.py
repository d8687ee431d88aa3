"""No tracked file names a place outside the checkout: a `shared` directory beside it, or an
absolute path of the machine it was written on. Neither exists in a
user's clone; cite the upstream source (repository, path,
commit) instead, and copy data the tests need into
tests/ (tests/corpus/lab/README.md says where from)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Written so that this file does not match itself.
OUTSIDE = re.compile(r"\.\./shared/|(?<![\w.~-])/wor[k]/|\bshared/(?:contracts|fixtures|seeds)\b")
# uv.lock is written by uv, not by people.
GENERATED = {"uv.lock"}


def tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_tracked_file_names_a_path_outside_the_checkout() -> None:
    found: dict[str, list[str]] = {}
    for rel in tracked():
        path = ROOT / rel
        if rel in GENERATED or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: the screenshots
        hits = [
            f"{rel}:{n}: {line.strip()}"
            for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line)
        ]
        if hits:
            found[rel] = hits
    wrong = [hit for hits in found.values() for hit in hits]
    assert not wrong, (
        "paths outside the checkout (cite the upstream source instead):\n" + "\n".join(wrong)
    )
