"""The script: section: an unmodified torchrun-style training script, run as `__main__` in K child
processes per node (orchestrator/runtime/script/). `orchestrator torchrun` writes this section
from torchrun's own flags; a spec may name it directly."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.spec.fields import check_keys, describe, integer, mapping, optional
from orchestrator.spec.model import ScriptSpec

# What {placeholders} in the script's arguments may name (runtime/script/children.py fills them in).
ARG_PLACEHOLDERS = ("run_dir", "name", "storage")


def parse_script(raw: Any, check_imports: bool) -> ScriptSpec:
    path = "script"
    mapping(raw, path)
    check_keys(raw, ScriptSpec, path)
    file = optional(raw, "path", path, str, None)
    module = optional(raw, "module", path, str, None)
    if (file is None) == (module is None):
        raise SpecError(
            f"the script: section has {'both' if file else 'neither'} of 'path' and 'module'; it needs exactly one. "
            "Fix: set script.path to the training script (e.g. train.py), or script.module to a module run as "
            "with `python -m` (e.g. mypackage.train).")
    args = optional(raw, "args", path, list, [])
    for i, arg in enumerate(args):
        if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
            raise SpecError(f"field 'script.args[{i}]': got {describe(arg)}; each argument must be a string. "
                            "Fix: quote it, e.g. '--lr=0.1'.")
    nproc = integer(raw, "nproc_per_node", path, 1, minimum=1)
    if check_imports:
        _check_target(file, module)
    return ScriptSpec(path=file, module=module, args=[str(a) for a in args], nproc_per_node=nproc)


def _check_target(file: str | None, module: str | None) -> None:
    """The script or module exists here (the driver's directory), where every worker will look for it."""
    if file is not None:
        full = os.path.abspath(os.path.expanduser(file))
        if not os.path.isfile(full):
            raise SpecError(
                f"field 'script.path': {file!r} is not a file (looked for {full}). Fix: give the path of the "
                "training script, relative to the directory you run the command in.")
        return
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        found, cause = None, f" ({type(exc).__name__}: {exc})"
    else:
        cause = ""
    if found is None:
        raise SpecError(
            f"field 'script.module': no module {module!r} can be imported from {os.getcwd()}{cause}. Fix: run the "
            "command in the directory that holds the package, or install it, as `python -m` would need.")


def script_resources(scaling_raw: dict[str, Any], nproc: int, use_gpu: bool) -> dict[str, float] | None:
    """A node's worker holds its K ranks' resources: K CPUs (and K GPUs), unless the spec says otherwise."""
    if scaling_raw.get("resources_per_worker") is not None:
        return None
    return {"CPU": float(nproc), **({"GPU": float(nproc)} if use_gpu else {})}
