"""Checkpoint stall: how long the training loop is blocked by checkpointing, async vs synchronous.

One worker trains ~100 MB of model + optimizer state and checkpoints every N steps, twice in one
invocation: through the orchestrator's asynchronous checkpoints (the loop waits only for an
in-memory snapshot; serialisation, sha256, write and commit run in the background), and with a
synchronous torch.save in the loop. Goals: async stall <= 1% of the loop's wall time and
<= 0.1x the synchronous stall.

    python bench/checkpoint.py [--steps 500] [--every 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(mode: str, storage: str, args) -> dict:
    import orchestrator

    spec = {
        "name": f"ckpt-{mode}", "storage": storage, "resume_from": "none",
        "torch": {"train_loop": "bench.checkpoint_job:train_loop", "max_epochs": 1,
                  "config": {"mode": mode, "steps": args.steps, "every": args.every, "batch_size": args.batch_size,
                             "sync_dir": storage}},
        "scaling": {"num_workers": 1},
        "checkpoint": {"every_n_steps": args.every if mode == "async" else None, "at_epoch_end": False,
                       "keep_last": 2, "async": True},
    }
    result = orchestrator.run(spec, console=None)
    stall = result.checkpoint_stall_s if mode == "async" else result.metrics["sync_stall_s"]
    return {"stall_s": stall, "loop_wall_s": result.metrics["loop_wall_s"], "checkpoints": args.steps // args.every}


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


if __name__ == "__main__":
    main()
