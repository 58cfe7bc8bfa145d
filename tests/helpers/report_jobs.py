"""The loop of the report's run (tests/e2e/test_report_runs.py): faulty.slow_loop_killed_once (rank
`fault.kill_rank` SIGKILLed once after step `fault.kill_at`), and, further on, once each:

- after step `untimed.at`, every rank spends `untimed.seconds` inside `ctx.untimed()` (an
  evaluation mid-epoch that outlasts failure.hang_timeout_s) and writes `untimed.dir/rank-N.json`
  with the block's start and end, on the wall clock;
- after step `stuck.kill_at`, rank `stuck.kill_rank` waits for ever on an event nobody sets (its
  process, its heartbeat and its flight recorder's thread go on), while its peer goes on into the
  next collective: a hang.

Nothing here changes what is trained."""

from __future__ import annotations

import json
import time
from pathlib import Path

from faulty import _deadlock_once, slow_loop_killed_once


def slow_loop_killed_untimed_then_stuck(ctx) -> None:
    untimed, stuck = ctx.config.pop("untimed"), ctx.config.pop("stuck")
    original_step = ctx.step

    def step(**metrics):
        original_step(**metrics)
        record = Path(untimed["dir"], f"rank-{ctx.rank}.json")
        if ctx.global_step == untimed["at"] and not record.exists():
            started = time.time()
            with ctx.untimed():
                time.sleep(untimed["seconds"])
            record.write_text(json.dumps({"start": started, "end": time.time()}))
        _deadlock_once(stuck["marker"], ctx.global_step, stuck["kill_at"], ctx.rank, stuck["kill_rank"])

    ctx.step = step
    slow_loop_killed_once(ctx)
