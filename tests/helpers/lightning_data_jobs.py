"""Lightning code written the way users write it for a single machine, for the Lightning tests:
a weighted sampler and streaming IterableDatasets, one the same on every rank and one that splits
itself by rank (the model, elastic_jobs.IdsModule, records the sample ids of every micro-batch it
trains on); a module whose hyperparameters hold a path and an enum; a callback of the user's own."""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from elastic_jobs import IdsDataset
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, IterableDataset, WeightedRandomSampler

from jobs.digits import DigitsClassifier


class Split(enum.Enum):
    TRAIN = "train"


class PathsClassifier(DigitsClassifier):
    """The quickstart model, with hyperparameters as users keep them: a path and an enum
    (`save_hyperparameters()` puts both into every checkpoint)."""

    def __init__(self, cache_dir: Path = Path("cache"), split: Split = Split.TRAIN, **kwargs):
        super().__init__(**kwargs)
        self.save_hyperparameters()


class LazyBuildClassifier(DigitsClassifier):
    """The quickstart model with a configure_model that only finishes building it (Lightning's
    documented use for large models), and shards nothing itself."""

    def configure_model(self):
        self.built = True


class EpochRecorder(Callback):
    """A user's callback: one line per rank and epoch end, with the step and the validation loss."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_epoch_end(self, trainer, pl_module):
        line = {"rank": trainer.global_rank, "epoch": trainer.current_epoch, "step": trainer.global_step,
                "val_loss": float(trainer.callback_metrics["val_loss"])}
        with open(os.path.join(self.folder, f"rank-{trainer.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


class EvenIdsData(pl.LightningDataModule):
    """A WeightedRandomSampler that never draws an odd id: its weighting must survive DDP."""

    def __init__(self, samples: int, batch_size: int):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self):
        weights = [1.0 if i % 2 == 0 else 0.0 for i in range(self.samples)]
        sampler = WeightedRandomSampler(weights, num_samples=self.samples, replacement=True,
                                        generator=torch.Generator().manual_seed(3))
        return DataLoader(IdsDataset(self.samples), batch_size=self.batch_size, sampler=sampler)


class Stream(IterableDataset):
    """Samples as a stream (no len()), as a reader of a large corpus yields them."""

    def __init__(self, samples: int):
        self.data = IdsDataset(samples)

    def __iter__(self):
        for index in range(len(self.data)):
            yield self.data[index]


class StreamData(pl.LightningDataModule):
    def __init__(self, samples: int, batch_size: int):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self):
        return DataLoader(Stream(self.samples), batch_size=self.batch_size)


class RankStream(Stream):
    """A stream that splits itself over the ranks, as a reader of a sharded corpus does: it asks
    torch.distributed in its own __iter__."""

    def __iter__(self):
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        for index in range(rank, len(self.data), world):
            yield self.data[index]


class StreamThenRankStreamData(StreamData):
    """Epoch 0 reads a Stream, epoch 1 a RankStream (with Trainer(reload_dataloaders_every_n_epochs=1),
    Lightning asks for the loader again every epoch): one run trains on both kinds."""

    def train_dataloader(self):
        stream = RankStream if self.trainer.current_epoch >= 1 else Stream
        return DataLoader(stream(self.samples), batch_size=self.batch_size)
