"""faulty.slow_loop, and rank 0 writes down its model's weights as they are right after optimizer
step `weights_at` (`weights_to`, a torch.save of the state_dict of the module DDP wraps), read from
the live model: what a checkpoint of that step must hold, known without the checkpoint code that
wrote it."""

from __future__ import annotations

import os

import torch
from faulty import slow_loop


def slow_loop_noting_weights(ctx) -> None:
    at, path = ctx.config.pop("weights_at"), ctx.config.pop("weights_to")
    tracked, original_track, original_step = {}, ctx.track, ctx.step

    def track(**objects):
        tracked.update(objects)
        return original_track(**objects)

    def step(**metrics):
        original_step(**metrics)
        if ctx.rank == 0 and ctx.global_step == at:
            model = getattr(tracked["model"], "module", tracked["model"])  # the module DDP wraps
            state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
            torch.save(state, path + ".part")
            os.replace(path + ".part", path)  # whole or absent, whenever the run is ended

    ctx.track, ctx.step = track, step
    slow_loop(ctx)
