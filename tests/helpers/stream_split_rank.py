"""One rank of a real 2-process gloo world, for tests/unit/rank/lightning/test_stream_split.py: the
Lightning path's handling of a training loader over an IterableDataset (fit._kept_as_written),
called as train_dataloader calls it, on streams written the ways users split them.

    python stream_split_rank.py RANK PORT

Each rank prints one JSON line: for every stream, the ids its rank's loader yields, the note the
driver would print, whether the loader is the user's own, and how often the user's stream was
iterated in this (the rank's main) process. Rank 0 first does the same at a world of one, before
any process group exists.
"""

from __future__ import annotations

import datetime
import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from orchestrator.rank.lightning.fit import _kept_as_written

SAMPLES = 20


class Counted(IterableDataset):
    """A stream that counts the iterators made of it in this process (loader workers count apart)."""

    def __init__(self):
        self.iterations = 0

    def __iter__(self):
        self.iterations += 1
        for index in self.ids():
            yield {"id": index, "x": torch.full((2,), index * 0.5)}

    def ids(self):
        return range(SAMPLES)


class SameEverywhere(Counted):
    """Not split: every rank reads all of it. Its samples carry draws of torch's global RNG, which
    the ranks seed alike (as seed_everything does): the same stream still."""

    def __iter__(self):
        self.iterations += 1
        for index in range(SAMPLES):
            yield {"id": index, "x": torch.rand(2)}


class SplitByGetRank(Counted):
    """Splits itself, asking torch.distributed in its own __iter__."""

    def ids(self):
        return range(dist.get_rank(), SAMPLES, dist.get_world_size())


class SplitByStoredRank(Counted):
    """Splits itself by the rank it was given, over nodes and then over its loader's workers."""

    def __init__(self, rank: int, world_size: int):
        super().__init__()
        self.rank, self.world_size = rank, world_size

    def ids(self):
        mine = range(self.rank, SAMPLES, self.world_size)
        worker = get_worker_info()
        return mine if worker is None else mine[worker.id::worker.num_workers]


class SplitByNode(SplitByStoredRank):
    """Shaped as datasets.IterableDataset is after split_dataset_by_node: it keeps `_distributed`."""

    def __init__(self, rank: int, world_size: int):
        super().__init__(rank, world_size)
        self._distributed = SimpleNamespace(rank=rank, world_size=world_size)


class EmptyOnRankOne(Counted):
    """Splits itself by rank; a single sample, so rank 1's part is empty."""

    def ids(self):
        return range(dist.get_rank(), 1, dist.get_world_size())


class FailsOnRankOne(Counted):
    def ids(self):
        if dist.get_rank() == 1:
            raise RuntimeError("shard list unreachable")
        return range(SAMPLES)


def outcome(dataset: Counted, world: int, rank: int, *, read: bool = True, **loader_args) -> dict:
    loader = DataLoader(dataset, batch_size=3, **loader_args)
    kept = _kept_as_written(loader, world, rank)
    assert kept is not None
    used, note = kept
    probed = dataset.iterations
    ids = [int(i) for batch in used for i in batch["id"]] if read else None
    return {"ids": ids, "note": note, "as_written": used is loader, "probe_iterations": probed}


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    answer = {}
    if rank == 0:
        answer["world_of_one"] = outcome(SameEverywhere(), 1, 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.manual_seed(5)
        expected_draw = torch.rand(1).item()
        torch.manual_seed(5)
        answer["same"] = outcome(SameEverywhere(), 2, rank, read=False)
        answer["same"]["next_draw_is_unchanged"] = torch.rand(1).item() == expected_draw
        answer["same"]["ids"] = outcome(SameEverywhere(), 2, rank)["ids"]
        answer["get_rank"] = outcome(SplitByGetRank(), 2, rank)
        answer["stored_rank"] = outcome(SplitByStoredRank(rank, 2), 2, rank, num_workers=2)
        answer["split_by_node"] = outcome(SplitByNode(rank, 2), 2, rank)
        answer["empty_on_one"] = outcome(EmptyOnRankOne(), 2, rank)
        answer["fails_on_one"] = outcome(FailsOnRankOne(), 2, rank, read=False)
        print(json.dumps(answer), flush=True)
    finally:
        # Ended as a well-behaved script ends it (gloo left to the interpreter's exit at times aborts).
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
