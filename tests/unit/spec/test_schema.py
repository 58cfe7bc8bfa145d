"""The JSON Schema of the job spec (`orchestrator schema`, shipped as spec.schema.json) is
generated from the typed spec, accepts every shipped job, refuses what validation refuses, and
describes every field."""

from __future__ import annotations

import glob
import json
import os

import jsonschema
import pytest
import yaml
from conftest import REPO, run_cli

from orchestrator.spec.schema import job_spec_schema, schema_text


def shipped() -> dict:
    with open(os.path.join(REPO, "spec.schema.json")) as f:
        return json.load(f)


def test_the_shipped_schema_is_the_generated_one_and_the_command_prints_it():
    assert shipped() == job_spec_schema(), "regenerate it: orchestrator schema > spec.schema.json"
    printed = run_cli("schema", timeout=60)
    assert printed.returncode == 0 and printed.stdout == schema_text()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "jobs", "*.yaml"))), ids=os.path.basename)
def test_every_shipped_job_validates_against_the_schema_its_first_line_names(path):
    with open(path) as f:
        text = f.read()
    assert text.startswith("# yaml-language-server: $schema=../spec.schema.json\n")
    jsonschema.validate(yaml.safe_load(text), shipped())


@pytest.mark.parametrize(("raw", "fragment"), [
    ({"name": "t", "scaling": {"num_worker": 2}}, "'num_worker' was unexpected"),
    ({"name": "t", "scaling": {"placement": "spraed"}}, "'spraed' is not one of"),
    ({"name": "t", "scaling": {"num_workers": [1, 2, 3]}}, r"\[1, 2, 3\] is too long"),
    ({"name": "t", "torch": {"train_loop": "m:f", "strategy": "deepspeed"}}, "'deepspeed' is not one of"),
    ({"name": "t", "checkpoint": {"keep_best": {"k": 2}}}, "'monitor' is a required property"),
    ({"storage": "/tmp"}, "'name' is a required property"),
])
def test_the_schema_refuses_what_validation_refuses(raw, fragment):
    with pytest.raises(jsonschema.ValidationError, match=fragment):
        jsonschema.validate(raw, shipped())


def test_every_field_has_a_description_for_the_editor_to_show():
    missing = []

    def walk(node, path):
        for key, prop in node.get("properties", {}).items():
            if "description" not in prop and "$ref" not in prop:
                missing.append(f"{path}.{key}")
            walk(prop, f"{path}.{key}")
        for option in node.get("anyOf", []):
            walk(option, path)

    schema = job_spec_schema()
    walk(schema, "")
    for name, definition in schema["$defs"].items():
        walk(definition, name)
    assert not missing, missing
