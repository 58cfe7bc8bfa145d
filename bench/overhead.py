"""Orchestrator overhead: training steps/s through the orchestrator ÷ a hand-written torchrun DDP script.

Same model (~8.4 M parameters, >= 50 ms a step on CPU), same data, same world size (2 workers,
one CPU thread each), measured in one invocation, alternating the two a few rounds (and which
goes first) and taking the median of the rounds' ratios. CPU milliseconds per step are printed
next to the rates: where wall time grows and CPU time does not, a process was waiting. Steps/s
are timed inside the training loop after a warm-up, so start-up is reported separately, not
mixed into the ratio. Goal: ratio >= 0.99 with a core to spare (--workers 1).

    python bench/overhead.py [--rounds 3] [--steps 200] [--warmup 40] [--workers 2] [--runtime lightning]

With --runtime lightning both sides run bench/overhead_lightning.py's LightningModule: the
orchestrator through a `lightning:` spec, the baseline as a plain Lightning script under torchrun.

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


def baseline(steps: int, warmup: int, batch: int, workers: int, runtime: str, storage: str) -> dict:
    script = "overhead_lightning.py" if runtime == "lightning" else "ddp_baseline.py"
    out_file = os.path.join(storage, "baseline.json")
    extra = ["--out", out_file] if runtime == "lightning" else []
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={workers}", "--master_port=29533",
         os.path.join(REPO, "bench", script), "--steps", str(steps), "--warmup", str(warmup),
         "--batch-size", str(batch), *extra],
        capture_output=True, text=True, check=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    if runtime == "lightning":
        with open(out_file) as f:
            return json.load(f)
    return json.loads(out.strip().splitlines()[-1])


def orchestrated(steps: int, warmup: int, batch: int, workers: int, storage: str, index: int, runtime: str) -> dict:
    import orchestrator

    if runtime == "lightning":
        out_file = os.path.join(storage, f"orchestrated-{index}.json")
        section = {"lightning": {
            "model": {"class_path": "bench.overhead_lightning.WorkloadModule",
                      "init_args": {"out": out_file, "steps": steps, "warmup": warmup}},
            "data": {"class_path": "bench.overhead_lightning.WorkloadData",
                     "init_args": {"samples": batch * workers * (steps + warmup), "batch_size": batch}},
            "trainer": {"max_steps": steps + warmup}}}
    else:
        section = {"torch": {"train_loop": "bench.overhead_job:train_loop", "max_steps": steps + warmup,
                             "config": {"steps": steps, "warmup": warmup, "batch_size": batch}}}
    spec = {
        "name": f"overhead-{index}", "storage": storage, "resume_from": "none", **section,
        "scaling": {"num_workers": workers, "resources_per_worker": {"CPU": 1}},
        "checkpoint": {"at_epoch_end": False},
    }
    start = time.perf_counter()
    result = orchestrator.run(spec, console=None)
    if runtime == "lightning":
        with open(out_file) as f:
            return {**json.load(f), "wall_s": time.perf_counter() - start}
    return {**result.metrics, "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2,
                        help="DDP processes on each side (2 fills this 2-core machine; 1 leaves a core free)")
    parser.add_argument("--runtime", choices=("torch", "lightning"), default="torch",
                        help="the ctx loop against hand-written DDP, or a LightningModule against the same "
                             "Lightning script under torchrun")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    ratios, ours, theirs = [], [], []
    with tempfile.TemporaryDirectory() as storage:
        for i in range(args.rounds):
            # Alternate which goes first, so a machine that drifts faster or slower during the
            # run does not favour one side.
            order = ("torchrun", "orchestrator") if i % 2 == 0 else ("orchestrator", "torchrun")
            got = {}
            for side in order:
                if side == "torchrun":
                    got[side] = baseline(args.steps, args.warmup, args.batch_size, args.workers, args.runtime, storage)
                else:
                    got[side] = orchestrated(args.steps, args.warmup, args.batch_size, args.workers, storage, i,
                                             args.runtime)
            base, mine = got["torchrun"], got["orchestrator"]
            theirs.append(base)
            ours.append(mine)
            ratios.append(mine["steps_per_s"] / base["steps_per_s"])
            print(f"round {i + 1}: torchrun {base['steps_per_s']:.3f} steps/s "
                  f"({base['cpu_ms_per_step']:.0f} ms CPU/step), orchestrator {mine['steps_per_s']:.3f} steps/s "
                  f"({mine['cpu_ms_per_step']:.0f} ms CPU/step, run wall {mine['wall_s']:.1f} s), "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    base = statistics.median(r["steps_per_s"] for r in theirs)
    mine = statistics.median(r["steps_per_s"] for r in ours)
    name = "Lightning script under torchrun" if args.runtime == "lightning" else "torchrun DDP"
    print(f"{name}:  {base:.3f} steps/s ({1000 / base:.0f} ms/step)")
    print(f"orchestrator:  {mine:.3f} steps/s ({1000 / mine:.0f} ms/step)")
    print(f"ratio: {statistics.median(ratios):.3f} (median of the rounds' ratios; goal >= 0.99); "
          f"orchestrator start-up + teardown ~ "
          f"{statistics.median(r['wall_s'] for r in ours) - (args.steps + args.warmup) / mine:.1f} s per run")


if __name__ == "__main__":
    main()
