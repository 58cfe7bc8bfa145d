"""TrainState: what makes resume exact survives a round trip through a weights_only checkpoint."""

from __future__ import annotations

import random

import numpy as np
import torch

from orchestrator.checkpoint import dumps_state, loads_state
from orchestrator.rank.rng import capture_rng, restore_rng, seed_everything
from orchestrator.rank.train_state import Progress, TrainState


def _training_objects(steps: int, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}


def test_model_optimizer_scheduler_scaler_progress_and_rng_load_back_without_unpickling():
    objects = _training_objects(steps=3, seed=0)
    objects["scaler"].scale(torch.ones(1))
    objects["scaler"].update(new_scale=256.0)  # the scale a run with overflows would have reached
    seed_everything(7)
    state = TrainState(progress=Progress(epoch=2, step=33, batch_in_epoch=5, metrics={"loss": 0.25}),
                       objects={name: obj.state_dict() for name, obj in objects.items()},
                       ranks=[{"rng": capture_rng()}, {"rng": capture_rng()}])
    expected = (random.random(), float(np.random.rand()), torch.rand(3))

    loaded = TrainState.from_dict(loads_state(dumps_state(state.to_dict()), source="test"))  # weights_only=True

    assert loaded.progress == state.progress
    fresh = _training_objects(steps=0, seed=1)  # different weights, no optimizer state, lr and scale at start
    for name, obj in fresh.items():
        obj.load_state_dict(loaded.objects[name])
    assert torch.equal(fresh["model"].weight, objects["model"].weight)
    moments = [fresh["optimizer"].state[p]["exp_avg"] for p in fresh["model"].parameters()]
    assert all(torch.equal(a, objects["optimizer"].state[p]["exp_avg"])
               for a, p in zip(moments, objects["model"].parameters(), strict=True))
    assert fresh["scheduler"].get_last_lr() == objects["scheduler"].get_last_lr()
    assert fresh["scaler"].get_scale() == objects["scaler"].get_scale()
    restore_rng(loaded.rng_of(1, world_size=2))
    assert (random.random(), float(np.random.rand())) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


def test_rng_states_saved_by_another_world_size_are_not_used():
    state = TrainState(progress=Progress(), objects={}, ranks=[{"rng": capture_rng()}] * 2)
    assert state.rng_of(0, world_size=2) is not None
    assert state.rng_of(0, world_size=4) is None
