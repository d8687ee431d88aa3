"""`lockstep site check` and `lockstep site schema`:
every error of a site file at once, and its JSON Schema.

A load (`load_site`) stops at the first error, which is right for a code location that must not
start on a broken file, and slow for a person fixing a new one: an edit, a reload, the next error.
The check reads the file as a load does and lists everything pydantic found (one `SiteProblem` per
error, each rendered as the load renders it, resources/site/errors.py), plus:

- the rules across tables (`rules.across_tables`: URL schemes, node names, relay keys). pydantic
  runs them only once every table is valid, so when some table is not, the check runs them itself
  over the tables that are;
- the trusted key files `[attest]` names, which a load reads after validating.

A TOML syntax error stops the parse, so it is the one error reported. Pure functions, no Dagster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import core_schema

from resources.errors import FileFormatError, decode_utf8
from resources.model import Model
from resources.reader import read_bytes
from resources.site.attest import AttestSection, read_trusted_keys
from resources.site.errors import ErrorDetails, SiteProblem, problems_of, render
from resources.site.fields import ENV_NAME
from resources.site.rules import across_tables
from resources.site.schema import SiteConfig
from resources.tomlfile import load_toml

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class SiteCheck(Model):
    """What `lockstep site check --json` prints."""

    file: str
    ok: bool
    errors: list[SiteProblem]


def check_site(path: Path) -> SiteCheck:
    """Every problem of the site file at `path` (none: it loads)."""
    problems = _problems(path)
    return SiteCheck(file=str(path), ok=not problems, errors=problems)


def _problems(path: Path) -> list[SiteProblem]:
    try:
        raw = read_bytes(path)
        text = decode_utf8(raw, path)
        data = load_toml(path, text)
    except FileFormatError as exc:
        return [SiteProblem.of(exc)]
    attest: AttestSection | None
    try:
        attest = SiteConfig.model_validate(data).attest
        problems: list[SiteProblem] = []
    except ValidationError as exc:
        errors = exc.errors()
        problems = problems_of(errors, path, text)
        tables = _valid_tables(data, errors)
        if all(e["loc"] for e in errors):  # a table failed, so SiteConfig's own rules did not run
            problems += [
                render(_site_rule_error(p, data), errors, path, text) for p in across_tables(tables)
            ]
        attest = tables.get("attest")
    if attest is not None:
        _, unreadable = read_trusted_keys(attest, path)
        problems += [SiteProblem.of(e, table="[attest]", key="trusted_keys") for e in unreadable]
    return sorted(problems, key=lambda p: p.line or 0)


def _valid_tables(data: dict[str, Any], errors: list[ErrorDetails]) -> dict[str, Any]:
    """The site's tables that passed their own checks, validated alone (an optional table the file
    leaves out: its default, None for most); a table that failed is not in the result."""
    failed = {e["loc"][0] for e in errors if e["loc"]}
    tables: dict[str, Any] = {}
    for name, field in SiteConfig.model_fields.items():
        if name in failed:
            continue
        if name in data:
            try:
                tables[name] = TypeAdapter(field.annotation).validate_python(data[name])
            # checked with the whole file, so not expected; its errors are listed
            except ValidationError:
                continue
        elif not field.is_required():
            tables[name] = field.get_default(call_default_factory=True)
    return tables


def _site_rule_error(problem: Exception, data: dict[str, Any]) -> ErrorDetails:
    """A cross-table problem as pydantic reports one from
    SiteConfig's own validator, so it renders alike."""
    return {
        "type": "value_error",
        "loc": (),
        "msg": f"Value error, {problem}",
        "input": data,
        "ctx": {"error": problem},
    }


# -- the JSON Schema ------------------------------------------------------------------------------


class _TomlSchema(GenerateJsonSchema):
    """pydantic's schema of the site models, for a TOML
    file: TOML has no null, so an optional table or
    key is one left out, not one that may be null, and a default of None is no default to show."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default", ...) is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)

    def generate(
        self, schema: core_schema.CoreSchema, mode: JsonSchemaMode = "validation"
    ) -> JsonSchemaValue:
        return {"$schema": SCHEMA_DIALECT, **super().generate(schema, mode)}


def site_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a site file, from the pydantic models that validate it.

    It knows the tables, keys, types, enums and bounds, and that unknown keys are errors; it cannot
    know the rules written as code (names, URLs, placeholders, rules across keys): `lockstep site
    check` applies those.
    """
    schema = SiteConfig.model_json_schema(schema_generator=_TomlSchema, mode="validation")
    for table in schema["$defs"].values():
        for key, prop in table.get("properties", {}).items():
            # Table's own rule, in the schema so an editor flags a pasted secret
            if key.endswith("_env"):
                prop["pattern"] = ENV_NAME.pattern
    return schema
