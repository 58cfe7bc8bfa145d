"""Jobs for the elastic tests: every optimizer step records which sample ids it trained on, per
rank and per worker-group start, so a test can check that each epoch trained every sample once.

A sample's features are a fixed function of its id, and the id rides along in the batch. Each
step sleeps `pace_s` so that a node can be killed, and added back, while the run goes on; with
`pace_file`, only while that file exists, so a test that has played its faults lets the rest of the
run go at full speed.
"""

from __future__ import annotations

import json
import os
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FEATURES = 8


class IdsDataset(Dataset):
    def __init__(self, size: int):
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, FEATURES, generator=generator)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index], index


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _pace(pace_s: float, pace_file: str | None) -> None:
    if pace_s and (pace_file is None or os.path.exists(pace_file)):
        time.sleep(pace_s)


def _record(folder: str, rank: int, **entry) -> None:
    """One line per step (torch) or micro-batch (Lightning), in this rank's file of this start."""
    attempt = int(os.environ.get("ORCHESTRATOR_ATTEMPT", "0"))
    with open(os.path.join(folder, f"attempt-{attempt:03d}-rank-{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"attempt": attempt, "rank": rank, **entry}) + "\n")


def train_loop(ctx) -> None:
    """The plain-torch path with gradient accumulation: ctx.backward, ctx.step_due, ctx.step."""
    config = ctx.config
    model = ctx.prepare_model(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.data_loader(IdsDataset(config["samples"]), batch_size=config["batch_size"])
    ctx.track(model=model, optimizer=optimizer)
    for epoch in ctx.epochs():
        ids: list[int] = []
        for x, y, index in loader:
            ctx.backward(F.cross_entropy(model(x), y))
            ids += index.tolist()
            if ctx.step_due:
                optimizer.step()
                optimizer.zero_grad()
                ctx.step()
                _record(config["records"], ctx.rank, step=ctx.global_step, epoch=epoch, world=ctx.world_size,
                        ids=ids)
                ids = []
                _pace(config.get("pace_s", 0), config.get("pace_file"))


class IdsModule(pl.LightningModule):
    def __init__(self, records: str, pace_s: float = 0.0, lr: float = 0.1, pace_file: str | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.net = _model()

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        trainer = self.trainer
        _record(self.hparams.records, self.global_rank, step=trainer.global_step + 1, epoch=trainer.current_epoch,
                world=trainer.world_size, ids=index.tolist())
        _pace(self.hparams.pace_s / trainer.accumulate_grad_batches, self.hparams.pace_file)
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class IdsData(pl.LightningDataModule):
    def __init__(self, samples: int, batch_size: int):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self):
        return DataLoader(IdsDataset(self.samples), batch_size=self.batch_size, shuffle=True)


def committed_ids(folder: str) -> dict[int, list[int]]:
    """For each epoch, the ids of the steps whose update reached the final weights: a step that ran
    in several starts counts from the last one (an earlier run of it was rolled back)."""
    by_step: dict[int, list[dict]] = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                entry = json.loads(line)
                by_step.setdefault(entry["step"], []).append(entry)
    epochs: dict[int, list[int]] = {}
    for _step, entries in sorted(by_step.items()):
        last = max(e["attempt"] for e in entries)
        for entry in entries:
            if entry["attempt"] == last:
                epochs.setdefault(entry["epoch"], []).extend(entry["ids"])
    return epochs


def world_sizes_by_attempt(folder: str) -> dict[int, int]:
    sizes = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                entry = json.loads(line)
                sizes[entry["attempt"]] = entry["world"]
    return sizes


def max_step(folder: str, world: int | None = None) -> int:
    steps = [0]
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                entry = json.loads(line)
                if world is None or entry["world"] == world:
                    steps.append(entry["step"])
    return max(steps)
