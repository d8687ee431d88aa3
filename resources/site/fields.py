"""The site file's building blocks: the strict table base, and outside names as checked field types.

Shared by the table modules of resources/site/ (each key is checked by its kind's rule in
resources/names.py, so a bad value fails at load with the file, line and value).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from dagster._core.definitions.utils import is_valid_owner
from pydantic import AfterValidator, ConfigDict, field_validator

from resources.model import Model
from resources.names import KNOWN_SCHEMES, check_name, check_ref, check_relative_path, check_url

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")


class Table(Model):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _env_names_only(cls, value: Any, info: Any) -> Any:
        if info.field_name.endswith("_env") and value is not None and not ENV_NAME.match(value):
            raise ValueError(
                "must be the NAME of an environment variable (like GHCR_TOKEN), "
                "never the secret itself"
            )
        return value


def site_relative(site_file: Path, value: str) -> Path:
    """A path from the site file: relative ones are relative to the directory of the file itself (a
    symlinked site file: of the file it links to,
    resolved now, so a ConfigMap update is followed)."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else (site_file.resolve().parent / p).resolve()


def check_owners(value: list[str]) -> list[str]:
    # Dagster's own rule, so a bad owner fails here with file:line rather than at definitions load.
    for owner in value:
        if not is_valid_owner(owner):
            raise ValueError(f"owner {owner!r} must be an email address or 'team:<name>'")
    return value


Owners = Annotated[list[str], AfterValidator(check_owners)]


class LocationSection(Table):
    """A table that configures one code location, named as the location is ([tpu], [jovian]).

    Each declares its own `owners` key (where it sits among the table's keys is the table's, so
    it is not a field of this base); `REPOSITORY_KEYS` name its keys that hold repository URLs.
    """

    REPOSITORY_KEYS: ClassVar[tuple[str, ...]] = ()
    if TYPE_CHECKING:
        owners: list[str] | None


def repo_url(value: str) -> str:
    """A repository URL's shape (never an option, a
    remote helper or a bare path); whether its scheme
    is one this site allows is SiteConfig's check, which sees [site] url_schemes."""
    return check_url("repository URL", value, KNOWN_SCHEMES)


def checked(check: Callable[[str, object], str], kind: str) -> AfterValidator:
    return AfterValidator(lambda value: check(kind, value))


# Outside names as field types: each key is checked by its kind's rule in resources/names.py.
RepoUrl = Annotated[str, AfterValidator(repo_url)]
Branch = Annotated[str, checked(check_ref, "branch")]
RepoPath = Annotated[str, checked(check_relative_path, "path")]
PackageName = Annotated[str, checked(check_name, "package name")]
NodeName = Annotated[str, checked(check_name, "node name")]


def placeholders(template: str, allowed: set[str]) -> str:
    try:
        names = {
            field for _, field, _, _ in string.Formatter().parse(template) if field is not None
        }
    except ValueError as exc:
        raise ValueError(f"is not a valid template: {exc}") from None
    if unknown := names - allowed:
        raise ValueError(
            f"uses {', '.join('{' + n + '}' for n in sorted(unknown))}; "
            f"allowed: {', '.join('{' + n + '}' for n in sorted(allowed))}"
        )
    return template
