"""Snapshot buffers: copies later steps cannot change, in memory prepared before the first save."""

from __future__ import annotations

import torch

from orchestrator.rank.snapshot import SnapshotBuffers


def _state():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    return model, {"model": model.state_dict(), "progress": {"step": 3, "metrics": {"loss": 0.5}}}


def test_a_snapshot_does_not_change_when_training_goes_on():
    model, state = _state()
    snapshot = SnapshotBuffers().take(state)
    before = snapshot["model"]["0.weight"].clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert torch.equal(snapshot["model"]["0.weight"], before)
    assert snapshot["progress"] == {"step": 3, "metrics": {"loss": 0.5}}


def test_prepared_buffers_are_the_ones_the_first_snapshot_uses_whatever_the_state_structure():
    model, state = _state()
    buffers = SnapshotBuffers()
    # Prepared from the bare tensors; the snapshot nests them differently.
    buffers.prepare([p.detach() for p in model.state_dict().values()])
    buffers._preparing.join()
    prepared = {id(t) for pool in buffers._pool.values() for t in pool}
    snapshot = buffers.take(state)
    used = {id(t) for t in snapshot["model"].values()}
    assert used == prepared
    again = buffers.take(state)  # the previous snapshot's write is done: the same memory again
    assert {id(t) for t in again["model"].values()} == prepared
