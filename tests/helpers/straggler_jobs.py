"""Jobs with one rank slowed for real, for the straggler tests (tests/e2e/test_straggler_runs.py): every
rank spends `work_s` a step on its own work before the forward (a step's compute, as a sleep so
that a busy machine does not blur it), and rank `slow_rank` `slow_factor` times as long, as a rank
on a slower node would. Nothing in the product is switched: the product measures what it sees.
The same training on each path: a ctx loop, a LightningModule, and a torchrun script
(straggler_script.py)."""

from __future__ import annotations

import time

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def own_work_s(rank: int, work_s: float, slow_rank: int, slow_factor: float) -> float:
    return work_s * (slow_factor if rank == slow_rank else 1.0)


def dataset(steps: int, world_size: int, batch_size: int = 4) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    n = steps * world_size * batch_size
    return TensorDataset(torch.randn(n, 8, generator=generator), torch.randint(0, 2, (n,), generator=generator))


def train_loop(ctx) -> None:
    """With `slow_after_s` in the config the slow rank is even with its peers until that many
    seconds after its first step, then slowed; with `marker`, it writes the time.time() it was
    first slowed there (bench/stragglers.py times the warning from it)."""
    cfg = ctx.config
    slowed_s = own_work_s(ctx.rank, cfg["work_s"], cfg.get("slow_rank", -1), cfg.get("slow_factor", 1.0))
    model = ctx.prepare_model(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ctx.data_loader(dataset(cfg["steps"], ctx.world_size), batch_size=4)
    ctx.track(model=model, optimizer=optimizer)
    slow_from, marker = None, cfg.get("marker")
    for _epoch in ctx.epochs():
        for x, y in loader:
            slow_from = slow_from or time.time() + cfg.get("slow_after_s", 0.0)
            slowed = time.time() >= slow_from
            if slowed and marker and slowed_s != cfg["work_s"]:
                with open(marker, "w") as f:
                    f.write(repr(time.time()))
                marker = None
            time.sleep(slowed_s if slowed else cfg["work_s"])
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ctx.step(loss=loss.item())


class SlowRankModule(L.LightningModule):
    def __init__(self, work_s: float = 0.02, slow_rank: int = -1, slow_factor: float = 1.0):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        hp = self.hparams
        time.sleep(own_work_s(self.global_rank, hp.work_s, hp.slow_rank, hp.slow_factor))
        x, y = batch
        return F.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RandomData(L.LightningDataModule):
    def __init__(self, steps: int = 200, world_size: int = 2):
        super().__init__()
        self.steps, self.world_size = steps, world_size

    def train_dataloader(self):
        return DataLoader(dataset(self.steps, self.world_size), batch_size=4)
