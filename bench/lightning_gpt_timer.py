"""The callback both sides of bench/lightning_gpt.py time their training with (rank 0 writes it)."""

from __future__ import annotations

import json
import time

import lightning.pytorch as pl


class StepTimer(pl.Callback):
    """Samples/s from optimizer step `warmup` to the last one, rank 0's CPU time per step, and the
    last loss, into `out` (JSON). Where wall time grows and CPU time does not, a process waited."""

    def __init__(self, warmup: int, out: str):
        self.warmup, self.out = warmup, out
        self._start: float | None = None
        self._samples = 0
        self._loss = float("nan")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.warmup and self._start is None:
            self._start, self._cpu_start = time.perf_counter(), time.process_time()
        elif self._start is not None:
            self._samples += len(batch[0]) * trainer.world_size
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss = float(loss.detach())

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank != 0 or self._start is None:
            return
        seconds = time.perf_counter() - self._start
        steps = trainer.global_step - self.warmup
        cpu_ms = (time.process_time() - self._cpu_start) * 1000 / max(steps, 1)  # this process, all its threads
        with open(self.out, "w") as f:
            json.dump({"samples_per_s": self._samples / seconds, "seconds": seconds, "steps": steps,
                       "cpu_ms_per_step": cpu_ms, "loss": self._loss}, f)
