"""bench/torchrun.py's Lightning-path job: tests/helpers/torchrun_seed.py's training as a LightningModule.

The same MLP (32 -> width -> 4), data (torch.manual_seed(0), `samples` rows), SGD with momentum,
per-rank batch size and `step_sleep` after each optimizer step as bench/torchrun_ctx_job.py, run by
`orchestrator run` with a `lightning:` spec: Lightning's own DDPStrategy in each rank, a child
process of its node's agent.

The faults are the ctx job's (`hurt_once`): rank `fault_rank` SIGKILLs its own process (fault
kill), or its agent, its parent (fault kill_agent), at batch `fault_step` of epoch `fault_epoch`,
once (the marker file `<work_dir>/fault-kill.done` holds the time.time() of the kill). Rank 0
writes the same events to `<work_dir>/events.jsonl`: "start" when fit starts (after the process
group), "first_step" after the first optimizer step of each start of the ranks and its sleep.

Run as a script, it is the same training as a plain torchrun user writes it (part l's baseline):
Lightning's DDPStrategy over torchrun's environment, a ModelCheckpoint every 5 steps with a last
checkpoint, resumed with ckpt_path="last" when torchrun restarts the ranks:

    torchrun --nproc_per_node 2 --max_restarts 1 bench/torchrun_lightning_job.py --work_dir DIR [--fault kill]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lightning_data import SyntheticData
from bench.torchrun_ctx_job import build_dataset, build_model, event, hurt_once


class FaultyMLP(pl.LightningModule):
    def __init__(
        self,
        work_dir: str,
        width: int = 1024,
        lr: float = 0.05,
        step_sleep: float = 0.0,
        fault: str = "none",
        fault_rank: int = 1,
        fault_epoch: int = 1,
        fault_step: int = 3,
    ):
        super().__init__()
        self.cfg = {
            "work_dir": work_dir,
            "fault": fault,
            "fault_rank": fault_rank,
            "fault_epoch": fault_epoch,
            "fault_step": fault_step,
        }
        self.lr, self.step_sleep = lr, step_sleep
        self.net = build_model(width)
        self._first = True

    def on_fit_start(self):
        os.makedirs(self.cfg["work_dir"], exist_ok=True)
        event(
            self.cfg,
            self.global_rank,
            "start",
            world_size=self.trainer.world_size,
            global_step=self.trainer.global_step,
        )

    def on_train_batch_start(self, batch, batch_idx):
        hurt_once(self.cfg, self.global_rank, self.current_epoch, batch_idx)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.step_sleep:
            time.sleep(self.step_sleep)
        if self._first:
            self._first = False
            event(
                self.cfg, self.global_rank, "first_step", epoch=self.current_epoch, global_step=self.trainer.global_step
            )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class MLPData(SyntheticData):
    build = staticmethod(build_dataset)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault_rank", type=int, default=1)
    parser.add_argument("--fault_epoch", type=int, default=1)
    parser.add_argument("--fault_step", type=int, default=3)
    parser.add_argument("--checkpoint_every", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = FaultyMLP(
        args.work_dir,
        width=args.width,
        step_sleep=args.step_sleep,
        fault=args.fault,
        fault_rank=args.fault_rank,
        fault_epoch=args.fault_epoch,
        fault_step=args.fault_step,
    )
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=os.path.join(args.work_dir, "checkpoints"),
        save_last=True,
        every_n_train_steps=args.checkpoint_every,
        save_top_k=1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=MLPData(args.samples, args.batch_size), ckpt_path="last")


if __name__ == "__main__":
    main()
