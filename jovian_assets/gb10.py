"""The GB10 adaptation deltas as adoption checks (runbook:
"GB10 adaptation deltas", "Adopting a new lab rev").

- The runtime deviations: our Spark runtime follows the vLLM tree's own `requirements/cuda.txt`
  (CUDA 13.2 / torch 2.13.0+cu130 / flashinfer 0.6.17 / torch-bundled NCCL), the lab's RTX runtime
  is a documented deviation, "re-evaluate only when the tree pins change". The build dir documents
  them in `gb10-deviations.toml` with the tree pins they were written against; a rev whose tree
  moved those pins says so.
- Scattered pins: a rev is adopted as ONE set in
  `profiles/<rev>.env`, "never as scattered per-recipe
  [build.versions] copy-pastes"; a recipe whose
  `[build.versions]` sets a pin key is named with its lines.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationError

from jovian_assets.inputs import check_utf8
from jovian_assets.models import Finding
from resources.errors import FileFormatError
from resources.model import Model
from resources.tomlfile import key_line, load_toml

DEVIATIONS_FILE = "gb10-deviations.toml"
CUDA_REQUIREMENTS = "requirements/cuda.txt"
# The runtime the deviations are about (CUDA, torch, flashinfer, NCCL), by distribution name; the
# rest of requirements/cuda.txt (numba, ray, ...) is no GB10 delta.
_RUNTIME = re.compile(
    r"^(torch|flashinfer(-python|-cubin|-jit-cache)?|nvidia-nccl-cu\d+|nvidia-cuda-runtime(-cu\d+)?"
    r"|cuda-python|cuda-bindings)$"
)


class Deviation(Model):
    model_config = ConfigDict(extra="forbid")

    component: str = Field(min_length=1, description="CUDA, flashinfer, NCCL, ...")
    ours: str = Field(min_length=1, description="What the Spark build runs.")
    lab: str = Field(min_length=1, description="What the lab's RTX build runs.")
    why: str = ""


class Deviations(Model):
    """`gb10-deviations.toml`: the tree pins the deviations
    were last evaluated against, and the deviations."""

    model_config = ConfigDict(extra="forbid")

    tree_pins: dict[str, str] = Field(
        description="requirements/cuda.txt runtime pins (name -> version) when written."
    )
    deviation: list[Deviation] = Field(default_factory=list)


def parse_deviations(text: str, path: str) -> Deviations:
    """The deviations file, validated; a problem is a
    FileFormatError naming the line and the value."""
    from packaging.utils import canonicalize_name

    data = load_toml(Path(path), check_utf8(text, path))
    try:
        parsed = Deviations.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        line = next(
            (
                n
                for i in range(len(loc), 0, -1)
                if (n := key_line(text, tuple(loc[: i - 1]), loc[i - 1]))
            ),
            1,
        )
        raise FileFormatError(
            path, line, f"{'.'.join(loc) or 'file'}: {err['msg']} (got {err.get('input')!r:.80})"
        ) from None
    return parsed.model_copy(
        update={"tree_pins": {canonicalize_name(k): v for k, v in parsed.tree_pins.items()}}
    )


def runtime_pins(text: str, path: str) -> dict[str, str]:
    """The `name==version` runtime pins of a requirements
    file; an unparsable line names its line."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for number, raw in enumerate(check_utf8(text, path).splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):  # comments, -r/-c includes and options
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise FileFormatError(
                path, number, f"not a requirement: {line[:120]!r} ({exc})"
            ) from None
        name = canonicalize_name(req.name)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if _RUNTIME.match(name) and exact:
            pins[name] = exact[0]
    return pins


def deviations_finding(
    *, tree: str, cuda_txt: str | None, deviations_path: str, deviations_text: str | None
) -> Finding:
    """Whether the GB10 deviations were written against
    the runtime pins this tree declares (a WARN)."""
    if cuda_txt is None:
        return Finding(
            passed=False,
            description=f"{tree} has no {CUDA_REQUIREMENTS}: its runtime pins cannot be compared "
            f"with {deviations_path}",
        )
    try:
        now = runtime_pins(cuda_txt, f"{tree}:{CUDA_REQUIREMENTS}")
    except FileFormatError as exc:
        return Finding(passed=False, description=str(exc))
    shown = ", ".join(f"{k}=={v}" for k, v in now.items()) or "none"
    if deviations_text is None:
        return Finding(
            passed=False,
            description=(
                f"no {deviations_path}: the GB10 runtime deviations from the lab's (CUDA, "
                "flashinfer, NCCL) are not "
                f"documented for this build dir; the tree's runtime pins are {shown}. Write them "
                "down, with these pins."
            ),
        )
    try:
        recorded = parse_deviations(deviations_text, deviations_path)
    except FileFormatError as exc:
        return Finding(passed=False, description=str(exc))
    moved = []
    for name in sorted(now.keys() | recorded.tree_pins.keys()):
        before, after = recorded.tree_pins.get(name), now.get(name)
        if before != after:
            line = key_line(deviations_text, ("tree_pins",), name)
            moved.append(
                f"{name} {before or '(not pinned)'} -> {after or '(not pinned)'}"
                + (f" ({deviations_path}:{line})" if before and line else "")
            )
    documented = (
        "; ".join(f"{d.component} ours {d.ours} vs lab {d.lab}" for d in recorded.deviation)
        or "none"
    )
    if moved:
        return Finding(
            passed=False,
            description=(
                f"re-evaluate the GB10 runtime deviations: {tree}'s {CUDA_REQUIREMENTS} moved "
                f"since {deviations_path} "
                f"was written ({', '.join(moved)}). Documented deviations: {documented}. Check "
                "each against the new "
                "pins, then record them under [tree_pins]."
            ),
        )
    return Finding(
        passed=True,
        description=(
            f"{tree}'s runtime pins ({shown}) are the ones {deviations_path} was written "
            "against; deviations still "
            f"hold: {documented}"
        ),
    )


def recipe_pin_overrides(text: str, path: str, pin_keys: Collection[str]) -> Finding | None:
    """None when the recipe has no `[build.versions]`;
    else whether it sets any of the profile's pin keys."""
    data = load_toml(Path(path), check_utf8(text, path))
    build = data.get("build")
    versions = build.get("versions") if isinstance(build, dict) else None
    if versions is None:
        return None
    if not isinstance(versions, dict):
        raise FileFormatError(
            path,
            key_line(text, ("build",), "versions"),
            "build.versions must be a table of KEY = value",
        )
    scattered = [k for k in versions if k in pin_keys]
    if not scattered:
        return Finding(
            passed=True,
            description=f"{path}: [build.versions] sets no pin ({', '.join(versions) or 'empty'})",
        )
    lines = {k: key_line(text, ("build", "versions"), k) for k in scattered}
    return Finding(
        passed=False,
        description=(
            f"{path}:{min(n for n in lines.values() if n) if any(lines.values()) else 1}: "
            "[build.versions] overrides the "
            f"profile's pins {', '.join(f'{k} (line {n})' for k, n in lines.items())}: scattered "
            "per-recipe pins. Adopt "
            "the rev as ONE set in profiles/<rev>.env (or versions.env) and drop them from the "
            "recipe."
        ),
    )
