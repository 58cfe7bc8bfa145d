"""The benchmark workload, shared by the orchestrator job and the torchrun baseline so both
train the very same model on the very same data."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

IN_FEATURES, HIDDEN, CLASSES = 1024, 2048, 16


def build_model() -> nn.Module:
    # ~8.4 M parameters: one step of batch 128 takes well over 50 ms on one CPU core.
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def build_dataset(num_samples: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, IN_FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (num_samples,), generator=g)
    return TensorDataset(x, y)
