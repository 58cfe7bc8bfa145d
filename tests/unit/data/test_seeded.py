"""Random augmentations drawn in DataLoader worker processes resume exactly: each sample's
randomness is a function of (seed, epoch, sample), not of the worker that fetched it. The run
killed mid-epoch with augmenting workers is in tests/e2e/test_data_loaders.py, whose tutorial loop
trains on this augmented data."""

from __future__ import annotations

import torch
from augment_jobs import NoisyDigits
from torch.utils.data import DataLoader

from orchestrator.data.order import GlobalOrderSampler
from orchestrator.data.seeded import for_workers


def _batches(consumed: int, num_workers: int) -> list[torch.Tensor]:
    dataset = NoisyDigits()
    sampler = GlobalOrderSampler(dataset, world_size=1, rank=0, global_batch=64, micro_batch=64, shuffle=True,
                                 seed=3, drop_last=False)
    sampler.set_epoch(1)
    sampler.start_at(1, consumed)
    data, indices = for_workers(dataset, sampler, seed=3, num_workers=num_workers)
    return [x for x, _ in DataLoader(data, batch_size=64, sampler=indices, num_workers=num_workers)]


def test_an_epoch_resumed_mid_way_gets_the_same_augmented_samples_whatever_the_workers():
    whole = _batches(consumed=0, num_workers=2)
    resumed = _batches(consumed=5 * 64, num_workers=3)  # another worker count, started at batch 5

    assert len(resumed) == len(whole) - 5
    for got, expected in zip(resumed, whole[5:], strict=True):
        assert torch.equal(got, expected)

