"""A plain-torch job that reads the spec's data: section (ctx.data), records which row ids each
optimizer step trained on (elastic_jobs' format), and whose worker of rank 1 dies once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from elastic_jobs import _count_step, _note_start, _record
from faulty import _kill_once


def train_loop(ctx) -> None:
    config = ctx.config
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 2)
    # The optimizer steps these weights have taken, saved with them (elastic_jobs' oracle).
    net.register_buffer("steps_taken", torch.zeros(1, dtype=torch.float64))
    model = ctx.prepare_model(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.data("train")
    ctx.track(model=model, optimizer=optimizer)
    for epoch in ctx.epochs():
        for batch in loader:
            _note_start(config["records"], ctx.rank, net)
            loss = F.cross_entropy(model(batch["x"]), batch["id"] % 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            _count_step(net)
            ctx.step(loss=loss.item())
            _record(config["records"], ctx.rank, step=ctx.global_step, epoch=epoch, world=ctx.world_size,
                    ids=batch["id"].tolist())
            _kill_once(config["marker"], ctx.global_step, config["kill_at"], ctx.rank, 1)
