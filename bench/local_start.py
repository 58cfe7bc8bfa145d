"""Start-up in local mode (driver/local.py) against plain torchrun, and the Ray path beside it.

    python bench/local_start.py [--rounds 3] [--no-ray] [--against CHECKOUT]

Two workloads, each side run `--rounds` times in turn, cold (no Ray running), the medians printed:
  script:     bench/local_start_script.py, 24 DDP steps on 2 ranks: plain `torchrun --standalone
              --nproc_per_node 2`, `orchestrator torchrun --nproc_per_node 2` (local mode, the
              default for one node) and the same with --ray (an embedded Ray cluster);
  quickstart: the quickstart's model and data, 8 epochs on 2 ranks: plain Lightning
              (Trainer(devices=2, strategy="ddp") under torchrun, bench/local_start_lightning.py),
              `orchestrator run jobs/quickstart.yaml` (local mode) and with --ray. Both sides
              train TimedClassifier, the quickstart's model noting its first step.
`--against CHECKOUT` adds, to each workload, local mode run from another checkout of this
repository (`git worktree add /tmp/prev HEAD~1`), in turn with the rest: a change measured against
its predecessor in the same hour.
Each figure is the wall time from the command's start to rank 0's first optimizer step (the time
it writes to $FIRST_STEP_FILE) and to the command's exit. Prints the ratios ÷ the plain side
(goal for local mode: <= 1.3 to the exit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _timed(command: list[str], first_step_file: str, env: dict[str, str], cwd: str = REPO) -> tuple[float, float]:
    for path in (first_step_file, first_step_file + ".end"):
        if os.path.exists(path):
            os.remove(path)
    started = time.time()
    done = subprocess.run(command, cwd=cwd, env={**os.environ, **env, "FIRST_STEP_FILE": first_step_file},
                          capture_output=True, text=True, timeout=900)
    ended = time.time()
    # The plain side's exit status is not the test: torch 2.13's gloo at times aborts a rank in its
    # teardown, after training (torchrun then exits 1); the workload's own end marker is.
    ended_well = done.returncode == 0 or ("orchestrator" not in command and os.path.exists(first_step_file + ".end"))
    if not ended_well or not os.path.exists(first_step_file):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(first_step_file) as f:
        return float(f.read()) - started, ended - started


def _sides(folder: str, with_ray: bool) -> dict[str, dict[str, list[str]]]:
    torchrun, orchestrator = os.path.join(BIN, "torchrun"), [sys.executable, "-m", "orchestrator"]
    script = os.path.join("bench", "local_start_script.py")
    storage = os.path.join(folder, "runs")
    quickstart = [*orchestrator, "run", "jobs/quickstart.yaml", "--storage", storage, "--resume-from", "none",
                  "--overwrite", "--set", "lightning.model.class_path=bench.local_start_lightning.TimedClassifier"]
    sides = {
        "script": {
            "plain torchrun": [torchrun, "--standalone", "--nproc_per_node", "2", script],
            "local mode": [*orchestrator, "torchrun", "--nproc_per_node", "2", "--storage", storage, script],
            "ray (embedded)": [*orchestrator, "torchrun", "--ray", "--nproc_per_node", "2", "--storage", storage,
                               script],
        },
        "quickstart": {
            "plain Lightning": [torchrun, "--standalone", "--nproc_per_node", "2",
                                os.path.join("bench", "local_start_lightning.py")],
            "local mode": quickstart,
            "ray (embedded)": [*quickstart, "--ray"],
        },
    }
    if not with_ray:
        for workload in sides.values():
            del workload["ray (embedded)"]
    return sides


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-ray", dest="ray", action="store_false", help="leave the Ray path out")
    parser.add_argument("--against", metavar="CHECKOUT", help="local mode from another checkout too")
    args = parser.parse_args()
    against = os.path.abspath(args.against) if args.against else None
    folder = tempfile.mkdtemp(prefix="local-start-")
    env = {"ORCHESTRATOR_STATE_DIR": os.path.join(folder, "state")}  # no warm cluster of the user's
    try:
        for workload, sides in _sides(folder, args.ray).items():
            if against:
                sides["local, --against"] = sides["local mode"]
            got: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
            for _ in range(args.rounds):
                for side, command in sides.items():
                    where = ({"cwd": against, "env": {**env, "PYTHONPATH": against}} if side == "local, --against"
                             else {"env": env})
                    got[side].append(_timed(command, os.path.join(folder, "first-step"), **where))
            base = next(iter(sides))
            base_first = statistics.median(f for f, _ in got[base])
            base_exit = statistics.median(e for _, e in got[base])
            for side, runs in got.items():
                first, exit_ = statistics.median(f for f, _ in runs), statistics.median(e for _, e in runs)
                print(f"{workload:<10}  {side:<16}  first step {first:6.1f} s ({first / base_first:4.2f}x)   "
                      f"exit {exit_:6.1f} s ({exit_ / base_exit:4.2f}x)   [{args.rounds} runs, medians]", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
