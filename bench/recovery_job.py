"""Recovery benchmark jobs: the same small DDP loop twice, as an orchestrator torch job and as a
plain Ray Train V2 `train_loop_per_worker` that checkpoints and resumes the way Ray's docs show.

Both train a 2-layer MLP on synthetic data; a step is slowed with time.sleep to ~`sleep_s`, so
that the run lasts long enough to be interrupted and the machine's two cores stay mostly free
for Ray's own processes. Rank 0 appends one JSON line per completed optimizer step to the log
file named in the config (`{"side", "event", "step", "world_size", "rank", "time", "pid"}`),
plus one "ready" line once the model and the checkpoint are loaded, just before the first batch.
The benchmark reads the times off these lines: the kill is outside, the first step of the
restarted group is the first line with a new pid.

Each line is written at the same point in both loops: right after optimizer.step(), before the
framework's own per-step work (ctx.step, ray.train.report), so neither side's bookkeeping is in
the measured time of the first resumed step.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IN_FEATURES, HIDDEN, OUT_FEATURES = 32, 64, 1


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES))


def build_dataset(cfg: dict, world_size: int) -> TensorDataset:
    # Exactly one epoch of `steps` batches per rank: the run ends inside the first epoch, so a
    # resume is always mid-epoch and neither side's epoch bookkeeping comes into it.
    # Elastic runs (world size changing) name the size the dataset is built for.
    n = cfg["batch_size"] * cfg.get("data_world_size", world_size) * cfg["steps"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, IN_FEATURES, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def log_line(cfg: dict, side: str, event: str, step: int, rank: int, world_size: int) -> None:
    if rank != 0:
        return
    line = {"side": side, "event": event, "step": step, "world_size": world_size, "rank": rank,
            "time": time.time(), "pid": os.getpid()}
    # One open/append/close per line: a killed writer leaves no buffered lines behind, and the
    # old and the new rank 0 never share a file object.
    with open(cfg["log"], "a") as f:
        f.write(json.dumps(line) + "\n")


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x, y, sleep_s: float) -> float:
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()  # DDP's gradient all-reduce: a dead peer is noticed here
    time.sleep(sleep_s)  # the "compute" of a real step, without using a core
    optimizer.step()
    return loss.item()


def orchestrator_loop(ctx) -> None:
    """The orchestrator side: checkpoints and resume are the orchestrator's (spec checkpoint.every_n_steps)."""
    cfg = ctx.config
    torch.manual_seed(0)
    model = ctx.prepare_model(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = ctx.data_loader(build_dataset(cfg, ctx.world_size), batch_size=cfg["batch_size"])
    ctx.track(model=model, optimizer=optimizer)
    log_line(cfg, "orchestrator", "ready", ctx.global_step, ctx.rank, ctx.world_size)
    for _ in ctx.epochs():
        for x, y in loader:
            loss = _train_step(model, optimizer, x, y, cfg["sleep_s"])
            log_line(cfg, "orchestrator", "step", ctx.global_step + 1, ctx.rank, ctx.world_size)
            ctx.step(loss=loss)


def raw_loop(cfg: dict) -> None:
    """The raw Ray Train V2 side: checkpoint every `every` steps with ray.train.report, resume
    from ray.train.get_checkpoint(), skipping the batches already trained in the epoch."""
    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(build_dataset(cfg, world_size), batch_size=cfg["batch_size"], shuffle=True))
    log_line(cfg, "raw", "ready", step, rank, world_size)
    for i, (x, y) in enumerate(loader):
        if i < step:  # already trained before the restart (the simple way: load and skip them)
            continue
        loss = _train_step(model, optimizer, x, y, cfg["sleep_s"])
        step += 1
        log_line(cfg, "raw", "step", step, rank, world_size)
        if step % cfg["every"] == 0:
            with tempfile.TemporaryDirectory() as d:
                saved = None
                if rank == 0:
                    torch.save({"model": getattr(model, "module", model).state_dict(),
                                "optimizer": optimizer.state_dict(), "step": step}, os.path.join(d, "state.pt"))
                    saved = Checkpoint.from_directory(d)
                ray.train.report({"step": step, "loss": loss}, checkpoint=saved)
        if step >= cfg["steps"]:
            break
