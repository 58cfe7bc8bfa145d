"""One global order of an epoch's samples, whatever the world size: what makes exactly-once data
hold across a resize.

- The order of epoch e is a permutation of the sample ids computed from (seed, e) alone (a
  dataset may define its own, `dataset.epoch_order(seed=, epoch=, shuffle=)`: parquet.py's).
- A checkpoint holds one number for the data: `consumed`, the samples of the epoch already
  trained on, always at an optimizer-step boundary.
- With global batch G and world size W, optimizer step s (counted from `consumed`) trains the
  global positions [consumed + s*G, consumed + (s+1)*G); rank r takes the r-th of W equal slices.
  That slice is split into micro-batches of `micro_batch` samples for gradient accumulation.
- Resuming at any W continues at position `consumed`: nothing repeats, nothing is skipped.
- The epoch's last, partial global batch of R < G samples is split over the ranks as evenly as
  possible (sizes differ by at most one). It is dropped with drop_last, or when fewer samples
  than ranks remain: every rank must take part in every optimizer step, and padding with
  repeated samples would count them twice.

Every rank therefore runs the same number of optimizer steps per epoch, which keeps DDP from
deadlocking on uneven shards. torch's DistributedSampler and torchdata's stateful sampler tie
their order to one world size; this one does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DistributedSampler


def epoch_order(num_samples: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's sample ids in training order: a function of (seed, epoch) only."""
    if not shuffle:
        return list(range(num_samples))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


@dataclass(frozen=True)
class Step:
    """One optimizer step of one rank: its micro-batches and the epoch position after it."""

    micro_batches: list[list[int]]
    consumed_after: int


def rank_steps(order: Sequence[int], *, consumed: int, global_batch: int, micro_batch: int, world_size: int,
               rank: int, drop_last: bool, training: bool = True) -> list[Step]:
    """Rank `rank`'s optimizer steps for the rest of the epoch, from global position `consumed`.

    `training=False` (an evaluation pass, no collective per batch) keeps a last batch smaller
    than the world size too: some ranks then simply get no sample of it.
    """
    return list(iter_rank_steps(order, consumed=consumed, global_batch=global_batch, micro_batch=micro_batch,
                                world_size=world_size, rank=rank, drop_last=drop_last, training=training))


def _rank_spans(total: int, *, consumed: int, global_batch: int, world_size: int, rank: int, drop_last: bool,
                training: bool) -> Iterator[tuple[int, int, int]]:
    """(begin, end, consumed after) of each of rank `rank`'s steps: positions in the epoch's order.
    Arithmetic only, so that a pass over a huge epoch holds no per-sample bookkeeping."""
    if global_batch % world_size:
        raise ValueError(f"global batch {global_batch} does not split over {world_size} workers")
    per_rank = global_batch // world_size
    start = consumed
    while start + global_batch <= total:
        yield start + rank * per_rank, start + (rank + 1) * per_rank, start + global_batch
        start += global_batch
    remaining = total - start
    if remaining and not drop_last and (remaining >= world_size or not training):
        share, extra = divmod(remaining, world_size)
        begin = start + rank * share + min(rank, extra)
        end = begin + share + (1 if rank < extra else 0)
        if end > begin:
            yield begin, end, total


