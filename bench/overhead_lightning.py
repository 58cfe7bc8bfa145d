"""bench/overhead.py's workload as a LightningModule, for `--runtime lightning`.

The same model and data as bench/workload.py (shared with the ctx job and the torchrun DDP
baseline), SGD with momentum, batch 128 a rank. Steps/s are timed inside fit, from batch `warmup`
(after a barrier) to the end of training (after a barrier); rank 0 writes them, with its CPU
milliseconds a step, as one JSON object to `out`. Both sides run this very module:

- the orchestrator: a `lightning:` spec naming WorkloadModule and WorkloadData (bench/overhead.py);
- the baseline: plain torchrun running this file as a Lightning script, as users write one:
  `torchrun --nproc_per_node 2 bench/overhead_lightning.py --steps 200 --warmup 40 --out F`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lightning_data import SyntheticData
from bench.workload import build_dataset, build_model


class WorkloadModule(pl.LightningModule):
    def __init__(self, out: str, steps: int = 200, warmup: int = 40):
        super().__init__()
        self.out, self.steps, self.warmup = out, steps, warmup
        self.net = build_model()
        self._start: tuple[float, float] | None = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == self.warmup:
            dist.barrier()
            self._start = (time.perf_counter(), time.process_time())

    def on_train_end(self):
        dist.barrier()
        if self._start is None or self.global_rank != 0:
            return
        wall, cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]
        with open(self.out, "w") as f:
            json.dump(
                {"steps_per_s": self.steps / wall, "cpu_ms_per_step": 1000 * cpu / self.steps, "steps": self.steps}, f
            )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class WorkloadData(SyntheticData):
    build = staticmethod(build_dataset)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        max_steps=args.steps + args.warmup,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = WorkloadData(args.batch_size * world * (args.steps + args.warmup), args.batch_size)
    trainer.fit(WorkloadModule(args.out, args.steps, args.warmup), datamodule=data)


if __name__ == "__main__":
    main()
