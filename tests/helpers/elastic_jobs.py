"""Jobs for the elastic tests: every optimizer step records which sample ids it trained on, per
rank and per worker-group start, so a test can check that each epoch trained every sample once.

Which steps reached the final weights is told by the weights themselves, not by the orchestrator's
step counter: the model holds a count of the optimizer steps it has taken (a buffer, saved and
restored with its parameters), and each start records that count before its first step, the step
it really resumed from.

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
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    # The optimizer steps these weights have taken: in the state_dict, so a checkpoint holds the
    # count of the weights it holds. (Float: compared with the parameters by allclose. One element,
    # not a 0-d tensor: the run's weights_sha256 cannot hash a 0-d tensor of 8-byte elements.)
    model.register_buffer("steps_taken", torch.zeros(1, dtype=torch.float64))
    return model


def _count_step(model: torch.nn.Module) -> None:
    with torch.no_grad():
        model.steps_taken += 1


def _pace(pace_s: float, pace_file: str | None) -> None:
    if pace_s and (pace_file is None or os.path.exists(pace_file)):
        time.sleep(pace_s)


def _file(folder: str, kind: str, rank: int) -> str:
    attempt = int(os.environ.get("ORCHESTRATOR_ATTEMPT", "0"))
    return os.path.join(folder, f"{kind}-{attempt:03d}-rank-{rank}.jsonl")


def _note_start(folder: str, rank: int, model: torch.nn.Module) -> None:
    """Once a start, before its first optimizer step: the steps the weights it restored had taken."""
    path = _file(folder, "start", rank)
    if not os.path.exists(path):
        attempt = int(os.environ.get("ORCHESTRATOR_ATTEMPT", "0"))
        with open(path, "w") as f:
            f.write(json.dumps({"attempt": attempt, "rank": rank, "restored": int(model.steps_taken.item())}) + "\n")


def _record(folder: str, rank: int, **entry) -> None:
    """One line per step (torch) or micro-batch (Lightning), in this rank's file of this start."""
    attempt = int(os.environ.get("ORCHESTRATOR_ATTEMPT", "0"))
    with open(_file(folder, "attempt", rank), "a") as f:
        f.write(json.dumps({"attempt": attempt, "rank": rank, **entry}) + "\n")


def train_loop(ctx) -> None:
    """The plain-torch path with gradient accumulation: ctx.backward, ctx.step_due, ctx.step."""
    config = ctx.config
    net = _model()
    model = ctx.prepare_model(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.data_loader(IdsDataset(config["samples"]), batch_size=config["batch_size"])
    ctx.track(model=model, optimizer=optimizer)
    for epoch in ctx.epochs():
        ids: list[int] = []
        for x, y, index in loader:
            _note_start(config["records"], ctx.rank, net)
            ctx.backward(F.cross_entropy(model(x), y))
            ids += index.tolist()
            if ctx.step_due:
                optimizer.step()
                optimizer.zero_grad()
                _count_step(net)
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
        _note_start(self.hparams.records, self.global_rank, self.net)
        _record(self.hparams.records, self.global_rank, step=trainer.global_step + 1, epoch=trainer.current_epoch,
                world=trainer.world_size, ids=index.tolist())
        _pace(self.hparams.pace_s / trainer.accumulate_grad_batches, self.hparams.pace_file)
        return F.cross_entropy(self.net(x), y)

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        _count_step(self.net)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class IdsData(pl.LightningDataModule):
    def __init__(self, samples: int, batch_size: int):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self):
        return DataLoader(IdsDataset(self.samples), batch_size=self.batch_size, shuffle=True)


def _lines(folder: str, prefix: str):
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix):
            with open(os.path.join(folder, name)) as f:
                yield from (json.loads(line) for line in f)


def restored_by_attempt(folder: str) -> dict[int, int]:
    """For each start that took a step, the optimizer steps its restored weights had taken (the
    weights' own count: 0 for a start from scratch). Every rank of a start restored the same."""
    counts: dict[int, set[int]] = {}
    for start in _lines(folder, "start-"):
        counts.setdefault(start["attempt"], set()).add(start["restored"])
    assert all(len(seen) == 1 for seen in counts.values()), f"the ranks of a start restored different weights: {counts}"
    return {attempt: seen.pop() for attempt, seen in sorted(counts.items())}


def committed_ids(folder: str) -> dict[int, list[int]]:
    """For each epoch, the ids of the steps whose update reached the final weights. A step an
    attempt took is rolled back when a later start restored weights that had taken fewer steps
    (by their own count, restored_by_attempt), whatever step the orchestrator said it resumed at:
    so a resume that restored older weights but kept the step counter loses those steps here."""
    restored = restored_by_attempt(folder)
    entries = list(_lines(folder, "attempt-"))
    unnoted = sorted({entry["attempt"] for entry in entries} - set(restored))
    assert not unnoted, f"attempts {unnoted} took steps but noted no start (_note_start): the oracle cannot tell what they restored"
    epochs: dict[int, list[int]] = {}
    for entry in entries:
        kept_up_to = min((steps for attempt, steps in restored.items() if attempt > entry["attempt"]),
                         default=entry["step"])
        if entry["step"] <= kept_up_to:
            epochs.setdefault(entry["epoch"], []).extend(entry["ids"])
    return epochs


def world_sizes_by_attempt(folder: str) -> dict[int, int]:
    return {entry["attempt"]: entry["world"] for entry in _lines(folder, "attempt-")}


def max_step(folder: str, world: int | None = None) -> int:
    return max([0] + [e["step"] for e in _lines(folder, "attempt-") if world is None or e["world"] == world])
