"""Data augmented at random in DataLoader worker processes, as image jobs' is (random crops,
noise). A resume is exact only if each sample's augmentation does not depend on which worker
process fetched it, or on where in the RNG stream the epoch's iterator was built. The loop that
trains on it in a real run is tests/helpers/tutorial_loop.py."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from jobs.digits_data import load_split


class NoisyDigits(Dataset):
    """The digits with fresh random noise on every fetch: torch.rand, drawn in the loader's worker."""

    def __init__(self) -> None:
        self.base = load_split("train")

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        return x + torch.rand(x.shape), y
