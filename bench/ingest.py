"""Parquet ingest: samples/s our Parquet reader delivers into 2 Ray Train workers ÷ an in-memory
TensorDataset DataLoader in the same workers, in the same run; and each worker's peak RSS while
it streams a data set several times larger than it may hold.

    python bench/ingest.py [--rows 1000000] [--rounds 3] [--batch-size 1024] [--ray-data]

- Data: `--rows` rows x 16 float32 columns in Parquet (4 files, row groups of 64k rows).
- Each round, each of the 2 workers reads one epoch of its share both ways, alternating which
  goes first: ours (`ParquetDataset` + the global-order sampler, exactly what `ctx.data()`
  builds, shuffled) and the baseline (the same rows as one in-memory tensor, a
  `DataLoader(TensorDataset, DistributedSampler(shuffle=True))`, loaded before timing). The
  rate is rows over the two workers' slower pass. Goal: ratio >= 0.9 (median of the rounds).
- Memory: a second data set of `--big-mb` (default 1600 MB) in 16 MB row groups, read once by
  each worker; the peak RSS growth of each worker is printed next to the data set's size.
  Goal: bounded by a few row groups, not by the data set.
- `--ray-data`: also time Ray Data (`read_parquet` + `get_dataset_shard` + `iter_torch_batches`)
  over the same files, with the workers at 0.5 CPU so that Ray Data has a CPU to run on (at one
  CPU per worker on a 2-CPU machine it gets none and waits forever).

Prints `ratio=<x>` on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

COLUMNS = 16


def write_data(folder: str, rows: int, *, files: int = 4, row_group: int = 65536, width: int = COLUMNS) -> float:
    """`rows` rows of `width` float32 columns (c0..), plus `id`; returns the data's size in MB."""
    os.makedirs(folder, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    rng = np.random.default_rng(0)
    for f in range(files):
        n = bounds[f + 1] - bounds[f]
        columns = {f"c{i}": rng.standard_normal(n, dtype=np.float32) for i in range(width)}
        columns["id"] = np.arange(bounds[f], bounds[f + 1], dtype=np.int64)
        pq.write_table(pa.table(columns), os.path.join(folder, f"part-{f}.parquet"), row_group_size=row_group,
                       compression="none")
    return rows * (width * 4 + 8) / 2**20


def _rss_mb() -> float:
    """This process's resident memory now (not the high-water mark: earlier phases would hide it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _parquet_loader(path: str, columns, *, world: int, rank: int, batch: int, epoch: int):
    """What ctx.data() builds: the Parquet rows of this rank, in the epoch's global order."""
    from torch.utils.data import DataLoader

    from orchestrator.data.order import GlobalOrderSampler
    from orchestrator.data.parquet import ParquetDataset, ParquetSource

    dataset = ParquetDataset(ParquetSource(path, columns), window=4)
    sampler = GlobalOrderSampler(dataset, world_size=world, rank=rank, global_batch=batch * world,
                                 micro_batch=batch, shuffle=True, seed=0, drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, collate_fn=ParquetDataset.collate)


def _worker(config: dict) -> None:
    """In each Ray Train worker: the throughput rounds, or (phase "memory") one pass over the big
    data set with its RSS before and at most during."""

    import ray.train
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from orchestrator.data.parquet import Column

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    batch = config["batch_size"]
    results = {}
    if config["phase"] == "memory":
        names = pq.read_schema(os.path.join(config["path"], "part-0.parquet")).names
        loader = _parquet_loader(config["path"], [Column(n, n) for n in names], world=world, rank=rank,
                                 batch=batch, epoch=0)
        before = peak = _rss_mb()
        start, rows = time.perf_counter(), 0
        for item in loader:
            rows += len(item["id"])
            peak = max(peak, _rss_mb())
        results["big"] = (rows, time.perf_counter() - start, before, peak)
    else:
        columns = [Column(f"c{i}", f"c{i}") for i in range(COLUMNS)]
        table = pq.read_table(config["path"], columns=[c.column for c in columns])
        memory = TensorDataset(torch.from_numpy(np.stack([table.column(c.column).to_numpy() for c in columns], 1)))
        del table

        def ours(epoch: int) -> tuple[int, float]:
            loader = _parquet_loader(config["path"], columns, world=world, rank=rank, batch=batch, epoch=epoch)
            start, rows = time.perf_counter(), 0
            for item in loader:
                rows += len(item["c0"])
            return rows, time.perf_counter() - start

        def baseline(epoch: int) -> tuple[int, float]:
            sampler = DistributedSampler(memory, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
            sampler.set_epoch(epoch)
            loader = DataLoader(memory, batch_size=batch, sampler=sampler, drop_last=True)
            start, rows = time.perf_counter(), 0
            for (item,) in loader:
                rows += len(item)
            return rows, time.perf_counter() - start

        for round_index in range(config["rounds"]):
            arms = [("ours", ours), ("baseline", baseline)]
            for name, arm in arms[::-1] if round_index % 2 else arms:
                results[f"{name}-{round_index}"] = arm(round_index)
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, results)
    if rank == 0:
        with open(config["out"], "w") as f:
            json.dump(gathered, f)


def _ray_data_worker(config: dict) -> None:
    import ray.train

    shard = ray.train.get_dataset_shard("train")
    start, rows = time.perf_counter(), 0
    first = None
    for item in shard.iter_torch_batches(batch_size=config["batch_size"]):
        first = first or time.perf_counter() - start
        rows += len(item["c0"])
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"ray-data-{rank}.json"), "w") as f:
        json.dump({"rows": rows, "seconds": time.perf_counter() - start, "first_batch_s": first}, f)


