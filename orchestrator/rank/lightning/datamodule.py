"""The LightningDataModule built from the spec's `data:` section, for Lightning jobs that give no
`lightning.data`: its loaders read the Parquet inputs (parquet.py). The training loader is then
taken over by the global order like any other (rank/lightning/fit.py), so it resumes
mid-epoch at any world size."""

from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from orchestrator.data.parquet import ParquetDataset
from orchestrator.data.sources import open_source
from orchestrator.spec.data import DataSourceSpec, DataSpec


def _loader(source: DataSourceSpec, name: str, shuffle: bool) -> DataLoader:
    dataset = ParquetDataset(open_source(source, f"data.{name}"), window=source.window)
    return DataLoader(dataset, batch_size=source.batch_size, shuffle=shuffle, drop_last=source.drop_last,
                      collate_fn=ParquetDataset.collate)


class SpecDataModule(pl.LightningDataModule):
    def __init__(self, data: DataSpec):
        super().__init__()
        self.data = data

    def train_dataloader(self) -> DataLoader:
        return _loader(self.data.train, "train", self.data.train.shuffle)


def _val_dataloader(self) -> DataLoader:
    return _loader(self.data.val, "val", self.data.val.shuffle)


def _test_dataloader(self) -> DataLoader:
    return _loader(self.data.test, "test", self.data.test.shuffle)


def build_datamodule(data: DataSpec) -> pl.LightningDataModule:
    """A SpecDataModule with a val and a test loader only where the spec gives them: Lightning
    validates and tests when the module defines those methods."""
    methods = {}
    if data.val is not None:
        methods["val_dataloader"] = _val_dataloader
    if data.test is not None:
        methods["test_dataloader"] = _test_dataloader
    return type("SpecDataModule", (SpecDataModule,), methods)(data)
