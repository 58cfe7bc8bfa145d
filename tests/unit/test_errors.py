"""Every exception the package raises hangs under errors.py's one root, a user error apart from an
infrastructure error, and a misused `ctx` call is a user error that names the call and the fix."""

from __future__ import annotations

import importlib
import inspect
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO

from orchestrator.errors import ContextMisuse, InfrastructureError, OrchestratorError, UserError
from orchestrator.rank.torch.loop import TrainContext
from orchestrator.spec import resolve_spec

# Signals the harness raises and catches itself, never raised to a user.
CONTROL_FLOW = {"orchestrator.rank.session.StopTraining"}


def exception_classes() -> dict[str, type]:
    """Every exception class the package defines, by its full name."""
    found = {}
    for folder, _, files in os.walk(os.path.join(REPO, "orchestrator")):
        for name in files:
            if not name.endswith(".py") or name == "__main__.py":
                continue
            module = os.path.relpath(os.path.join(folder, name), REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            for value in vars(importlib.import_module(module)).values():
                if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module:
                    found[f"{module}.{value.__qualname__}"] = value
    return found


def test_every_exception_of_the_package_hangs_under_the_one_root():
    classes = exception_classes()
    assert len(classes) > 20 and CONTROL_FLOW <= set(classes)  # the walk found the package's own
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, OrchestratorError) and name not in CONTROL_FLOW)
    assert outside == []
    both = sorted(name for name, cls in classes.items() if issubclass(cls, UserError)
                  and issubclass(cls, InfrastructureError))
    assert both == []


@pytest.mark.parametrize("name, kind", [
    ("orchestrator.checkpoint.store.CorruptCheckpoint", UserError),
    ("orchestrator.ray_private.UnsupportedRay", UserError),
    ("orchestrator.rank.collectives.GlooGroupError", InfrastructureError),
    ("orchestrator.data.parquet.ParquetReadError", InfrastructureError),
    ("orchestrator.failures.TransientStartError", InfrastructureError),
])
def test_errors_defined_beside_their_code_say_whose_they_are(name, kind):
    assert issubclass(exception_classes()[name], kind)


def _context() -> TrainContext:
    """A rank's ctx with no run around it: a stand-in for the session holds what ctx reads of it."""
    spec = resolve_spec({"name": "misuse", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 1}})
    return TrainContext(SimpleNamespace(spec=spec, rank=0, world_size=1, local_rank=0), restored=None)


def test_tracking_state_that_cannot_be_saved_is_a_user_error_that_names_the_call_and_the_fix():
    ctx = _context()
    with pytest.raises(ContextMisuse) as raised:
        ctx.track(model=torch.nn.Linear(2, 2), step_count=3)
    assert "ctx.track(step_count=...)" in str(raised.value) and "Fix: " in str(raised.value)
    assert isinstance(raised.value, UserError)
