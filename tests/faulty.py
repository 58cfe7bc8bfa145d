"""Fault injection for tests: jobs whose worker SIGKILLs itself once, at a chosen step.

The kill is real (the worker process dies without cleanup, as on an OOM kill or a node loss);
a marker file makes it happen only on the first attempt, so the restarted group runs through.
Nothing here changes what is trained: killed and clean runs must end with the same weights.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from jobs.digits import DigitsClassifier
from jobs.digits_torch import train_loop as digits_train_loop


def _kill_once(marker: str, step: int, at: int, rank: int, on_rank: int) -> None:
    if step == at and rank == on_rank and not Path(marker).exists():
        Path(marker).write_text(str(step))
        os.kill(os.getpid(), signal.SIGKILL)


def torch_loop_killed_once(ctx) -> None:
    """jobs.digits_torch's loop; the worker of rank `kill_rank` dies after step `kill_at`."""
    fault = ctx.config.pop("fault")
    original_step = ctx.step

    def step(**metrics):
        original_step(**metrics)
        _kill_once(fault["marker"], ctx.global_step, fault["kill_at"], ctx.rank, fault.get("kill_rank", 1))

    ctx.step = step
    digits_train_loop(ctx)


class KilledOnceClassifier(DigitsClassifier):
    """The quickstart model; the worker of rank `kill_rank` dies after optimizer step `kill_at`."""

    def __init__(self, kill_at: int, marker: str, kill_rank: int = 1, **kwargs):
        super().__init__(**kwargs)
        self._fault = (marker, kill_at, kill_rank)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        marker, kill_at, kill_rank = self._fault
        _kill_once(marker, self.trainer.global_step, kill_at, self.global_rank, kill_rank)


def slow_loop(ctx) -> None:
    """A loop that trains slowly enough to be interrupted from outside (driver kill tests)."""
    import time

    original_step = ctx.step

    def step(**metrics):
        time.sleep(ctx.config.get("sleep_s", 0.2))
        original_step(**metrics)

    ctx.step = step
    digits_train_loop(ctx)