def iter_rank_steps(order: Sequence[int], *, consumed: int, global_batch: int, micro_batch: int, world_size: int,
                    rank: int, drop_last: bool, training: bool = True) -> Iterator[Step]:
    """rank_steps, one step at a time (the order is sliced as the steps are reached)."""
    for begin, end, after in _rank_spans(len(order), consumed=consumed, global_batch=global_batch,
                                         world_size=world_size, rank=rank, drop_last=drop_last, training=training):
        yield Step(_chunks(list(order[begin:end]), micro_batch), after)


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def split_global_batch(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) for one rank: the largest micro-batch of at most
    `max_micro_batch` samples that splits the rank's share of the global batch evenly.

    Equal micro-batches are what make accumulation exact: a mean loss divided by the number of
    micro-batches, averaged over the ranks by DDP, is the mean over the whole global batch.
    """
    per_rank = global_batch // world_size
    for accumulation in range(1, per_rank + 1):
        if per_rank % accumulation == 0 and per_rank // accumulation <= max_micro_batch:
            return per_rank // accumulation, accumulation
    return 1, per_rank


def sizes_that_split(global_batch: int, low: int, high: int) -> list[int]:
    return [w for w in range(low, high + 1) if global_batch % w == 0]


def nearest_splittable(global_batch: int, low: int, high: int) -> int:
    """The global batch closest to `global_batch` that every world size in [low, high] splits."""
    step = math.lcm(*range(low, high + 1))
    below = max(step, global_batch // step * step)
    above = below + step
    return below if global_batch - below <= above - global_batch else above


class GlobalOrderSampler(DistributedSampler):
    """This rank's sample ids, micro-batch after micro-batch, in the epoch's global order.

    Use it as a DataLoader's `sampler` with `batch_size=micro_batch`. It is a DistributedSampler,
    so Lightning leaves it in place; `set_epoch` picks the epoch, `start_at` a position in it.
    `len()` counts this rank's samples of a whole epoch at this world size (as if it had run at
    this size from the start), so a loader's length and Lightning's batch counters stay those
    of a whole epoch after a resume in its middle.
    """

    def __init__(self, dataset, *, world_size: int, rank: int, global_batch: int, micro_batch: int,
                 shuffle: bool, seed: int, drop_last: bool, training: bool = True):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.num_total = len(dataset)
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.training = training
        # Where the epoch being resumed stands: applies to that epoch only.
        self._resume_epoch = -1
        self._resume_consumed = 0

    def start_at(self, epoch: int, consumed: int) -> None:
        self._resume_epoch, self._resume_consumed = epoch, consumed

    @property
    def start(self) -> int:
        """Global position at which the current epoch's pass starts."""
        return self._resume_consumed if self.epoch == self._resume_epoch else 0

    def steps(self) -> Iterator[Step]:
        # A dataset may bring its own order (Parquet: row groups, then rows within windows of them).
        own = getattr(self.dataset, "epoch_order", None)
        order = (own(seed=self.seed, epoch=self.epoch, shuffle=self.shuffle) if callable(own) else
                 epoch_order(self.num_total, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle))
        return iter_rank_steps(order, consumed=self.start, global_batch=self.global_batch,
                               micro_batch=self.micro_batch, world_size=self.num_replicas, rank=self.rank,
                               drop_last=self.drop_last, training=self.training)

    def spans(self) -> Iterator[tuple[int, int, int]]:
        """(begin, end, consumed after) of each of this rank's steps in the current pass."""
        return _rank_spans(self.num_total, consumed=self.start, global_batch=self.global_batch,
                           world_size=self.num_replicas, rank=self.rank, drop_last=self.drop_last,
                           training=self.training)

    def __iter__(self):
        for step in self.steps():
            for micro in step.micro_batches:
                yield from micro

    def __len__(self) -> int:
        done = self.start // (self.num_replicas * self.micro_batch) * self.micro_batch
        return done + sum(end - begin for begin, end, _ in self.spans())

    def micro_batches_before(self) -> int:
        """Micro-batches of this epoch that the current pass skips (trained before the resume)."""
        return self.start // (self.num_replicas * self.micro_batch)


class StepTracker:
    """Follows one pass of a GlobalOrderSampler micro-batch by micro-batch: whether the micro-batch
    just trained ends an optimizer step, how many micro-batches its step has, and the epoch
    position once the step is taken."""

    def __init__(self, sampler: GlobalOrderSampler):
        # For each micro-batch of the pass, lazily: (micro-batches in its step, consumed after its
        # step, last of its step?).
        # (The sampler's position is read now: a later start_at does not change this pass.)
        self._plan = self._micro_batches(sampler.spans(), sampler.micro_batch)
        self.consumed = sampler.start
        self.done = 0  # micro-batches of this pass trained on
        self.step_due = False
        self.micro_batches_in_step = 1

    @staticmethod
    def _micro_batches(spans: Iterator[tuple[int, int, int]], micro: int) -> Iterator[tuple[int, int, bool]]:
        for begin, end, after in spans:
            count = -(-(end - begin) // micro)
            for i in range(count):
                yield count, after, i == count - 1

    def advance(self) -> None:
        """Count one micro-batch handed to the loop."""
        planned = next(self._plan, None)
        if planned is not None:
            self.micro_batches_in_step, after, self.step_due = planned
            if self.step_due:
                self.consumed = after
        self.done += 1
