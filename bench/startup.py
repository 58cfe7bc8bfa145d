"""Start-up: wall time from the command's start to the first optimizer step and to the command's
return, for the smallest job (2 workers, one optimizer step), through `orchestrator run` and
through raw Ray Train (`bench/startup_raw.py`), alternating the two; then through `orchestrator
run` on a warm local cluster (`orchestrator up`).

    python bench/startup.py [--rounds 3] [--warm-runs 3] [--compare-env NAME=VALUE]

The cold runs say --ray (one node would otherwise run in local mode, without Ray: local_start.py
measures that). `--compare-env` runs each warm run twice, alternating, once with a variable set
(one of Ray Train's switches, e.g. RAY_TRAIN_METRICS_ENABLED=0), and prints both medians.

Each run is a fresh process on a cold machine (no Ray running; the warm runs excepted). The
orchestrator's driver lines are timestamped as they arrive, which splits its time into phases:
to "run ... in" (imports, the spec, the run directory), to "metrics:" (Ray started), to "N
workers up" (controller, worker group, process group, checkpoint choice), to the first step, to
"finished" (the summary written) and to the process's exit (teardown). Prints the median
ratios, orchestrator ÷ raw Ray Train (goals: <= 0.5 for both), and the warm first step (goal:
within 5 s).

Each run's CPU is counted machine-wide (busy core-seconds from /proc/stat, as bench/suite_cpu.py
counts them), since a run's Ray processes are not the command's children: run it with the machine
to itself. `--by-process` also samples /proc during the warm runs and prints the core-seconds of
each kind of process a run starts (the driver, Ray Train's controller and workers, each helper
actor), averaged over the warm runs.
"""

from __future__ import annotations

import argparse
import collections
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
sys.path.insert(0, REPO)

from bench.suite_cpu import busy_core_seconds  # noqa: E402
from bench.torchrun import _process_table  # noqa: E402  (every process's parent, start tick and CPU)

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
    busy_before = busy_core_seconds()
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
    busy = busy_core_seconds() - busy_before
    reader.join(timeout=10)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"{command} exited {code}:\n" + "\n".join(line for _, line in lines[-20:]))
    with open(first_step_file) as f:
        first = float(f.read()) - start
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {"first_step": first, "returned": returned, "cpu": cpu, "busy": busy, "lines": lines}


class ProcessCpu:
    """Samples /proc every 50 ms: the CPU each process started since `begin` used, by its title
    (Ray names an actor's process `ray::<class>` once the actor is created)."""

    def __init__(self):
        self.seen: dict[tuple[int, int], list] = {}  # (pid, start tick) -> [cpu_s, title]
        self.known: set[tuple[int, int]] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _scan(self, record: bool) -> None:
        children, cpu = _process_table()
        for key in (process for processes in children.values() for process in processes):  # (pid, start tick)
            if not record:
                self.known.add(key)
            elif key not in self.known:
                try:
                    with open(f"/proc/{key[0]}/cmdline", "rb") as f:
                        title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue
                self.seen[key] = [cpu[key[0]], title or self.seen.get(key, [0, ""])[1]]

    def _loop(self) -> None:
        while not self.stop.is_set():
            self._scan(record=True)
            time.sleep(0.05)

    def begin(self) -> None:
        self._scan(record=False)  # what ran before: the warm cluster's daemons are not a run's
        self.thread.start()

    def end(self) -> dict[str, tuple[int, float]]:
        self.stop.set()
        self.thread.join()
        kinds: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for cpu, title in self.seen.values():
            kind = _kind(title)
            if kind:
                kinds[kind][0] += 1
                kinds[kind][1] += cpu
        return {kind: (n, cpu) for kind, (n, cpu) in kinds.items()}


