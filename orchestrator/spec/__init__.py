"""The job spec: the typed model, loading and overrides, validation; the data, Lightning,
DeepSpeed and schema parts. Knows nothing of Ray.

    model.py     the frozen dataclasses JobSpec and its sections (what the rest of the code trusts)
    facts.py     option(): each field's default, bounds, choices and key, declared once on the field
    files.py     a YAML spec file read into a raw dict
    load.py      a file, mapping or JobSpec in, overrides applied, validated once (resolve_spec)
    validate.py  the rules
    fields.py    the typed field readers and import_object
    imports.py   what needs an import to check (Lightning's signatures, the user's code): last
    data.py, lightning.py, lightning_cli.py, deepspeed.py, script.py
                 the sections with rules of their own
    schema.py    the JSON Schema, generated from the dataclasses
"""

from orchestrator.errors import SpecError
from orchestrator.spec.fields import import_object
from orchestrator.spec.files import load_spec_file
from orchestrator.spec.load import apply_overrides, parse_set_option, resolve_spec
from orchestrator.spec.model import (
    DEFAULT_STORAGE,
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
from orchestrator.spec.validate import validate

__all__ = ["DEFAULT_STORAGE", "CheckpointSpec", "ClassRef", "FailureSpec", "JobSpec", "KeepBestSpec", "LightningSpec",
           "ScalingSpec", "ScriptSpec", "SpecError", "TorchSpec", "apply_overrides", "import_object", "load_spec_file",
           "parse_set_option", "resolve_spec", "validate"]
