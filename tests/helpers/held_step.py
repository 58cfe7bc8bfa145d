"""jobs.digits_torch's loop, where one step of rank 0 (after step `hold_at`) takes `hold_s` seconds
and hears no stop: a step, or a save, longer than a stop's grace, so that a stop cannot end the run
by itself. Rank 0 writes `marker` as that step begins to hold; each rank writes its process id to
`pids_dir`/rank-R.pid as it starts, so that a test finds the run's processes itself."""

from __future__ import annotations

import os
import time

from jobs.digits_torch import train_loop as digits_train_loop


def train_loop(ctx) -> None:
    cfg = ctx.config
    hold_at, hold_s, marker = cfg.pop("hold_at"), cfg.pop("hold_s"), cfg.pop("marker")
    pids_dir = cfg.pop("pids_dir")
    with open(os.path.join(pids_dir, f"rank-{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    original_step = ctx.step

    def step(**metrics):
        original_step(**metrics)
        if ctx.rank == 0 and ctx.global_step == hold_at and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(hold_at))
            time.sleep(hold_s)  # deaf to the run's stop: only the end of the ranks ends it

    ctx.step = step
    digits_train_loop(ctx)
