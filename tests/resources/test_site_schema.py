"""`lockstep site schema`: a valid JSON Schema (draft
2020-12) that the example and the sandbox's site files
satisfy and a broken one does not, as an editor (Taplo) would check them."""

from __future__ import annotations

import datetime
import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomli_w

from resources.site.check import site_schema
from sandbox.layout import Sandbox
from sandbox.world import site_config
from tests.support.site_example import EXAMPLE


def as_json(value: Any) -> Any:
    """TOML data as JSON holds it: datetimes become ISO 8601 strings (as editors validate them)."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    return value


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = site_schema()
    cls = jsonschema.validators.validator_for(schema, default=None)
    assert cls is jsonschema.Draft202012Validator  # from its own "$schema", as any tool reads it
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def errors(validator: jsonschema.protocols.Validator, data: dict[str, Any]) -> list[str]:
    return sorted(
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(as_json(data))
    )


def test_the_schema_is_valid_and_describes_every_table_as_a_toml_file_can_hold_it() -> None:
    schema = site_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False and schema["required"] == ["tpu"]
    assert {
        "site",
        "tpu",
        "registry",
        "iris",
        "jovian",
        "spark",
        "links",
        "attest",
        "alerts",
        "timeouts",
    } == set(schema["properties"])
    text = json.dumps(schema)
    # TOML has no null: optional keys are left out
    assert '"null"' not in text and '"default": null' not in text
    iris = schema["$defs"]["IrisSection"]["properties"]
    assert iris["cluster"]["description"].startswith("--cluster=") and iris["cpu"] == {
        "default": 16,
        "exclusiveMinimum": 0,
        "title": "Cpu",
        "type": "integer",
    }


def test_the_example_and_the_sandboxs_site_satisfy_it(
    validator: jsonschema.protocols.Validator, tmp_path: Path
) -> None:
    example = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert errors(validator, example) == []
    # the ISO path is taken
    assert isinstance(example["tpu"]["promotion"]["freeze"][1]["start"], datetime.datetime)
    # The sandbox's site as `lockstep sandbox up` writes it (sandbox/world.py up()).
    data = site_config(Sandbox(root=tmp_path)).model_dump(
        mode="json", exclude_none=True, exclude={"links"}
    )
    assert errors(validator, tomllib.loads(tomli_w.dumps(data))) == []


def test_a_broken_file_fails_it_at_the_key(validator: jsonschema.protocols.Validator) -> None:
    example = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    broken = json.loads(json.dumps(as_json(example)))
    broken["iris"]["clustr"] = broken["iris"].pop("cluster")
    broken["iris"]["cpu"] = "sixteen"
    broken["registry"]["kind"] = "s3"
    broken["spark"]["passphrase_env"] = "hunter2-not-a-name"
    broken["spark"]["nodes"][0]["port"] = 70000
    broken["jovian"]["lane"]["seed"] = "42"
    broken["alerts"]["webhook"][0]["events"] = ["build_failed"]
    del broken["tpu"]["image"]
    got = errors(validator, broken)
    for where in (
        "iris: Additional properties are not allowed ('clustr'",
        "iris.cpu: 'sixteen' is not of type 'integer'",
        "registry.kind: 's3' is not one of",
        "spark.passphrase_env: 'hunter2-not-a-name' does not match",
        "spark.nodes.0.port: 70000 is greater than",
        "jovian.lane.seed: '42' is not of type 'integer'",
        "alerts.webhook.0.events.0: 'build_failed' is not one of",
        "tpu: 'image' is a required property",
    ):
        assert any(g.startswith(where) for g in got), (where, got)
    assert len(got) == 8, got


def _keywords(schema: Any) -> set[str]:
    """Every keyword used anywhere in `schema` (not the names of properties or definitions)."""
    if not isinstance(schema, dict):
        return set()
    found = set(schema)
    for key in ("properties", "$defs"):
        for sub in schema.get(key, {}).values():
            found |= _keywords(sub)
    for key in ("items", "additionalProperties"):
        found |= _keywords(schema.get(key))
    for key in ("anyOf", "allOf", "oneOf"):
        for sub in schema.get(key, []):
            found |= _keywords(sub)
    return found


def test_the_schema_reads_the_same_to_a_tool_that_knows_only_draft_7() -> None:
    # Taplo (Even Better TOML) validates with a draft 4-7 library and reads an unknown "$schema" as
    # draft 7: the schema uses no keyword that draft 7 lacks or
    # reads otherwise ($defs is reached by JSON pointer).
    draft7 = {
        "$schema",
        "$defs",
        "$ref",
        "title",
        "description",
        "default",
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "enum",
        "const",
        "anyOf",
        "allOf",
        "oneOf",
        "pattern",
        "minLength",
        "maxLength",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
    used = _keywords(site_schema())
    assert used <= draft7, used - draft7
    assert {"$ref", "additionalProperties", "exclusiveMinimum", "enum", "pattern"} <= used
