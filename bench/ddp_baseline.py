"""Hand-written DDP training, as people write it for torchrun: the baseline of bench/overhead.py.

    torchrun --nproc_per_node=2 bench/ddp_baseline.py --steps 60 --warmup 10 --batch-size 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.workload import build_dataset, build_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_model()
    if world > 1:  # as Ray Train's prepare_model does: no DDP wrapper around a single process
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = build_dataset(args.batch_size * world * (args.steps + args.warmup))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    start = None
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    cpu_ms = 1000 * (time.process_time() - cpu_start) / args.steps
    if rank == 0:
        print(json.dumps({"steps_per_s": args.steps / elapsed, "cpu_ms_per_step": cpu_ms, "steps": args.steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
