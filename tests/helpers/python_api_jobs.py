"""Tiny ctx loops for the tests of `orchestrator.run()` from a Python caller (tests/e2e/test_python_api.py)
and of the ranks' priority on Ray: no data set, a model of one layer, a step in a few milliseconds.

- `stepping_loop`: rank 0 writes the `ctx.config` it was given to `config_out`, then every rank steps
  every `sleep_s` for `steps` steps an epoch; after step `mark_at` rank 0 writes `marker`.
- `save_then_raise`: tracks a model of `mib` MiB (its write takes a while, so a checkpoint still in
  flight when the loop raises is one a process exit would lose), saves once, and raises.
- `record_niceness`: each rank writes its own niceness and its parent's (its agent's) to `out_dir`.
"""

from __future__ import annotations

import json
import os
import time

import torch
from torch import nn


def _write(path: str, text: str) -> None:
    with open(path + ".partial", "w") as f:
        f.write(text)
    os.replace(path + ".partial", path)


def stepping_loop(ctx) -> None:
    cfg = ctx.config
    if ctx.rank == 0 and cfg.get("config_out"):
        _write(cfg["config_out"], json.dumps(cfg))
    model = ctx.prepare_model(nn.Linear(4, 2))
    ctx.track(model=model)
    for _epoch in ctx.epochs():
        for _ in range(cfg.get("steps", 1000)):
            time.sleep(cfg.get("sleep_s", 0.05))
            ctx.step()
            if ctx.rank == 0 and cfg.get("marker") and ctx.global_step == cfg.get("mark_at", 3):
                _write(cfg["marker"], str(ctx.global_step))


def save_then_raise(ctx) -> None:
    features = ctx.config.get("mib", 64) * 2**20 // 4 // 1024
    model = ctx.prepare_model(nn.Linear(1024, features, bias=False))
    with torch.no_grad():
        model.weight.uniform_()  # not all zeros: the file's bytes are the model's
    ctx.track(model=model)
    ctx.step()
    ctx.save()
    raise ValueError("the loop raised right after its save")


def _nice_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of stat: nice


def record_niceness(ctx) -> None:
    _write(os.path.join(ctx.config["out_dir"], f"rank-{ctx.rank}"),
           json.dumps({"rank": os.getpriority(os.PRIO_PROCESS, 0), "agent": _nice_of(os.getppid())}))
    model = ctx.prepare_model(nn.Linear(4, 2))
    ctx.track(model=model)
    for _epoch in ctx.epochs():
        ctx.step()
