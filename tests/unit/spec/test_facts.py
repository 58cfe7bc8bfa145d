"""Each spec field says its facts once, on its dataclass: what validation fills in for a field left
out is the field's declared default, and the JSON Schema requires and defaults exactly what the
dataclasses and validation do."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re

import jsonschema
import pytest

from orchestrator.errors import SpecError
from orchestrator.spec import validate
from orchestrator.spec.data import ColumnSpec, DataSourceSpec
from orchestrator.spec.facts import facts_of, key_of
from orchestrator.spec.model import (
    CheckpointSpec,
    ClassRef,
    FailureSpec,
    JobSpec,
    KeepBestSpec,
    LightningSpec,
    ScalingSpec,
    ScriptSpec,
    TorchSpec,
)
from orchestrator.spec.schema import job_spec_schema

TORCH = {"name": "t", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1}}
LIGHTNING = {"name": "t", "lightning": {"model": {"class_path": "jobs.digits.DigitsClassifier"},
                                        "data": {"class_path": "jobs.digits.DigitsData"},
                                        "trainer": {"max_epochs": 1}}}
DATA = {**TORCH, "data": {"train": {"path": "/d/train.parquet", "columns": {"x": {}}},
                          "val": {"path": "/d/val.parquet"}, "test": {"path": "/d/test.parquet"}}}
# Each section as validation reads it: (the section's dataclass, a spec holding it, its place in
# the spec, and the spec's path to its schema).
SECTIONS = {
    "job": (JobSpec, TORCH, [], []),
    "torch": (TorchSpec, TORCH, ["torch"], ["torch"]),
    "lightning": (LightningSpec, LIGHTNING, ["lightning"], ["lightning"]),
    "lightning.model": (ClassRef, LIGHTNING, ["lightning", "model"], ["$defs", "ClassRef"]),
    "script": (ScriptSpec, {"name": "t", "script": {"path": "train.py"}}, ["script"], ["script"]),
    "scaling": (ScalingSpec, TORCH, ["scaling"], ["scaling"]),
    "checkpoint": (CheckpointSpec, TORCH, ["checkpoint"], ["checkpoint"]),
    "checkpoint.keep_best": (KeepBestSpec, {**TORCH, "checkpoint": {"keep_best": {"monitor": "val_loss"}}},
                             ["checkpoint", "keep_best"], ["checkpoint", "keep_best"]),
    "failure": (FailureSpec, TORCH, ["failure"], ["failure"]),
    "data.train": (DataSourceSpec, DATA, ["data", "train"], ["data", "train"]),
    "data.val": (DataSourceSpec, DATA, ["data", "val"], ["data", "val"]),
    "data.test": (DataSourceSpec, DATA, ["data", "test"], ["data", "test"]),
    "data.train.columns.x": (ColumnSpec, DATA, ["data", "train", "columns", "x"], ["$defs", "ColumnSpec"]),
}


@functools.cache
def _schema() -> dict:
    return job_spec_schema()


def schema_of(path: list[str]) -> dict:
    """The schema of the object at a spec path (a section that may be null is its object option)."""
    node = _schema()
    if path[:1] == ["$defs"]:
        return node["$defs"][path[1]]
    for key in path:
        node = node["properties"][key]
        node = next((o for o in node.get("anyOf", []) if o.get("type") == "object"), node)
    return node


def spec_key(schema: dict, f: dataclasses.Field) -> str | None:
    """The key a spec writes for a field (None: the field is derived from others, not written)."""
    return key_of(f) if key_of(f) in schema["properties"] else None


def declared_default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def without_field(raw: dict, place: list[str], key: str) -> dict:
    raw = copy.deepcopy(raw)
    node = raw
    for part in place:
        node = node.setdefault(part, {})
    node.pop(key, None)
    return raw


def validated(raw: dict, place: list[str]):
    value = validate(raw, read_only=True)
    for part in place:
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


FIELDS = [(section, f.name) for section, (cls, _, _, _) in SECTIONS.items() for f in dataclasses.fields(cls)
          if not dataclasses.is_dataclass(declared_default(f))]


@pytest.mark.parametrize(("section", "name"), FIELDS, ids=[f"{s}.{n}" for s, n in FIELDS])
def test_a_field_left_out_validates_to_its_declared_default_and_the_schema_claims_no_other(section, name):
    cls, raw, place, schema_path = SECTIONS[section]
    schema = schema_of(schema_path)
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    key = spec_key(schema, f)
    if key is None or key in schema.get("required", []) or key in raw_section(raw, place):
        pytest.skip("not written in a spec, required, or what the section is built from")
    got = getattr(validated(without_field(raw, place, key), place), name)
    record = json.loads(json.dumps(got, default=str))
    prop = schema["properties"][key]
    if "default" in prop:
        assert prop["default"] == record, f"the schema says {prop['default']!r}, validation gives {record!r}"
        assert declared_default(f) == got, f"{cls.__name__}.{name} declares {declared_default(f)!r}, " \
                                           f"validation gives {got!r}"
    else:
        # No default in the schema: one that depends on the rest of the spec. The field still
        # declares one, for the spec written without its other fields.
        assert declared_default(f) is not dataclasses.MISSING, f"{cls.__name__}.{name} declares no default, " \
                                                               f"validation gives {got!r}"


def raw_section(raw: dict, place: list[str]) -> dict:
    node = raw
    for part in place:
        node = node.get(part, {})
    return node


@pytest.mark.parametrize("cls", sorted({cls for cls, _, _, _ in SECTIONS.values()}, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_the_fields_a_section_cannot_do_without_are_the_ones_its_schema_requires(cls):
    path = next(p for c, _, _, p in SECTIONS.values() if c is cls)
    without_default = [f.name for f in dataclasses.fields(cls) if declared_default(f) is dataclasses.MISSING]
    assert without_default == schema_of(path).get("required", [])


BOUNDED = [(section, f.name) for section, (cls, _, _, _) in SECTIONS.items() for f in dataclasses.fields(cls)
           if (facts_of(f).minimum is not None or facts_of(f).above is not None) and not facts_of(f).derived]


@pytest.mark.parametrize(("section", "name"), BOUNDED, ids=[f"{s}.{n}" for s, n in BOUNDED])
def test_a_value_past_a_fields_declared_bound_is_refused_by_validation_and_by_the_schema(section, name):
    cls, raw, place, _ = SECTIONS[section]
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    facts = facts_of(f)
    past = facts.above if facts.above is not None else facts.minimum - 1
    value = {"CPU": past} if isinstance(declared_default(f), dict) else past
    bad = without_field(raw, place, key_of(f))
    node = bad
    for part in place:
        node = node[part]
    node[key_of(f)] = value
    with pytest.raises(SpecError, match=re.escape(".".join([*place, key_of(f)]))):
        validate(bad, read_only=True)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _schema())
