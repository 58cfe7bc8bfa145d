"""bench/torchrun.py's ctx-path job: tests/helpers/torchrun_seed.py's training, written for `orchestrator run`.

The same MLP (32 -> width -> 4), the same synthetic data (torch.manual_seed(0), `samples` rows),
SGD with momentum, the same per-rank batch size and the same `step_sleep` after each optimizer
step, but the orchestrator does what the script did by hand: DDP (ctx.prepare_model), sharding and
mid-epoch resume (ctx.data_loader), checkpoints (spec checkpoint.every_n_steps) and the restart.

Rank `fault_rank` SIGKILLs its own process once (fault kill), at step `fault_step` of epoch
`fault_epoch`: a rank is a child process of its node's agent, which restarts every rank in place.
With fault kill_agent it SIGKILLs its agent (its parent, the Ray Train worker) instead: Ray Train
restarts the whole worker group. The marker file `<work_dir>/fault-kill.done`, written just
before, holds the time.time() of the kill and keeps the restarted ranks from doing it again.

Rank 0 appends one JSON line per event to `<work_dir>/events.jsonl`, as the torchrun script does:
{"kind": "start" | "first_step" | "rate", "time": time.time(), "attempt": which start of the worker
group this is (ctx.attempt, also ORCHESTRATOR_ATTEMPT), "pid", ...}. "first_step" is written once
per start of the group, right after its first optimizer step (and the step's sleep), before
ctx.step(): the framework's per-step work is not in it.
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

IN_FEATURES, CLASSES = 32, 4


def build_model(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(IN_FEATURES, width), torch.nn.ReLU(), torch.nn.Linear(width, CLASSES))


def build_dataset(samples: int) -> TensorDataset:
    torch.manual_seed(0)
    return TensorDataset(torch.randn(samples, IN_FEATURES), torch.randint(0, CLASSES, (samples,)))


def _attempt() -> int:
    """Which start of the ranks this is, from 1: the orchestrator's word, or plain torchrun's restarts + 1."""
    return int(os.environ.get("ORCHESTRATOR_ATTEMPT") or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1)


def event(cfg: dict, rank: int, kind: str, **fields) -> None:
    if rank != 0:
        return
    line = {"kind": kind, "time": time.time(), "pid": os.getpid(),
            "attempt": _attempt(), **fields}
    # One open/append/close per line: a killed writer leaves no buffered lines behind.
    with open(os.path.join(cfg["work_dir"], "events.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def hurt_once(cfg: dict, rank: int, epoch: int, step: int) -> None:
    """fault kill: this rank's process is SIGKILLed; kill_agent: its node's agent (its parent)."""
    fault = cfg.get("fault", "none")
    if fault not in ("kill", "kill_agent"):
        return
    if rank != cfg.get("fault_rank", 1) or epoch != cfg.get("fault_epoch", 1) or step != cfg.get("fault_step", 3):
        return
    marker = os.path.join(cfg["work_dir"], "fault-kill.done")
    if os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write(str(time.time()))
    os.kill(os.getppid() if fault == "kill_agent" else os.getpid(), signal.SIGKILL)


def train_loop(ctx) -> None:
    cfg = ctx.config
    os.makedirs(cfg["work_dir"], exist_ok=True)
    event(cfg, ctx.rank, "start", world_size=ctx.world_size, global_step=ctx.global_step)
    data = build_dataset(cfg.get("samples", 4096))
    model = ctx.prepare_model(build_model(cfg.get("width", 1024)))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.get("lr", 0.05), momentum=0.9)
    loader = ctx.data_loader(data, batch_size=cfg.get("batch_size", 64))
    ctx.track(model=model, optimizer=optimizer)
    sleep_s = cfg.get("step_sleep", 0.0)

    first, steps, window_start = True, 0, None
    for epoch in ctx.epochs():
        for step, (x, y) in enumerate(loader):
            hurt_once(cfg, ctx.rank, epoch, step)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if sleep_s:
                time.sleep(sleep_s)
            steps += 1
            if first:
                event(cfg, ctx.rank, "first_step", epoch=epoch, global_step=ctx.global_step + 1)
                first, window_start, steps = False, time.perf_counter(), 0
            ctx.step(loss=loss.item())
    if window_start is not None and steps:
        event(cfg, ctx.rank, "rate", steps_per_s=steps / (time.perf_counter() - window_start), steps=steps)
