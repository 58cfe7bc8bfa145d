"""Orchestrator overhead: training steps/s through the orchestrator ÷ a hand-written torchrun DDP script.

Same model (~8.4 M parameters, >= 50 ms a step on CPU), same data, same world size (2 workers,
one CPU thread each), measured in one invocation, alternating the two a few rounds and taking
the median of each. Steps/s are timed inside the training loop after a warm-up, so start-up is
reported separately, not mixed into the ratio. Goal: ratio >= 0.98.

    python bench/overhead.py [--rounds 2] [--steps 200] [--warmup 40]

The warm-up is long on purpose: for the first seconds after start-up Ray's helper processes are
still busy, and a short window measured them, not training (6.9 to 11.2 steps/s in one run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def baseline(steps: int, warmup: int, batch: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
         os.path.join(REPO, "bench", "ddp_baseline.py"), "--steps", str(steps), "--warmup", str(warmup),
         "--batch-size", str(batch)],
        capture_output=True, text=True, check=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["steps_per_s"]


def orchestrated(steps: int, warmup: int, batch: int, storage: str, index: int) -> tuple[float, float]:
    import orchestrator

    spec = {
        "name": f"overhead-{index}", "storage": storage, "resume_from": "none",
        "torch": {"train_loop": "bench.overhead_job:train_loop", "max_steps": steps + warmup,
                  "config": {"steps": steps, "warmup": warmup, "batch_size": batch}},
        "scaling": {"num_workers": 2, "resources_per_worker": {"CPU": 1}},
        "checkpoint": {"at_epoch_end": False},
    }
    start = time.perf_counter()
    result = orchestrator.run(spec, console=None)
    return result.metrics["steps_per_s"], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    ours, theirs, walls = [], [], []
    with tempfile.TemporaryDirectory() as storage:
        for i in range(args.rounds):
            theirs.append(baseline(args.steps, args.warmup, args.batch_size))
            rate, wall = orchestrated(args.steps, args.warmup, args.batch_size, storage, i)
            ours.append(rate)
            walls.append(wall)
            print(f"round {i + 1}: torchrun {theirs[-1]:.3f} steps/s, orchestrator {ours[-1]:.3f} steps/s "
                  f"(run wall {wall:.1f} s)", flush=True)
    base, mine = statistics.median(theirs), statistics.median(ours)
    print(f"torchrun DDP:  {base:.3f} steps/s ({1000 / base:.0f} ms/step)")
    print(f"orchestrator:  {mine:.3f} steps/s ({1000 / mine:.0f} ms/step)")
    print(f"ratio: {mine / base:.3f} (goal >= 0.98); orchestrator start-up + teardown ~ "
          f"{statistics.median(walls) - (args.steps + args.warmup) / mine:.1f} s per run")


if __name__ == "__main__":
    main()
