"""Quickstart: a Lightning classifier for handwritten digits, trained with DDP on Ray.

An ordinary LightningModule and LightningDataModule: nothing in them knows about Ray or the
orchestrator. The spec (jobs/quickstart.yaml) names them and says how to scale.

    orchestrator run jobs/quickstart.yaml                              # local mode: this machine, no Ray
    orchestrator run jobs/quickstart.yaml --set scaling.num_workers=4  # more workers
    ray job submit --working-dir . -- orchestrator run jobs/quickstart.yaml   # on a cluster
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from jobs.digits_data import NUM_CLASSES, NUM_FEATURES, ensure_parquet, load_split


class DigitsClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 128, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(NUM_FEATURES, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = _inputs(batch)
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=False)
        return loss

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def _evaluate(self, batch, stage: str):
        x, y = _inputs(batch)
        logits = self(x)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{stage}_acc", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def _inputs(batch):
    """(pixels, labels) from a batch of DigitsData (a tuple) or of the spec's data: section (a
    dict of the columns named in jobs/quickstart.yaml)."""
    return (batch["pixels"], batch["label"]) if isinstance(batch, dict) else batch


class DigitsData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.batch_size = batch_size

    def prepare_data(self):
        ensure_parquet()

    def setup(self, stage: str):
        self.train_set, self.val_set, self.test_set = (load_split(s) for s in ("train", "val", "test"))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=256)
