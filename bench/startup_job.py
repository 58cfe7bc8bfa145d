"""The smallest job, for bench/startup.py: a linear model, one optimizer step, on both sides.

`train_loop` is the orchestrator's torch job; `raw_train_func` is the same step as a raw Ray
Train function. Rank 0 writes the wall-clock time of its first optimizer step to
`config["first_step_file"]`.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def _mark(path: str) -> None:
    with open(path, "w") as f:
        f.write(repr(time.time()))


def train_loop(ctx) -> None:
    torch.manual_seed(0)
    model = ctx.prepare_model(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.track(model=model, optimizer=optimizer)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])
    for _ in ctx.epochs():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        ctx.step()
        if ctx.rank == 0 and ctx.global_step == 1:
            _mark(ctx.config["first_step_file"])


def raw_train_func(config: dict) -> None:
    import ray.train
    import ray.train.torch

    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    if ray.train.get_context().get_world_rank() == 0:
        _mark(config["first_step_file"])
