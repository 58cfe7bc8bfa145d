"""`orchestrator schema`: the JSON Schema of the job spec, for editors that validate and complete
job YAML (a `# yaml-language-server: $schema=spec.schema.json` line at the top of a spec).

It is generated from the typed spec that validates (the dataclasses of spec/model.py): each property
comes from a field, with its type from the annotation, its default, its bounds, its choices and its
key from the field's declaration (facts.py), and its description from the comment written above the
field; a field without a default is required. Where the YAML is written in a shape of its own (an
elastic [min, max], one logger or a list), the shape is stated once, in YAML_SHAPES. Validation
itself stays in spec/validate.py (the schema cannot express every rule: a global batch that every
world size can split, say).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from typing import Any

from orchestrator.data.parquet import DTYPES
from orchestrator.spec.data import ColumnSpec, DataSourceSpec, DataSpec
from orchestrator.spec.facts import default_of, facts_of, field_of, key_of
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

# Lightning's registered DeepSpeed strategies (NVMe offload is refused at validation).
DEEPSPEED_NAMES = ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
                   "deepspeed_stage_3_offload"]
SCHEMA_ID = "https://orchestrator.invalid/spec.schema.json"
CLASS_REF = {"$ref": "#/$defs/ClassRef"}


def _worker_count() -> dict[str, Any]:
    least = facts_of(field_of(ScalingSpec, "num_workers")).minimum
    return {"anyOf": [{"type": "integer", "minimum": least},
                      {"type": "array", "items": {"type": "integer", "minimum": least}, "minItems": 2, "maxItems": 2}],
            "description": "Training workers (DDP ranks), or [min, max]: elastic."}


def _lightning_strategy() -> dict[str, Any]:
    choices = facts_of(field_of(LightningSpec, "strategy")).choices
    return {"properties": {"strategy": {
        "anyOf": [{"enum": [*choices, *DEEPSPEED_NAMES]}, CLASS_REF], "default": default_of(LightningSpec, "strategy"),
        "description": ("How the workers share the model: ddp (a full copy per worker), fsdp (sharded with "
                        "FSDP2), deepspeed (ZeRO stage 2; or deepspeed_stage_1/2/3, ..._offload), or "
                        "{class_path: lightning.pytorch.strategies.DeepSpeedStrategy, init_args: {...}}.")}}}


# Fields written in a shape of their own rather than their type's: (dataclass, field) -> schema.
YAML_SHAPES: dict[tuple[type, str], dict[str, Any]] = {
    (ScalingSpec, "num_workers"): _worker_count(),
    (LightningSpec, "trainer"): _lightning_strategy(),
    (LightningSpec, "logger"): {"anyOf": [CLASS_REF, {"type": "array", "items": CLASS_REF}]},
    (DataSourceSpec, "columns"): {"anyOf": [
        {"type": "object", "additionalProperties": {"anyOf": [{"$ref": "#/$defs/ColumnSpec"}, {"type": "null"}]}},
        {"type": "array", "items": {"type": "string"}}]},
    (ColumnSpec, "dtype"): {"anyOf": [{"enum": list(DTYPES)}, {"type": "null"}]},
}
# Keys the YAML accepts beyond the typed fields.
EXTRA_PROPERTIES: dict[type, dict[str, dict[str, Any]]] = {
    LightningSpec: {"config": {"type": ["string", "null"], "default": None, "description": (
        "A LightningCLI config file (model, data, trainer, seed_everything) used as this section; the "
        "section's own fields win over the file's.")}},
}
SPEC_CLASSES = (JobSpec, LightningSpec, TorchSpec, ScriptSpec, ScalingSpec, CheckpointSpec, KeepBestSpec, FailureSpec,
                ClassRef, DataSpec, DataSourceSpec, ColumnSpec)


def job_spec_schema() -> dict[str, Any]:
    schema = _object(JobSpec)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "orchestrator job spec", **schema,
            "$defs": {"ClassRef": _object(ClassRef), "ColumnSpec": _object(ColumnSpec)}}


def schema_text() -> str:
    return json.dumps(job_spec_schema(), indent=2) + "\n"


def _object(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    comments = field_comments(cls)
    properties: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        facts = facts_of(f)
        if facts.derived:
            continue  # not written under a key of its own
        properties[key_of(f)] = _property(cls, f, hints[f.name], comments.get(f.name))
        if default_of(cls, f.name) is dataclasses.MISSING and not facts.depends:
            required.append(key_of(f))
    properties.update(EXTRA_PROPERTIES.get(cls, {}))
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        out["description"] = inspect.cleandoc(cls.__doc__)
    if required:
        out["required"] = required
    return out


def _property(cls: type, f: dataclasses.Field, hint: Any, comment: str | None) -> dict[str, Any]:
    """One field's schema: its shape or its type, its choices, its bounds, its default, its description."""
    facts, shape = facts_of(f), YAML_SHAPES.get((cls, f.name), {})
    # A shape that says which values are allowed replaces the annotation's type; one that only
    # adds (properties, a description) extends it.
    prop = dict(shape) if "anyOf" in shape or "enum" in shape else {**_type(hint), **shape}
    if facts.choices:
        prop = {"enum": list(facts.choices)}
    bounded = prop.get("additionalProperties", prop)  # a mapping's bounds are its values
    if facts.minimum is not None and "anyOf" not in shape:
        bounded["minimum"] = facts.minimum
    if facts.above is not None:
        bounded["exclusiveMinimum"] = facts.above
    default = _default(f)
    if default is not dataclasses.MISSING and not facts.depends:
        prop["default"] = default
    if comment and "description" not in prop:
        prop["description"] = comment
    return prop


def _type(hint: Any) -> dict[str, Any]:
    if hint is ClassRef:
        return dict(CLASS_REF)
    if dataclasses.is_dataclass(hint):
        return _object(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [_type(a) for a in args if a is not type(None)]
        option = options[0] if len(options) == 1 else {"anyOf": options}
        return {"anyOf": [option, {"type": "null"}]} if type(None) in args else option
    if origin is dict:
        return {"type": "object", "additionalProperties": _type(args[1]) if args else {}}
    if origin is list:
        return {"type": "array", "items": _type(args[0]) if args else {}}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return {"type": simple[hint]} if hint in simple else {}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if dataclasses.is_dataclass(value):
        return dataclasses.MISSING  # a section: its own properties carry the defaults
    return value


def field_comments(cls: type) -> dict[str, str]:
    """The comment lines written right above each field of a dataclass, joined into one text."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("#").strip())
            continue
        match = re.match(r"(\w+)\s*:", text)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments
