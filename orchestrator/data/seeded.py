"""Random augmentations in DataLoader worker processes that resume exactly.

A DataLoader with `num_workers > 0` seeds each worker process once, from a draw of the main
process's RNG when the epoch's iterator is built, and deals the epoch's batches to the workers
in turn. After a resume in the middle of an epoch both differ from the uninterrupted run: the
draw happens at another point of the RNG stream, and the first batch after the resume goes to
worker 0 whatever worker had it before. A dataset that draws random numbers (a random crop, a
noise augmentation) then gives other samples than the run that was not interrupted.

So in worker processes each sample's random state is reseeded from (seed, epoch, sample id)
before it is fetched. The sample id stands for its position: an epoch's order is a permutation
of the ids computed from (seed, epoch) alone (`order.py`), so each id appears once an epoch and
the pair (epoch, id) names one position. A sample's augmentation is then the same whatever the
worker, the number of workers, the world size or the resume point. Without worker processes the
loader runs in the training process, whose RNG the checkpoint restores: nothing is changed there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from orchestrator.data.order import GlobalOrderSampler

# A sample's seed must fit numpy's legacy seeding (32 bits); torch and random take it as is.
_SEED_BITS = 0xFFFFFFFF


def sample_seed(seed: int, epoch: int, sample_id: int) -> int:
    """The seed of one sample's randomness: a function of the run's seed, the epoch and the sample."""
    # hash() of a tuple of ints is the same in every process (no hash randomisation for ints).
    return hash((seed, epoch, sample_id)) & _SEED_BITS


def seed_sample(seed: int, epoch: int, sample_id: int) -> None:
    value = sample_seed(seed, epoch, sample_id)
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value)


class EpochTagged(Sampler):
    """Yields (epoch, sample id) for the ids its sampler yields; everything else is the sampler's
    (`set_epoch`, `start_at`, its length)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        for sample_id in self.sampler:
            yield epoch, sample_id

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


class SeededSamples(Dataset):
    """The user's dataset, fetched by (epoch, sample id) with each sample's randomness seeded first."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, sample_id = key
        seed_sample(self.seed, epoch, sample_id)
        return self.dataset[sample_id]

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> Any:
        """A batched read (a Parquet micro-batch) is seeded once, by its first sample."""
        fetch_batch = getattr(self.dataset, "__getitems__", None)
        if fetch_batch is None:
            return [self[key] for key in keys]
        if keys:
            seed_sample(self.seed, *keys[0])
        return fetch_batch([sample_id for _, sample_id in keys])

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.dataset, name)


def for_workers(dataset: Dataset, sampler: Sampler, *, seed: int, num_workers: int) -> tuple[Dataset, Sampler]:
    """The dataset and sampler a DataLoader over the global order is built with: seeded per
    sample when it has worker processes, unchanged otherwise."""
    if not num_workers:
        return dataset, sampler
    return SeededSamples(dataset, seed), EpochTagged(sampler)


def global_order_loader(dataset: Dataset, *, world_size: int, rank: int, global_batch: int, micro_batch: int,
                        shuffle: bool, seed: int, drop_last: bool, training: bool = True,
                        loader_class: type[DataLoader] = DataLoader,
                        **loader_kwargs: Any) -> tuple[DataLoader, GlobalOrderSampler]:
    """A DataLoader of this rank's share of the one global order, and the sampler that holds its
    position (both harnesses build their loaders here; the caller moves the sampler to where
    training resumes). `loader_kwargs` are the user's own settings: workers, collate function,
    pinning, prefetch... With worker processes, each sample gets its own seed (SeededSamples)."""
    sampler = GlobalOrderSampler(dataset, world_size=world_size, rank=rank, global_batch=global_batch,
                                 micro_batch=micro_batch, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                 training=training)
    samples, indices = for_workers(dataset, sampler, seed=seed, num_workers=loader_kwargs.get("num_workers", 0))
    return loader_class(samples, batch_size=micro_batch, sampler=indices, **loader_kwargs), sampler
