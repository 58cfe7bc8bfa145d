"""FSDP on the plain-torch path: shard a model with PyTorch's `fully_shard`, and move its state
between DTensors and the plain tensors a checkpoint shard holds.

With `torch.strategy: fsdp` every parameter (and every optimizer state that mirrors one) is a
DTensor whose local part lives on one rank. A checkpoint therefore has one file per rank holding
that rank's local parts as plain tensors, so it loads with torch.load(weights_only=True); the
DTensor layout is rebuilt from the freshly sharded model when resuming.

fully_shard splits every parameter along dim 0 as torch.chunk does, so a checkpoint written by N
ranks resumes on M ranks (`reshard_states`): each new rank computes which old ranks' rows overlap
its own, reads only those shard files (and rank 0's, for replicated values), one at a time, and
copies the overlapping rows. The full tensors are equal before and after, optimizer state
included, and nothing is unpickled.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import torch


class _NoDTensor:
    """Stands for DTensor while torch.distributed.tensor is not imported: nothing can be one then."""


def _dtensor() -> type:
    # Importing torch.distributed.tensor and fsdp costs half a second at every worker start; a
    # DDP run never needs them, and no value can be a DTensor before they are imported.
    module = sys.modules.get("torch.distributed.tensor")
    return module.DTensor if module is not None else _NoDTensor


def shard_model(model: torch.nn.Module, device: torch.device, **fsdp_kwargs: Any) -> torch.nn.Module:
    """Move `model` to `device` and shard it: each submodule that owns parameters, then the root.

    Sharding per submodule lets FSDP gather one submodule's parameters at a time instead of the
    whole model; `fsdp_kwargs` go to every fully_shard call (mp_policy, reshard_after_forward...).
    """
    from torch.distributed.fsdp import fully_shard

    model.to(device)
    shard_submodules(model, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    return model


def shard_submodules(model: torch.nn.Module, **fsdp_kwargs: Any) -> None:
    """fully_shard each submodule of `model` (not `model` itself) that owns parameters.

    Modules that share a parameter (tied weights: an embedding and the output layer) are sharded
    together, as one group: sharded apart, each would hold its own copy and the tie would be
    silently broken (or FSDP refuses it at the first forward).
    """
    from torch.distributed.fsdp import fully_shard

    submodules = list(model.modules())[1:]
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in submodules:
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
    done: set[int] = set()
    for module in submodules:
        if id(module) in done or not any(True for _ in module.parameters(recurse=False)):
            continue
        group = _sharing_parameters(module, owners)
        done.update(id(m) for m in group)
        fully_shard(group if len(group) > 1 else group[0], **fsdp_kwargs)


def _sharing_parameters(module: torch.nn.Module, owners: dict[int, list[torch.nn.Module]]) -> list[torch.nn.Module]:
    """`module` and every module that shares a parameter with it, directly or through others."""
    group, pending = [module], [module]
    while pending:
        for param in pending.pop().parameters(recurse=False):
            for other in owners[id(param)]:
                if all(other is not m for m in group):
                    group.append(other)
                    pending.append(other)
    return group


def local_state(state: Any) -> Any:
    """A state_dict with every DTensor replaced by this rank's local part (other values unchanged)."""
    if isinstance(state, _dtensor()):
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
    if not isinstance(template, _dtensor()) or not isinstance(local, torch.Tensor):
        return local
    return _dtensor().from_local(local.to(template.device), template.device_mesh, template.placements,
                              shape=template.shape, stride=template.stride(), run_check=False)


def _like_param(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state tensor that mirrors a sharded parameter (momentum, Adam moments) as a
    DTensor laid out like it; scalars such as Adam's step count stay plain."""
    if (isinstance(param, _dtensor()) and isinstance(value, torch.Tensor) and value.dim() > 0
            and value.shape == param.to_local().shape):
        return _like(value, param)
    return value


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole, unsharded model state on rank 0 (empty elsewhere). Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def dim0_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """The rows [start, stop) of a `rows`-row tensor that rank `rank` holds when sharded over
    `world_size` ranks along dim 0 (torch.chunk's split: equal chunks, the last ones short or empty)."""
    chunk = math.ceil(rows / world_size) if rows else 0
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def reshard_states(tracked: dict[str, Any], read_old: Callable[[int], dict[str, Any]], *, old_world: int,
                   world_size: int, rank: int) -> dict[str, Any]:
    """This rank's local states of the tracked objects, rebuilt from a checkpoint written by
    `old_world` ranks (`read_old(i)`: old rank i's saved objects, as `local_state` made them).

    A value is sharded when it mirrors a DTensor of the new model: a model entry whose current
    value is a DTensor, an optimizer state tensor of a DTensor parameter. Every other value
    (buffers, step counts, hyperparameters) is replicated and taken from old rank 0.
    """
    base = read_old(0)
    states = {name: base[name] for name in tracked if name in base}
    # (object name, path of keys to the value, rows of the full tensor)
    entries: list[tuple[str, tuple, int]] = []
    for name, obj in tracked.items():
        if name not in states:
            continue
        if isinstance(obj, torch.nn.Module):
            template = obj.state_dict()
            entries += [(name, (key,), template[key].shape[0]) for key in states[name]
                        if isinstance(template.get(key), _dtensor())]
        elif isinstance(obj, torch.optim.Optimizer):
            params = [p for group in obj.param_groups for p in group["params"]]
            for index, per_param in states[name].get("state", {}).items():
                param = params[index]
                if not isinstance(param, _dtensor()):
                    continue
                entries += [(name, ("state", index, key), param.shape[0]) for key, value in per_param.items()
                            if isinstance(value, torch.Tensor) and value.dim() > 0
                            and tuple(value.shape[1:]) == tuple(param.shape[1:])]
    wanted = {entry: dim0_rows(entry[2], world_size, rank) for entry in entries}
    # New local tensors, filled from the old ranks whose rows overlap.
    pieces = {}
    for entry, (start, stop) in wanted.items():
        sample = _get(states[entry[0]], entry[1])
        pieces[entry] = torch.empty((stop - start, *sample.shape[1:]), dtype=sample.dtype)
    needed = sorted({old for entry, (start, stop) in wanted.items() for old in range(old_world)
                     if _overlap(dim0_rows(entry[2], old_world, old), (start, stop))})
    for old in needed:
        saved = base if old == 0 else read_old(old)
        for entry, (start, stop) in wanted.items():
            old_start, old_stop = dim0_rows(entry[2], old_world, old)
            low, high = max(start, old_start), min(stop, old_stop)
            if low < high:
                source = _get(saved[entry[0]], entry[1])
                pieces[entry][low - start:high - start] = source[low - old_start:high - old_start]
        del saved
    for entry, tensor in pieces.items():
        states[entry[0]] = _set(states[entry[0]], entry[1], tensor)
    return states


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def _get(state: Any, path: tuple) -> Any:
    for key in path:
        state = state[key]
    return state


def _set(state: Any, path: tuple, value: Any) -> Any:
    """A copy of `state` with the value at `path` replaced (the containers on the way copied)."""
    if not path:
        return value
    copy = dict(state)
    copy[path[0]] = _set(state[path[0]], path[1:], value)
    return copy
