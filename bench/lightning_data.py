"""The benchmarks' LightningDataModule: a synthetic dataset (a subclass names its builder), one shuffled loader."""

from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset


class SyntheticData(pl.LightningDataModule):
    """`samples` rows from the subclass's `build(samples)`, in shuffled batches of `batch_size`."""

    @staticmethod
    def build(samples: int) -> Dataset:
        raise NotImplementedError

    def __init__(self, samples: int, batch_size: int = 64):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def setup(self, stage: str):
        self.train_set = self.build(self.samples)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)
