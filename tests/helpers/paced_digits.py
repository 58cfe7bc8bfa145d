"""The digits ctx job (jobs.digits_torch) paced for the tests that act on a run on Ray from
outside (a stop, a takeover): faulty.slow_loop (a sleep a step, a marker at `mark_at`, where rank 0
holds until the run's stop or `release`), with rank `slow_rank`'s own work a step `slow_factor`
times as long (a straggler, as a rank on a slower node), and each rank's process ids written as it
starts (`pids_dir`/rank-R-PID.json: its pid and its parent's, the node's agent), so that a test
finds the run's processes itself. Nothing here changes what is trained: the run ends with the
clean run's weights (specs.torch_spec)."""

from __future__ import annotations

import json
import os

from faulty import slow_loop


def train_loop(ctx) -> None:
    cfg = ctx.config
    slow_rank, slow_factor = cfg.pop("slow_rank", -1), cfg.pop("slow_factor", 1.0)
    pids_dir = cfg.pop("pids_dir", None)
    if pids_dir:
        path = os.path.join(pids_dir, f"rank-{ctx.rank}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": ctx.rank, "pid": os.getpid(), "ppid": os.getppid()}, f)
        os.replace(path + ".tmp", path)
    if ctx.rank == slow_rank:
        # slow_loop sleeps after the optimizer step, before the next forward: the rank's own work.
        cfg["sleep_s"] = cfg.get("sleep_s", 0.2) * slow_factor
    slow_loop(ctx)