def _kind(title: str) -> str | None:
    if title.startswith("ray::"):
        return title.split()[0]
    if " -m orchestrator run" in title:
        return "driver (orchestrator run)"
    if "default_worker.py" in title:
        return "Ray worker never given an actor (prestarted)"
    if title.startswith(sys.executable) or "python" in title.split(" ")[0]:
        return "other python: " + " ".join(title.split()[1:3])[:60]
    return None


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
    parser.add_argument("--compare-env", metavar="NAME=VALUE",
                        help="each warm run also with this variable set (a switch of Ray's), alternating")
    parser.add_argument("--by-process", action="store_true",
                        help="the core-seconds of each kind of process the warm runs start")
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
            arms = [("orchestrator", [*orchestrator, _spec(scratch, f"cold-{r}", first_step_file), "--ray"]),
                    ("raw", [sys.executable, os.path.join(REPO, "bench", "startup_raw.py"), first_step_file,
                             os.path.join(scratch, f"raw-{r}")])]
            for name, command in arms[::-1] if r % 2 else arms:
                run = _timed(command, first_step_file, env)
                results[name].append(run)
                print(f"round {r + 1} {name:>12}: first step {run['first_step']:5.1f} s, returned "
                      f"{run['returned']:5.1f} s, {run['busy']:5.1f} busy core-s"
                      + (f"  ({_phases(run)})" if name == "orchestrator" else ""), flush=True)
        subprocess.run([sys.executable, "-m", "orchestrator", "up"], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=180)
        warm = []
        sampler = ProcessCpu() if args.by_process else None
        try:
            if sampler:
                sampler.begin()
            compared: list[dict] = []
            name, _, value = (args.compare_env or "").partition("=")
            for w in range(args.warm_runs):
                arms = [(warm, env, "")]
                if args.compare_env:  # the same warm run with the variable set, in alternating order
                    arms.append((compared, {**env, name: value}, f" with {args.compare_env}"))
                for into, arm_env, label in arms[::-1] if w % 2 else arms:
                    run = _timed([*orchestrator, _spec(scratch, f"warm-{w}{'x' if label else ''}", first_step_file)],
                                 first_step_file, arm_env)
                    into.append(run)
                    print(f"warm run {w + 1}{label}: first step {run['first_step']:5.1f} s, returned "
                          f"{run['returned']:5.1f} s, {run['busy']:5.1f} busy core-s  ({_phases(run)})", flush=True)
            if compared:
                for key in ("first_step", "returned", "busy"):
                    with_it, without = (statistics.median(r[key] for r in runs) for runs in (compared, warm))
                    print(f"warm median {key} with {args.compare_env}: {with_it:.2f}, without: {without:.2f} "
                          f"(ratio {with_it / without:.2f})")
            if sampler:
                _print_by_process(sampler.end(), args.warm_runs)
        finally:
            subprocess.run([sys.executable, "-m", "orchestrator", "down"], cwd=REPO, env=env, timeout=120)

        def median(name: str, key: str) -> float:
            return statistics.median(run[key] for run in results[name])

        print(f"cold medians: orchestrator first step {median('orchestrator', 'first_step'):.1f} s, returned "
              f"{median('orchestrator', 'returned'):.1f} s; raw Ray Train first step "
              f"{median('raw', 'first_step'):.1f} s, returned {median('raw', 'returned'):.1f} s")
        print(f"warm median first step: {statistics.median(r['first_step'] for r in warm):.1f} s, returned "
              f"{statistics.median(r['returned'] for r in warm):.1f} s")
        print(f"busy core-s a run (medians): orchestrator cold {median('orchestrator', 'busy'):.1f}, raw Ray Train "
              f"cold {median('raw', 'busy'):.1f}, orchestrator warm {statistics.median(r['busy'] for r in warm):.1f}")
        print(f"cpu_ratio={median('orchestrator', 'busy') / median('raw', 'busy'):.2f} "
              f"first_step_ratio={median('orchestrator', 'first_step') / median('raw', 'first_step'):.2f} "
              f"return_ratio={median('orchestrator', 'returned') / median('raw', 'returned'):.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _print_by_process(kinds: dict[str, tuple[int, float]], runs: int) -> None:
    total = sum(cpu for _, cpu in kinds.values())
    print(f"core-s a warm run, by process ({runs} runs; processes started while they ran):")
    for kind, (n, cpu) in sorted(kinds.items(), key=lambda item: -item[1][1]):
        print(f"  {cpu / runs:5.2f}  {n / runs:4.1f} process(es)  {kind}")
    print(f"  {total / runs:5.2f}  in all")


if __name__ == "__main__":
    main()
