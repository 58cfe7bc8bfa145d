"""Loading a spec: a file, a mapping or a JobSpec, with dotted overrides, validated once."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from orchestrator.errors import SpecError
from orchestrator.spec.deepspeed import STRATEGY_CLASS_PATHS
from orchestrator.spec.facts import to_keys
from orchestrator.spec.fields import describe
from orchestrator.spec.files import load_spec_file
from orchestrator.spec.model import CheckpointSpec, JobSpec
from orchestrator.spec.validate import validate


def parse_set_option(option: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", parsed value). The value is parsed as YAML: 3 is an int, [1, 2] a list."""
    key, sep, text = option.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):
        raise SpecError(
            f"--set '{option}' is not of the form KEY=VALUE with a dotted KEY. "
            "Fix: write it like `--set scaling.num_workers=4` or `--set lightning.trainer.max_epochs=10`."
        )
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return key, value


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set dotted keys ("scaling.num_workers") in a copy of the raw spec, creating mappings on the way."""
    result = _deep_copy(raw)
    for dotted, value in overrides.items():
        node = result
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                prefix = ".".join(parts[: i + 1])
                raise SpecError(
                    f"--set {dotted}: '{prefix}' is {describe(child)}, not a mapping, so it has no field "
                    f"'{parts[i + 1]}'. Fix: set '{prefix}' itself, or check the key's spelling."
                )
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Validation


def resolve_spec(spec: JobSpec | Mapping[str, Any] | str | os.PathLike,
                 overrides: Mapping[str, Any] | None = None, *, read_only: bool = False) -> JobSpec:
    """Load (if a path), apply dotted overrides, and validate. The one entry the CLI and API share.
    `read_only`: every key, type and value, importing nothing (validate's first pass)."""
    # class_paths name modules relative to where the user stands, as `python -m` would find them;
    # the console script's own sys.path starts at its bin directory instead.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if isinstance(spec, JobSpec):
        if not overrides:
            return spec
        spec = spec.to_dict()
        spec = {k: v for k, v in spec.items() if v is not None}
        spec["checkpoint"] = to_keys(CheckpointSpec, spec["checkpoint"])
        kind = "lightning" if spec.get("lightning") else "torch"
        if kind == "lightning":
            lightning = spec["lightning"]
            strategy, deepspeed = lightning.pop("strategy"), lightning.pop("deepspeed", None)
            if deepspeed is not None:
                strategy = {"class_path": STRATEGY_CLASS_PATHS[0], "init_args": deepspeed}
            lightning["trainer"] = {**lightning["trainer"], "strategy": strategy}
    raw = load_spec_file(spec) if isinstance(spec, (str, os.PathLike)) else dict(spec)
    if overrides:
        raw = apply_overrides(raw, overrides)
    return validate(raw, read_only=read_only)
