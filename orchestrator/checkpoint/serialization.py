"""State <-> bytes without ever unpickling arbitrary objects.

Saving uses torch.save; loading uses torch.load(weights_only=True), which only rebuilds tensors,
numbers, strings and containers. A checkpoint holding any other object is refused, because loading
it would run code chosen by whoever wrote the file.
"""

from __future__ import annotations

import collections
import enum
import io
import pickle
from pathlib import PurePath
from typing import Any

import torch

from orchestrator.errors import CheckpointError


def dumps_state(state: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def loads_state(data: bytes, *, source: str) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"checkpoint file '{source}' was refused: it contains Python objects other than tensors, "
            f"numbers, strings and containers, and loading it would run arbitrary code "
            f"({str(exc).splitlines()[0][:200]}). Fix: save only state_dict()s and plain values; "
            "convert custom objects to dicts before saving."
        ) from None


class UnsafeCheckpointValue(CheckpointError):
    """A value that a checkpoint cannot hold and load back safely (found when saving)."""


# What torch.load(weights_only=True) rebuilds by itself.
_PLAIN_LEAVES = (torch.Tensor, int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device,
                 torch.Size)


def plain_state(value: Any, where: str = "checkpoint") -> Any:
    """`value` with the plain-data objects users keep in hyperparameters made loadable without
    unpickling: paths become strings, enums their values, dict subclasses plain dicts. Anything
    else that is not a tensor, number, string or container is refused here, at save time, with its
    place in the state: found at the first save, not at the first resume.
    """
    if isinstance(value, enum.Enum):  # before the leaves: an IntEnum is an int, yet pickled as its class
        return plain_state(value.value, where)
    if isinstance(value, _PLAIN_LEAVES):
        return value if type(value) in _PLAIN_LEAVES or isinstance(value, torch.Tensor) else _base_value(value)
    if isinstance(value, (dict, collections.OrderedDict)):
        items = {key: plain_state(item, f"{where}.{key}") for key, item in value.items()}
        return collections.OrderedDict(items) if type(value) is collections.OrderedDict else items
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [plain_state(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(items)  # a namedtuple becomes a plain tuple
        return set(items) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, PurePath):
        return str(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()  # a numpy scalar
    raise UnsafeCheckpointValue(
        f"the checkpoint cannot hold {where} = {_short(value)} (a {type(value).__module__}."
        f"{type(value).__qualname__}): loading it back would mean unpickling an arbitrary object, which "
        "checkpoints never do. Fix: keep only tensors, numbers, strings, paths, enums and containers of them "
        "there; for a hyperparameter, pass it as a plain value or leave it out with "
        "self.save_hyperparameters(ignore=[...])."
    )


def _base_value(value: Any) -> Any:
    """A subclass of int, str, ... (not an enum) as a value of its plain base type."""
    for base in (bool, int, float, complex, str, bytes):
        if isinstance(value, base):
            return base(value)
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