def run_ray_data(path: str, batch: int, timeout_s: float, out: str) -> str:
    import threading

    import ray
    import ray.data
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(_ray_data_worker, train_loop_config={"batch_size": batch, "out": out},
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                           datasets={"train": ray.data.read_parquet(path)})
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=trainer.fit()), daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return f"Ray Data: no result within {timeout_s:.0f} s"
    fit_s = time.perf_counter() - start
    ranks = [json.load(open(os.path.join(out, f"ray-data-{r}.json"))) for r in range(2)]
    rows, slowest = sum(r["rows"] for r in ranks), max(r["seconds"] for r in ranks)
    first = max(r["first_batch_s"] for r in ranks)
    return (f"Ray Data: {rows / slowest:,.0f} rows/s into 2 workers at 0.5 CPU each (first batch after "
            f"{first:.1f} s; fit with start-up {fit_s:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--big-mb", type=int, default=1600)
    parser.add_argument("--ray-data", action="store_true")
    args = parser.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    scratch = tempfile.mkdtemp(prefix="bench-ingest-")
    try:
        path, big_path = os.path.join(scratch, "data"), os.path.join(scratch, "big")
        size = write_data(path, args.rows)
        big_width = 256  # 1 KB rows: 16 MB row groups of 16k rows
        big_rows = int(args.big_mb * 2**20 / (big_width * 4 + 8))
        big_size = write_data(big_path, big_rows, row_group=16384, width=big_width)
        print(f"data: {args.rows:,} rows x {COLUMNS} float32 ({size:.0f} MB); big: {big_rows:,} rows "
              f"({big_size:.0f} MB, 16 MB row groups)", flush=True)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": REPO}})
        out = os.path.join(scratch, "out.json")

        def fit(phase: str, data: str) -> list[dict]:
            TorchTrainer(_worker, train_loop_config={"phase": phase, "path": data, "batch_size": args.batch_size,
                                                     "rounds": args.rounds, "out": out},
                         scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(storage_path=os.path.join(scratch, "ray"))).fit()
            return json.load(open(out))

        per_worker = fit("throughput", path)
        ratios = []
        for r in range(args.rounds):
            rates = {}
            for name in ("ours", "baseline"):
                rows = sum(w[f"{name}-{r}"][0] for w in per_worker)
                slowest = max(w[f"{name}-{r}"][1] for w in per_worker)
                rates[name] = rows / slowest
            ratios.append(rates["ours"] / rates["baseline"])
            print(f"round {r + 1}: ours {rates['ours']:,.0f} rows/s, in-memory TensorDataset "
                  f"{rates['baseline']:,.0f} rows/s, ratio {ratios[-1]:.2f}", flush=True)
        for rank, w in enumerate(fit("memory", big_path)):
            rows, seconds, before, after = w["big"]
            print(f"worker {rank}: streamed {rows:,} rows (every column) of the {big_size:.0f} MB data set in "
                  f"{seconds:.1f} s ({rows / seconds:,.0f} rows/s); RSS {before:.0f} MB before, at most "
                  f"{after:.0f} MB during (+{after - before:.0f} MB)", flush=True)
        if args.ray_data:
            print(run_ray_data(path, args.batch_size, timeout_s=300, out=scratch), flush=True)
        print(f"ratio={statistics.median(ratios):.2f}")
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
