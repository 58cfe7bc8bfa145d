"""FSDP on the plain-torch path: shard a model with PyTorch's `fully_shard`, and move its state
between DTensors and the plain tensors a checkpoint shard holds.

With `torch.strategy: fsdp` every parameter (and every optimizer state that mirrors one) is a
DTensor whose local part lives on one rank. A checkpoint therefore has one file per rank holding
that rank's local parts as plain tensors, so it loads with torch.load(weights_only=True); the
DTensor layout is rebuilt from the freshly sharded model when resuming. That layout is a function
of the model and the world size, so a sharded checkpoint resumes on the same number of workers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def shard_model(model: torch.nn.Module, device: torch.device, **fsdp_kwargs: Any) -> torch.nn.Module:
    """Move `model` to `device` and shard it: each submodule that owns parameters, then the root.

    Sharding per submodule lets FSDP gather one submodule's parameters at a time instead of the
    whole model; `fsdp_kwargs` go to every fully_shard call (mp_policy, reshard_after_forward...).
    """
    model.to(device)
    for module in list(model.modules())[1:]:
        if any(True for _ in module.parameters(recurse=False)):
            fully_shard(module, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    return model


def local_state(state: Any) -> Any:
    """A state_dict with every DTensor replaced by this rank's local part (other values unchanged)."""
    if isinstance(state, DTensor):
        return state.to_local()
    if isinstance(state, dict):
        return {k: local_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(local_state(v) for v in state)
    return state


def load_local_state(obj: Any, saved: dict[str, Any]) -> None:
    """Load a state saved by `local_state` into a sharded model or its optimizer, or any other object."""
    if isinstance(obj, torch.nn.Module):
        template = obj.state_dict()
        obj.load_state_dict({key: _like(saved[key], template[key]) if key in template else value
                             for key, value in saved.items()})
    elif isinstance(obj, torch.optim.Optimizer):
        params = [p for group in obj.param_groups for p in group["params"]]
        state = {index: {key: _like_param(value, params[index]) for key, value in per_param.items()}
                 for index, per_param in saved["state"].items()}
        obj.load_state_dict({**saved, "state": state})
    else:
        obj.load_state_dict(saved)


def _like(local: Any, template: Any) -> Any:
    """`local` as a DTensor laid out like `template`, if the template is one."""
    if not isinstance(template, DTensor) or not isinstance(local, torch.Tensor):
        return local
    return DTensor.from_local(local.to(template.device), template.device_mesh, template.placements,
                              shape=template.shape, stride=template.stride(), run_check=False)


def _like_param(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state tensor that mirrors a sharded parameter (momentum, Adam moments) as a
    DTensor laid out like it; scalars such as Adam's step count stay plain."""
    if (isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.dim() > 0
            and value.shape == param.to_local().shape):
        return _like(value, param)
    return value


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole, unsharded model state on rank 0 (empty elsewhere). Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
