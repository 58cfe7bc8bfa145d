"""Reading a YAML spec file into a raw dict."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import SpecError
from orchestrator.spec.fields import describe


def load_spec_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML spec file into a raw dict, with clear errors for a missing or broken file."""
    path = Path(path)
    if not path.exists():
        raise SpecError(
            f"spec file '{path}' does not exist (looked in {path.resolve().parent}). "
            "Fix: pass the path of a YAML job spec, e.g. `orchestrator run jobs/quickstart.yaml`."
        )
    if path.is_dir():
        raise SpecError(f"spec path '{path}' is a directory, not a file. Fix: pass a YAML spec file inside it.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(
            f"spec file '{path}' is not valid YAML{where}: {exc.problem}. "
            "Fix: correct the YAML syntax there (indentation uses spaces; `key: value` pairs)."
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file '{path}' is not valid YAML: {exc}. Fix: correct the YAML syntax.") from None
    if not isinstance(raw, dict):
        raise SpecError(
            f"spec file '{path}' must hold a mapping of fields (name:, lightning: or torch:, ...), "
            f"but its top level is {describe(raw)}. Fix: write the spec as `key: value` lines."
        )
    return raw
