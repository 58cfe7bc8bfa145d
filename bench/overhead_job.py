"""The benchmark workload as an orchestrator torch job: the baseline's loop with the ctx lines."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bench.workload import build_dataset, build_model


def train_loop(ctx) -> None:
    steps, warmup, batch = ctx.config["steps"], ctx.config["warmup"], ctx.config["batch_size"]
    model = ctx.prepare_model(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = ctx.data_loader(build_dataset(batch * ctx.world_size * (steps + warmup)), batch_size=batch)
    ctx.track(model=model, optimizer=optimizer)
    start = None
    for _ in ctx.epochs():
        for i, (x, y) in enumerate(loader):
            if i == warmup:
                dist.barrier()
                start, cpu_start = time.perf_counter(), time.process_time()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            ctx.step(loss=loss.item())
    dist.barrier()
    # CPU seconds of this process per step next to wall seconds: where the two differ, the
    # process was waiting (for the peer, or for a core that something else was using).
    cpu_ms = 1000 * (time.process_time() - cpu_start) / steps
    ctx.report(steps_per_s=steps / (time.perf_counter() - start), cpu_ms_per_step=cpu_ms)
