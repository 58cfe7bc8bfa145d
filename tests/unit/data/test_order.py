"""The global order: one permutation per (seed, epoch), a global position, and each rank's slice
of every global batch, so a resume at any world size trains each sample of an epoch once."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.order import (
    GlobalOrderSampler,
    StepTracker,
    epoch_order,
    nearest_splittable,
    rank_steps,
    split_global_batch,
)


def _epoch_ids(order, *, consumed, global_batch, micro, world, drop_last=False):
    """Every rank's samples from `consumed` on, step by step: [[ids of step s over all ranks]]."""
    per_rank = [rank_steps(order, consumed=consumed, global_batch=global_batch, micro_batch=micro,
                           world_size=world, rank=r, drop_last=drop_last) for r in range(world)]
    assert len({len(steps) for steps in per_rank}) == 1, "every rank runs the same number of steps"
    return [[i for steps in per_rank for micro_batch in steps[s].micro_batches for i in micro_batch]
            for s in range(len(per_rank[0]))]


def test_the_order_depends_on_seed_and_epoch_only():
    assert epoch_order(50, seed=3, epoch=1, shuffle=True) == epoch_order(50, seed=3, epoch=1, shuffle=True)
    assert epoch_order(50, seed=3, epoch=1, shuffle=True) != epoch_order(50, seed=3, epoch=2, shuffle=True)
    assert epoch_order(5, seed=3, epoch=1, shuffle=False) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("first,second", [(3, 2), (2, 3), (1, 3), (3, 1)])
def test_a_resize_mid_epoch_neither_repeats_nor_skips_a_sample(first, second):
    order = epoch_order(60, seed=0, epoch=0, shuffle=True)
    before = _epoch_ids(order, consumed=0, global_batch=6, micro=1, world=first)[:4]
    after = _epoch_ids(order, consumed=24, global_batch=6, micro=2, world=second)
    ids = [i for step in before + after for i in step]
    assert sorted(ids) == list(range(60)) and len(ids) == 60
    # The same steps train the same samples at either size: only who trains them changes.
    assert [sorted(s) for s in before + after] == [sorted(order[k:k + 6]) for k in range(0, 60, 6)]


def test_the_last_partial_batch_is_split_evenly_or_dropped():
    order = list(range(23))  # 3 full global batches of 6, then 5 samples
    steps = _epoch_ids(order, consumed=0, global_batch=6, micro=3, world=2)
    assert len(steps) == 4 and sorted(steps[-1]) == [18, 19, 20, 21, 22]
    assert len(_epoch_ids(order, consumed=0, global_batch=6, micro=3, world=2, drop_last=True)) == 3
    # Fewer samples left than ranks: every rank must take part in a step, so they are dropped...
    assert len(_epoch_ids(list(range(20)), consumed=0, global_batch=6, micro=3, world=3)) == 3
    # ...but an evaluation pass keeps them, some ranks getting none.
    tail = [rank_steps(list(range(20)), consumed=18, global_batch=6, micro_batch=3, world_size=3, rank=r,
                       drop_last=False, training=False) for r in range(3)]
    assert [i for steps in tail for s in steps for m in s.micro_batches for i in m] == [18, 19]


def test_the_global_batch_splits_into_equal_micro_batches_of_at_most_the_loader_batch():
    assert split_global_batch(96, 1, 32) == (32, 3)
    assert split_global_batch(96, 2, 32) == (24, 2)
    assert split_global_batch(96, 3, 32) == (32, 1)
    assert split_global_batch(6, 2, 2) == (1, 3)  # 3 per rank, at most 2 per pass: 3 of 1
    assert nearest_splittable(100, 1, 3) == 102 and nearest_splittable(96, 1, 4) == 96


def test_the_sampler_and_tracker_mark_step_ends_and_the_position_after_them():
    dataset = torch.arange(24)
    sampler = GlobalOrderSampler(dataset, world_size=2, rank=1, global_batch=8, micro_batch=2, shuffle=False,
                                 seed=0, drop_last=False)
    sampler.start_at(0, 8)
    sampler.set_epoch(0)
    assert list(sampler) == [12, 13, 14, 15, 20, 21, 22, 23]
    assert len(sampler) == 12 and sampler.micro_batches_before() == 2  # as if the epoch ran at 2 from its start
    tracker = StepTracker(sampler)
    ends = []
    for _ in range(4):
        tracker.advance()
        ends.append((tracker.step_due, tracker.consumed))
    assert ends == [(False, 8), (True, 16), (False, 16), (True, 24)]
    sampler.set_epoch(1)  # the resume position applies to its own epoch only
    assert sampler.start == 0 and len(list(sampler)) == 12
