"""State <-> bytes without ever unpickling arbitrary objects.

Saving uses torch.save; loading uses torch.load(weights_only=True), which only rebuilds tensors,
numbers, strings and containers. A checkpoint holding any other object is refused, because loading
it would run code chosen by whoever wrote the file.
"""

from __future__ import annotations

import io
import pickle
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
