"""Checkpoint stall: how long the training loop is blocked by checkpointing, async vs synchronous.

One worker trains ~100 MB of model + optimizer state and checkpoints every N steps, twice in one
invocation: through the orchestrator's asynchronous checkpoints (the loop waits only for an
in-memory snapshot; serialisation, sha256, write and commit run in the background), and with a
synchronous torch.save in the loop. Goals: async stall <= 1% of the loop's wall time and
<= 0.1x the synchronous stall.

It also reports, for the async run, the commit latency (seconds from a snapshot's hand-off to the
writer until its checkpoint is committed and read back; median and max over the checkpoints
whose read-back is observable, see checkpoint_job.CommitWatcher), and for both runs rank 0's peak
extra memory: its peak RSS minus its RSS right after the first optimizer step (training state
in place, no snapshot memory yet), in multiples of the state's size (goal: <= 2x for async,
snapshot memory included), and beside it the peak of malloc's bytes in use, which leaves out
what the allocator keeps after a free.

    python bench/checkpoint.py [--steps 500] [--every 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Checkpoints kept by retention in the async run (the first KEEP_LAST delete nothing, so their
# read-back is not observable to the benchmark).
KEEP_LAST = 2


def run(mode: str, storage: str, args) -> dict:
    import orchestrator

    name = f"ckpt-{mode}"
    spec = {
        "name": name, "storage": storage, "resume_from": "none",
        "torch": {"train_loop": "bench.checkpoint_job:train_loop", "max_epochs": 1,
                  "config": {"mode": mode, "steps": args.steps, "every": args.every, "batch_size": args.batch_size,
                             "sync_dir": storage, "keep_last": KEEP_LAST,
                             # <storage>/<name>/checkpoints: the run directory's layout (orchestrator/run_dir.py)
                             "ckpt_dir": os.path.join(storage, name, "checkpoints")}},
        "scaling": {"num_workers": 1},
        "checkpoint": {"every_n_steps": args.every if mode == "async" else None, "at_epoch_end": False,
                       "keep_last": KEEP_LAST, "async": True},
    }
    result = orchestrator.run(spec, console=None)
    metrics = result.metrics
    stall = result.checkpoint_stall_s if mode == "async" else metrics["sync_stall_s"]
    return {"stall_s": stall, "checkpoints": args.steps // args.every, **metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    with tempfile.TemporaryDirectory() as storage:
        sync = run("sync", storage, args)
        asyn = run("async", storage, args)
    for name, r in (("sync torch.save", sync), ("async orchestrator", asyn)):
        print(f"{name:<20} {r['checkpoints']} checkpoints: stall {r['stall_s']:.3f} s "
              f"({r['stall_s'] / r['checkpoints'] * 1000:.0f} ms each) of {r['loop_wall_s']:.1f} s loop wall "
              f"= {100 * r['stall_s'] / r['loop_wall_s']:.2f}%")
    print(f"async stall / sync stall: {asyn['stall_s'] / sync['stall_s']:.3f} (goal <= 0.1); "
          f"async stall / wall: {100 * asyn['stall_s'] / asyn['loop_wall_s']:.2f}% (goal <= 1%)")
    print_commit_latency(asyn)
    print_peak_memory(asyn, sync)


def print_commit_latency(asyn: dict) -> None:
    if "commit_median_s" not in asyn:
        print(f"commit latency: not observed (needs more than {KEEP_LAST} checkpoints)")
        return
    print(f"commit latency: median {asyn['commit_median_s']:.2f} s, max {asyn['commit_max_s']:.2f} s")
    print(f"  (hand-off to the writer -> committed and read back, {asyn['checkpoints_confirmed_seen']:.0f} of "
          f"{asyn['checkpoints_handed']:.0f} checkpoints; renamed into place after median "
          f"{asyn['visible_median_s']:.2f} s, max {asyn['visible_max_s']:.2f} s)")


def print_peak_memory(asyn: dict, sync: dict) -> None:
    def times(r: dict, key: str) -> str:
        return f"{r[key] / r['state_bytes']:.2f} x" if key in r else "not measured"

    print(f"peak extra memory while saving: {times(asyn, 'peak_rss_extra_bytes')} state (goal <= 2x); "
          f"sync torch.save: {times(sync, 'peak_rss_extra_bytes')}")
    print(f"  (rank 0's peak RSS minus its RSS right after the first optimizer step, in units of the state "
          f"= model + optimizer = {asyn['state_bytes'] / 1e6:.1f} MB; malloc'd bytes alone: "
          f"{times(asyn, 'peak_heap_extra_bytes')} async, {times(sync, 'peak_heap_extra_bytes')} sync)")


if __name__ == "__main__":
    main()
