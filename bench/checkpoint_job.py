"""Checkpoint benchmark job: ~100 MB of model + optimizer state (12.6 M float32 parameters and as
many SGD momentum values), trained with a checkpoint every N steps.

mode "async": the orchestrator checkpoints (ctx.step -> snapshot -> background write).
mode "sync":  the loop itself calls torch.save every N steps, the usual synchronous baseline.
Both report the seconds the training loop was blocked by checkpointing, and the loop's wall time.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))


def train_loop(ctx) -> None:
    cfg = ctx.config
    torch.manual_seed(0)
    model = ctx.prepare_model(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    ctx.track(model=model, optimizer=optimizer)
    x, y = torch.randn(cfg["batch_size"], 2048), torch.randn(cfg["batch_size"], 2048)
    sync_stall = 0.0
    start = time.perf_counter()
    for _ in ctx.epochs():
        for step in range(cfg["steps"]):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            if cfg["mode"] == "sync" and (step + 1) % cfg["every"] == 0:
                t0 = time.perf_counter()
                path = os.path.join(cfg["sync_dir"], f"step-{step + 1}.pt")
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
                sync_stall += time.perf_counter() - t0
            ctx.step()
        break
    ctx.report(loop_wall_s=time.perf_counter() - start, sync_stall_s=sync_stall)
