"""`orchestrator schema`: the JSON Schema of the job spec, for editors that validate and complete
job YAML (a `# yaml-language-server: $schema=spec.schema.json` line at the top of a spec).

It is generated from the typed spec that validates (the dataclasses of spec/model.py): each property
comes from a field, with its type from the annotation, its default, and its description from the
comment written above the field. Where the YAML is written differently from the typed model, the
difference is stated once, in YAML_SHAPES and the aliases. Validation itself stays in spec/validate.py
(the schema cannot express every rule: a global batch that every world size can split, say).
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
from orchestrator.spec.model import (
    LIGHTNING_STRATEGIES,
    TORCH_STRATEGIES,
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

# Fields whose YAML form differs from the typed one: (dataclass, field) -> schema, or None when
# the field is not written in YAML at all (derived by validation).
YAML_SHAPES: dict[tuple[type, str], dict[str, Any] | None] = {
    (ScalingSpec, "num_workers"): {
        "anyOf": [{"type": "integer", "minimum": 1},
                  {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2}],
        "description": "Training workers (DDP ranks), or [min, max]: elastic.",
    },
    (ScalingSpec, "min_workers"): None,  # written as num_workers: [min, max]
    (ScalingSpec, "placement"): {"enum": ["spread", "pack"]},
    (KeepBestSpec, "mode"): {"enum": ["min", "max"]},
    (TorchSpec, "strategy"): {"enum": list(TORCH_STRATEGIES)},
    (LightningSpec, "strategy"): None,  # written as lightning.trainer.strategy
    (LightningSpec, "deepspeed"): None,  # written as lightning.trainer.strategy
    (LightningSpec, "trainer"): {"properties": {"strategy": {
        "anyOf": [{"enum": [*LIGHTNING_STRATEGIES, *DEEPSPEED_NAMES]}, CLASS_REF], "default": "ddp",
        "description": ("How the workers share the model: ddp (a full copy per worker), fsdp (sharded with "
                        "FSDP2), deepspeed (ZeRO stage 2; or deepspeed_stage_1/2/3, ..._offload), or "
                        "{class_path: lightning.pytorch.strategies.DeepSpeedStrategy, init_args: {...}}.")}}},
    (LightningSpec, "logger"): {"anyOf": [CLASS_REF, {"type": "array", "items": CLASS_REF}]},
    (DataSourceSpec, "columns"): {"anyOf": [
        {"type": "object", "additionalProperties": {"anyOf": [{"$ref": "#/$defs/ColumnSpec"}, {"type": "null"}]}},
        {"type": "array", "items": {"type": "string"}}]},
    (ScriptSpec, "args"): {"type": "array", "items": {"type": "string"}},
    (ColumnSpec, "dtype"): {"anyOf": [{"enum": list(DTYPES)}, {"type": "null"}]},
}
# YAML key for a field, where the two differ.
ALIASES = {(CheckpointSpec, "async_save"): "async"}
# Keys the YAML accepts beyond the typed fields.
EXTRA_PROPERTIES: dict[type, dict[str, dict[str, Any]]] = {
    LightningSpec: {"config": {"type": ["string", "null"], "description": (
        "A LightningCLI config file (model, data, trainer, seed_everything) used as this section; the "
        "section's own fields win over the file's.")}},
}
# (lightning.data is required unless the spec has a data: section: validation says so.)
REQUIRED = {JobSpec: ["name"], DataSourceSpec: ["path"], ClassRef: ["class_path"], TorchSpec: ["train_loop"],
            LightningSpec: ["model"], KeepBestSpec: ["monitor"]}
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
    for f in dataclasses.fields(cls):
        shape = YAML_SHAPES.get((cls, f.name), {})
        if shape is None:
            continue
        # A shape that says which values are allowed replaces the annotation's type; one that
        # only adds (properties, a description) extends it.
        prop = dict(shape) if "anyOf" in shape or "enum" in shape else {**_type(hints[f.name]), **shape}
        default = _default(f)
        if default is not dataclasses.MISSING:
            prop["default"] = default
        if f.name in comments and "description" not in prop:
            prop["description"] = comments[f.name]
        properties[ALIASES.get((cls, f.name), f.name)] = prop
    properties.update(EXTRA_PROPERTIES.get(cls, {}))
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        out["description"] = inspect.cleandoc(cls.__doc__)
    if cls in REQUIRED:
        out["required"] = REQUIRED[cls]
    return out


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
