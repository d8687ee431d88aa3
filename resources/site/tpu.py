"""``[tpu]``: the harbor fork, the consumer repo that locks it, the image it builds and the file
probes run on it (the tpu code location's table)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field, StrictBool, field_validator

from resources.site.fields import (
    Branch,
    LocationSection,
    Owners,
    PackageName,
    RepoPath,
    RepoUrl,
    Table,
    checked,
)
from resources.site.promotion import PromotionSection
from resources.site.rules import check_image_repository, check_oci_tag


class Probe(Table):
    """A file probe: in the INSTALLED file, what must (and must not) follow an anchor line."""

    name: str
    path: str = Field(
        description=(
            "Path in the image; relative paths are under [tpu].site_packages. Globs allowed."
        )
    )
    anchor: str = Field(
        description="Regex for the anchor line, e.g. the guard `if existing_config != self.config:`"
    )
    within: int = Field(
        default=4, ge=1, description="How many lines after the anchor are looked at."
    )
    must_follow: str | None = Field(
        default=None, description="Regex that must match one of those lines."
    )
    must_not_follow: str | None = Field(
        default=None, description="Regex that must match none of those lines."
    )

    @field_validator("anchor", "must_follow", "must_not_follow")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regex: {exc}") from None
        return value


HARBOR_GUARD_PROBE = Probe(
    name="harbor_config_drift_guard",
    path="harbor/job.py",
    anchor=r"^\s*if existing_config != self\.config:\s*$",
    within=4,
    must_follow=r"logger\.warning\(",
    must_not_follow=r"^\s*raise\b",
)


class TpuSection(LocationSection):
    """``[tpu]``: the harbor fork, the consumer repo that locks it, and the image it builds."""

    REPOSITORY_KEYS: ClassVar[tuple[str, ...]] = ("harbor_repo", "consumer_repo")

    harbor_repo: RepoUrl
    harbor_branch: Branch
    harbor_package: PackageName = "harbor"
    consumer_repo: RepoUrl
    consumer_branch: Branch
    dockerfile: RepoPath = "docker/Dockerfile.tpu"
    build_script: RepoPath = "docker/build_tpu_kaniko.sh"
    image: Annotated[str, checked(check_image_repository, "image")] = Field(
        description="Image repository, e.g. ghcr.io/open-thoughts/openthoughts-agent"
    )
    floating_tag: Annotated[str, checked(check_oci_tag, "floating tag")] = Field(
        default="tpu", description="The tag other users pull; moved only by promote/rollback."
    )
    site_packages: str = "/opt/openthoughts/.venv/lib/python3.12/site-packages"
    smoke_command: list[str] = Field(
        default_factory=lambda: [
            "bash",
            "-lc",
            (
                "/opt/openthoughts/.venv/bin/python -c 'import harbor.job, importlib.metadata as "
                "m; "
                'print("harbor", m.version("harbor"))\''
            ),
        ],
        description="Run on the pinned tag as an iris job; exit 0 = smoke passed.",
    )
    probes: list[Probe] = Field(default_factory=lambda: [HARBOR_GUARD_PROBE])
    min_layers: int = Field(
        default=2, ge=1, description="One giant layer is not pullable over ghcr egress."
    )
    max_layer_bytes: int = Field(default=8 * 1024**3, gt=0)
    rebuild_on_lock_change: StrictBool = Field(
        default=False,
        description=(
            "Rebuild when only the lock moved (first-serve latency; not needed for correctness)."
        ),
    )
    auto_promote: StrictBool = Field(
        default=False, description="Promote each newly verified build (never while on hold)."
    )
    promotion: PromotionSection = Field(
        default_factory=PromotionSection,
        description="Soak time and freeze windows every promotion must pass.",
    )
    owners: Owners | None = Field(
        default=None, description="Owners of the tpu assets; unset: [site] owners."
    )
