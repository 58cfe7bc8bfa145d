"""weights_sha256 of real modules, against a hash computed here from numpy's bytes of each tensor."""

from __future__ import annotations

import hashlib

import torch

from orchestrator.rank.fingerprint import weights_sha256


def _expected(state_dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()


def test_a_model_with_batchnorm_is_hashed_with_its_zero_dim_step_counter_and_the_counter_counts():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model(torch.randn(8, 4))  # one training forward: running stats and num_batches_tracked move
    state = model.state_dict()
    assert state["1.num_batches_tracked"].dim() == 0 and state["1.num_batches_tracked"].item() == 1
    before = weights_sha256(state)
    assert before == _expected(state)
    model(torch.randn(8, 4))
    assert weights_sha256(model.state_dict()) != before


def test_a_ddp_wrappers_prefix_does_not_change_the_hash():
    model = torch.nn.Linear(4, 3)
    wrapped = {f"module.{k}": v for k, v in model.state_dict().items()}
    assert weights_sha256(wrapped) == weights_sha256(model.state_dict()) == _expected(model.state_dict())
