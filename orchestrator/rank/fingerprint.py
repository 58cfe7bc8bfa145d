"""`weights_sha256`: one hash of a model's state, so two runs that should match can be compared."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def weights_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """Hash names, dtypes, shapes and bytes of every tensor, in sorted-name order.

    A DDP wrapper's "module." prefix is dropped so the plain module and its wrapped form agree.
    """
    digest = hashlib.sha256()
    items = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state_dict.items()}
    for name in sorted(items):
        value = items[name]
        if not isinstance(value, torch.Tensor):
            continue
        tensor = value.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        # reshape(-1): a 0-dim tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes;
        # for every other tensor its bytes are the same.
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
