"""A loop whose data is augmented at random in DataLoader worker processes, as image jobs are
(random crops, noise). Its resume is exact only if each sample's augmentation does not depend on
which worker process fetched it, or on where in the RNG stream the epoch's iterator was built."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from faulty import _kill_once
from torch.utils.data import Dataset

from jobs.digits_data import load_split
from jobs.digits_torch import build_model


class NoisyDigits(Dataset):
    """The digits with fresh random noise on every fetch: torch.rand, drawn in the loader's worker."""

    def __init__(self) -> None:
        self.base = load_split("train")

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        return x + torch.rand(x.shape), y


def noisy_loop(ctx) -> None:
    """Two loader workers; the worker of rank 1 dies once after step `kill_at` (if set)."""
    fault = ctx.config.get("fault")
    model = ctx.prepare_model(build_model(32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = ctx.data_loader(NoisyDigits(), batch_size=32, num_workers=2)
    ctx.track(model=model, optimizer=optimizer)
    for _epoch in ctx.epochs():
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            ctx.step()
            if fault:
                _kill_once(fault["marker"], ctx.global_step, fault["kill_at"], ctx.rank, 1)
