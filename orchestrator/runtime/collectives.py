"""Small collectives over the CPU: the orchestrator's own coordination between ranks.

They run over gloo even when training uses NCCL: a CPU tensor cannot go through NCCL, and a
CUDA one would make the step wait for the GPU. Every rank must call each of them, in the same
order (creating the side group is itself collective).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

_group = None


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def cpu_group():
    """The process group for the orchestrator's coordination: the world's own if it is gloo."""
    global _group
    if _group is None:
        _group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return _group


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=cpu_group())
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=cpu_group())
    return out


def broadcast_tensor(tensor) -> None:
    """Rank 0's values into `tensor` on every rank (in place)."""
    if _active():
        dist.broadcast(tensor, src=0, group=cpu_group())
