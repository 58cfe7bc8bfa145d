"""Stragglers: how long a rank slowed for real takes to be named, with the spec's defaults.

A ctx job of 2 workers (tests/helpers/straggler_jobs.py: every rank spends --work-s a step on its
own work before the forward) runs through `orchestrator run` on an embedded cluster; --even-s
seconds after its first step, rank 1 takes --factor times as long (1.5: a node at two thirds of its
peers' speed) and writes the time.time() it did. The figure is the time from that moment to the
driver's warning line (`... is a straggler ...`), read as it arrives; the goal is under 60 s with
failure.straggler_ratio 1.3 and straggler_after_s 20 (the defaults). The run's summary.json must
name rank 1, hold its straggler wait, and the even part before must name nobody.

The bookkeeping's cost in steps/s is bench/overhead.py's P1 (the orchestrator's ctx job against the
same training under plain torchrun, which has no such hooks), run before and after it landed.

    python bench/stragglers.py [--work-s 0.03] [--factor 1.5] [--even-s 15] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPERS = os.path.join(REPO, "tests", "helpers")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-s", type=float, default=0.03)
    parser.add_argument("--factor", type=float, default=1.5)
    parser.add_argument("--even-s", type=float, default=15.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-") as scratch:
        marker = os.path.join(scratch, "slowed")
        # Steps for the even part, 60 s of the slowed one, and some to spare.
        steps = int((args.even_s + 60) / (args.work_s * args.factor + 0.01))
        spec = {"name": "stragglers", "storage": os.path.join(scratch, "runs"), "scaling": {"num_workers": 2},
                "checkpoint": {"every_n_steps": 10_000},
                "torch": {"train_loop": "straggler_jobs:train_loop", "max_epochs": 1,
                          "config": {"steps": steps, "work_s": args.work_s, "slow_rank": 1, "slow_factor": args.factor,
                                     "slow_after_s": args.even_s, "marker": marker}}}
        path = os.path.join(scratch, "stragglers.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(spec, f)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HELPERS, os.environ.get("PYTHONPATH")])),
               "ORCHESTRATOR_STATE_DIR": os.path.join(scratch, "state")}
        process = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", path], cwd=REPO, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        warned: list[float] = []
        lines: list[str] = []

        def read() -> None:
            for line in process.stdout:
                lines.append(line.rstrip())
                if "is a straggler" in line and not warned:
                    warned.append(time.time())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            print("\n".join(lines[-30:]))
            print(f"the run did not end within {args.timeout:g} s")
            return 1
        reader.join(10)
        with open(os.path.join(spec["storage"], "stragglers", "summary.json")) as f:
            summary = json.load(f)
        if code != 0 or not warned or not os.path.exists(marker):
            print("\n".join(lines[-30:]))
            print(f"exit {code}; warned: {bool(warned)}; slowed: {os.path.exists(marker)}")
            return 1
        with open(marker) as f:
            slowed_at = float(f.read())
        print(next(line for line in lines if "is a straggler" in line))
        records = summary["stragglers"]
        print(f"rank named: {[r['rank'] for r in records]}, ratio {records[0]['ratio']:.2f}; slowest at the end: "
              f"rank {summary['slowest_rank']['rank']} {summary['slowest_rank']['ratio']:.2f}x; the steps waited "
              f"{summary['goodput']['straggler_wait_s']:.1f} s for it")
        print(f"detection: {warned[0] - slowed_at:.1f} s from the slowdown to the warning (goal < 60 s; "
              f"straggler_after_s 20, --work-s {args.work_s:g}, --factor {args.factor:g})")
        return 0 if [r["rank"] for r in records] == [1] else 1


if __name__ == "__main__":
    sys.exit(main())
