"""The script: section: an unmodified torchrun-style training script, run as `__main__` in K child
processes per node (orchestrator/agent/). `orchestrator torchrun` writes this section
from torchrun's own flags; a spec may name it directly."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.errors import SpecError
from orchestrator.spec.fields import check_keys, describe, mapping, read
from orchestrator.spec.model import NAME_PATTERN, ScriptSpec

# What {placeholders} in the script's arguments may name (agent/children.py fills them in).
ARG_PLACEHOLDERS = ("run_dir", "name", "storage")
# Hex digits of the sha256 of a script's location in its default run name.
NAME_HASH_DIGITS = 8
# Where Ray unpacks a job's working_dir: <session>/runtime_resources/working_dir_files/<package>/.
RAY_WORKING_DIR_PARTS = ("runtime_resources", "working_dir_files")


class DefaultName(NamedTuple):
    """A script's run name when none is given (default_run_name)."""

    name: str
    # What the hash is of, said for the user: the script's real path, or a module and its directory.
    source: str
    # The script lies in a Ray job's working_dir: another project's script at the same path gets the same name.
    in_ray_job: bool


def default_run_name(path: str | None = None, module: str | None = None, cwd: str | None = None) -> DefaultName:
    """`<stem>-<8 hex>`: the script's name and the sha256 of its real absolute path (for a module,
    of its name and the real path of the directory it is found from). The same script keeps its
    run, so `resume_from: latest` finds its checkpoints again; another project's train.py, beside
    it in the same storage, gets a run of its own. Computed once, on the driver: the workers get
    the name with the spec, wherever their copy of a shared checkout lives."""
    where, in_ray_job = _location(os.path.join(cwd or os.getcwd(), os.path.expanduser(path)) if path
                                  else cwd or os.getcwd())
    source = f"module {module} from {where}" if module else where
    stem = module.rsplit(".", 1)[-1] if module else os.path.splitext(os.path.basename(path))[0]
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-") or "script"
    digest = hashlib.sha256(source.encode()).hexdigest()[:NAME_HASH_DIGITS]
    name = f"{stem[:127 - NAME_HASH_DIGITS]}-{digest}"
    assert NAME_PATTERN.match(name), name
    return DefaultName(name, source, in_ray_job)


def _location(path: str) -> tuple[str, bool]:
    """The real path, and whether it lies in a Ray job's working_dir; there, the path within it
    (Ray unpacks each upload into a new folder named after its contents, so the folder itself
    says nothing that stays)."""
    real = os.path.realpath(path)
    parts = Path(real).parts
    for i in range(len(parts) - 2):
        if parts[i:i + 2] == RAY_WORKING_DIR_PARTS:
            return "/".join(("<the Ray job's working_dir>", *parts[i + 3:])), True
    return real, False


def parse_script(raw: Any) -> ScriptSpec:
    """The section's keys and types; where the script is, is checked last (check_script_target)."""
    path = "script"
    mapping(raw, path)
    check_keys(raw, ScriptSpec, path)
    file = read(raw, ScriptSpec, "path", path)
    module = read(raw, ScriptSpec, "module", path)
    if (file is None) == (module is None):
        raise SpecError(
            f"the script: section has {'both' if file else 'neither'} of 'path' and 'module'; it needs exactly one. "
            "Fix: set script.path to the training script (e.g. train.py), or script.module to a module run as "
            "with `python -m` (e.g. mypackage.train).")
    args = read(raw, ScriptSpec, "args", path)
    for i, arg in enumerate(args):
        if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
            raise SpecError(f"field 'script.args[{i}]': got {describe(arg)}; each argument must be a string. "
                            "Fix: quote it, e.g. '--lr=0.1'.")
    nproc = read(raw, ScriptSpec, "nproc_per_node", path)
    return ScriptSpec(path=file, module=module, args=[str(a) for a in args], nproc_per_node=nproc)


def check_script_target(script: ScriptSpec) -> None:
    """The script or module exists here (the driver's directory), where every worker will look for
    it. Finding a module imports the packages above it: the user's code, so this comes last."""
    file, module = script.path, script.module
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


def agent_resources(scaling_raw: dict[str, Any], nproc: int, use_gpu: bool) -> dict[str, float] | None:
    """A node's worker holds its K ranks' resources: K CPUs (and K GPUs), unless the spec says otherwise."""
    if scaling_raw.get("resources_per_worker") is not None:
        return None
    return {"CPU": float(nproc), **({"GPU": float(nproc)} if use_gpu else {})}
