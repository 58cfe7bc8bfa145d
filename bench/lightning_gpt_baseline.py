"""Plain Lightning, as users run it by hand with torchrun: the baseline of bench/lightning_gpt.py.

    torchrun --nproc_per_node=2 bench/lightning_gpt_baseline.py '{"model": {...}, "batch_size": 16, ...}'
"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lightning_gpt_timer import StepTimer
from jobs.gpt import GPT, TextData


def main() -> None:
    s = json.loads(sys.argv[1])
    pl.seed_everything(0, verbose=False)
    model = GPT(**s["model"])
    data = TextData(block_size=s["block_size"], batch_size=s["batch_size"])
    trainer = pl.Trainer(
        accelerator="gpu" if s["gpu"] else "cpu", devices=s["workers"], strategy="ddp", precision=s["precision"],
        max_steps=s["max_steps"], gradient_clip_val=1.0, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[StepTimer(s["warmup"], s["out"])],
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
