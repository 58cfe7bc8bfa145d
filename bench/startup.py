"""Start-up: wall time from the command's start to the first optimizer step and to the command's
return, for the smallest job (2 workers, one optimizer step), through `orchestrator run` and
through raw Ray Train (`bench/startup_raw.py`), alternating the two; then through `orchestrator
run` on a warm local cluster (`orchestrator up`).

    python bench/startup.py [--rounds 3] [--warm-runs 3]

Each run is a fresh process on a cold machine (no Ray running; the warm runs excepted). The
orchestrator's driver lines are timestamped as they arrive, which splits its time into phases:
to "run ... in" (imports, the spec, the run directory), to "metrics:" (Ray started), to "N
workers up" (controller, worker group, process group, checkpoint choice), to the first step, to
"finished" (the summary written) and to the process's exit (teardown). Prints the median
ratios, orchestrator ÷ raw Ray Train (goals: <= 0.5 for both), and the warm first step (goal:
within 5 s).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = (("run '", "driver ready"), ("metrics:", "Ray started"), ("workers up", "workers up"))


def _spec(folder: str, name: str, first_step_file: str) -> str:
    import yaml

    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"name": name, "storage": os.path.join(folder, "runs"), "resume_from": "none",
                        "torch": {"train_loop": "bench.startup_job:train_loop", "max_steps": 1,
                                  "config": {"first_step_file": first_step_file}},
                        "scaling": {"num_workers": 2}}, f)
    return path


def _timed(command: list[str], first_step_file: str, env: dict) -> dict:
    """Run `command`; the seconds to its first step, to its return, its CPU, and each line's time."""
    if os.path.exists(first_step_file):
        os.unlink(first_step_file)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    process = subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in process.stdout:
            lines.append((time.time() - start, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = process.wait(timeout=600)
    returned = time.time() - start
    reader.join(timeout=10)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"{command} exited {code}:\n" + "\n".join(line for _, line in lines[-20:]))
    with open(first_step_file) as f:
        first = float(f.read()) - start
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {"first_step": first, "returned": returned, "cpu": cpu, "lines": lines}


def _phases(run: dict) -> str:
    marks = []
    for needle, label in PHASES:
        found = next((t for t, line in run["lines"] if needle in line), None)
        if found is not None:
            marks.append((found, label))
    marks.append((run["first_step"], "first step"))
    finished = next((t for t, line in run["lines"] if "finished:" in line), None)
    if finished is not None:
        marks.append((finished, "summary written"))
    marks.append((run["returned"], "returned"))
    out, before = [], 0.0
    for when, label in sorted(marks):
        out.append(f"{label} +{when - before:.1f}")
        before = when
    return ", ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="bench-startup-")
    state = os.path.join(scratch, "state")
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": state, "PYTHONPATH": REPO,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    first_step_file = os.path.join(scratch, "first-step")
    orchestrator = [sys.executable, "-m", "orchestrator", "run"]
    results: dict[str, list[dict]] = {"orchestrator": [], "raw": []}
    try:
        for r in range(args.rounds):
            arms = [("orchestrator", [*orchestrator, _spec(scratch, f"cold-{r}", first_step_file)]),
                    ("raw", [sys.executable, os.path.join(REPO, "bench", "startup_raw.py"), first_step_file,
                             os.path.join(scratch, f"raw-{r}")])]
            for name, command in arms[::-1] if r % 2 else arms:
                run = _timed(command, first_step_file, env)
                results[name].append(run)
                print(f"round {r + 1} {name:>12}: first step {run['first_step']:5.1f} s, returned "
                      f"{run['returned']:5.1f} s, CPU {run['cpu']:5.1f} s"
                      + (f"  ({_phases(run)})" if name == "orchestrator" else ""), flush=True)
        subprocess.run([sys.executable, "-m", "orchestrator", "up"], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=180)
        warm = []
        try:
            for w in range(args.warm_runs):
                run = _timed([*orchestrator, _spec(scratch, f"warm-{w}", first_step_file)], first_step_file, env)
                warm.append(run)
                print(f"warm run {w + 1}: first step {run['first_step']:5.1f} s, returned {run['returned']:5.1f} s, "
                      f"CPU {run['cpu']:5.1f} s  ({_phases(run)})", flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "orchestrator", "down"], cwd=REPO, env=env, timeout=120)

        def median(name: str, key: str) -> float:
            return statistics.median(run[key] for run in results[name])

        print(f"cold medians: orchestrator first step {median('orchestrator', 'first_step'):.1f} s, returned "
              f"{median('orchestrator', 'returned'):.1f} s; raw Ray Train first step "
              f"{median('raw', 'first_step'):.1f} s, returned {median('raw', 'returned'):.1f} s")
        print(f"warm median first step: {statistics.median(r['first_step'] for r in warm):.1f} s, returned "
              f"{statistics.median(r['returned'] for r in warm):.1f} s")
        print(f"first_step_ratio={median('orchestrator', 'first_step') / median('raw', 'first_step'):.2f} "
              f"return_ratio={median('orchestrator', 'returned') / median('raw', 'returned'):.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
