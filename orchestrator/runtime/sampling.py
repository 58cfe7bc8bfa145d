"""A distributed sampler that can start mid-epoch, so a resumed run sees each sample once.

The permutation of an epoch depends only on (seed, epoch) and the rank's slice only on
(rank, world size): the same as torch's DistributedSampler. Setting `start_batch` skips the
batches this rank already trained on in that epoch, without loading them.
"""

from __future__ import annotations

from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    def __init__(self, dataset, *, num_replicas: int, rank: int, shuffle: bool, seed: int,
                 drop_last: bool, batch_size: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.batch_size = batch_size
        self.start_batch = 0

    def __iter__(self):
        indices = list(super().__iter__())
        return iter(indices[self.start_batch * self.batch_size:])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_batch * self.batch_size)
