"""Jobs for the tests of the Ray path whose oracles are the ranks' own records
(tests/unit/observe/test_metrics.py).

`recorded_loop` is faulty.slow_loop (jobs.digits_torch's loop, slowed), and each rank writes to
`record_dir`, as it goes:

- `rank-<rank>-attempt-<attempt>.json` at its start: its pid and its parent's pid (on Ray the
  agent, a Ray Train worker, whose environment and life the test reads from /proc);
- rank 0 only, `steps.jsonl`: a line `{"attempt", "step"}` after each optimizer step the loop
  counted, the one a stop checkpoint was taken at included (ctx.step raises there).

So a test can tell which steps ran, where a stop left the run and where the next run started,
without asking the orchestrator.
"""

from __future__ import annotations

import json
import os

from faulty import slow_loop


def recorded_loop(ctx) -> None:
    record = ctx.config.pop("record_dir")
    with open(os.path.join(record, f"rank-{ctx.rank}-attempt-{ctx.attempt}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "parent": os.getppid()}, f)
    counted = ctx.step

    def step(**metrics):
        try:
            counted(**metrics)
        finally:  # a stop checkpoint ends the loop from inside ctx.step: its step is recorded too
            if ctx.rank == 0:
                with open(os.path.join(record, "steps.jsonl"), "a") as f:
                    f.write(json.dumps({"attempt": ctx.attempt, "step": ctx.global_step}) + "\n")

    ctx.step = step
    slow_loop(ctx)
