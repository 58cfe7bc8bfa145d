"""A plain PyTorch DDP loop as an orchestrator job: the digits classifier without Lightning.

This is the usual tutorial loop (model, DistributedSampler with set_epoch, optimizer) with four
lines changed, marked "ctx". The orchestrator starts the workers, forms the process group, and
makes the loop resumable: stop it at any step and the next run continues bit for bit.

    orchestrator run jobs/digits_torch.yaml
    orchestrator run jobs/digits_torch.yaml --set torch.config.lr=0.01 --set scaling.num_workers=4
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jobs.digits_data import NUM_CLASSES, NUM_FEATURES, load_split


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(NUM_FEATURES, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )


def train_loop(ctx) -> None:
    cfg = ctx.config
    model = ctx.prepare_model(build_model(cfg.get("hidden", 128)))              # ctx: DDP + device
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.get("lr", 0.05), momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    loader = ctx.data_loader(load_split("train"), batch_size=cfg.get("batch_size", 32))  # ctx: sharded, resumable
    ctx.track(model=model, optimizer=optimizer, scheduler=scheduler)              # ctx: saved and restored

    for _epoch in ctx.epochs():                                                   # ctx: resumes at the right epoch
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            ctx.step(loss=loss.item())                                            # ctx: progress + checkpoints
        ctx.report(val_acc=evaluate(model, load_split("val"), ctx.device))

    ctx.report(test_acc=evaluate(model, load_split("test"), ctx.device))


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device) -> float:
    model.eval()
    x, y = (t.to(device) for t in dataset.tensors)
    accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    model.train()
    return accuracy
