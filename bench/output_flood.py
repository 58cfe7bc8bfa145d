"""A torchrun script that prints without pause: the driver's and the run monitor's memory stay flat.

    python bench/output_flood.py [--mib 200] [--small-mib 2]

Runs `orchestrator torchrun --nproc_per_node 1` of a script whose rank 0 prints --mib MiB of
100-byte lines as fast as it can, on an embedded cluster, with the command's output read and
thrown away as a terminal would show it. Samples, every 0.5 s, the resident memory of the
driver (the command) and of the run monitor actor (`ray::RunMonitor`). Then the same with
--small-mib. Prints each run's peak memory and the ratio big ÷ small: flat is about 1 (before,
the monitor kept every line for the whole run and the driver read them all back at the end).
Also prints how many lines the console showed, how many it said it dropped, and whether the
rank's log holds every line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys
line = "x" * 90
for i in range(int(sys.argv[1])):
    print(f"{i:09d} {line}")
"""


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for row in f:
                if row.startswith("VmRSS:"):
                    return int(row.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _monitor_pid(state_dir: str) -> int | None:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::RunMonitor"):
                        return int(name)
            except OSError:
                continue
    return None


def run(mib: float, root: str) -> dict:
    lines = int(mib * 2**20 / 100)
    script = os.path.join(root, "flood.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    storage = os.path.join(root, f"runs-{mib:g}")
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": os.path.join(root, "state")}
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "torchrun", "--nproc_per_node", "1",
                                "--storage", storage, "--name", "flood", script, str(lines)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    seen = {"bytes": 0, "shown": 0, "dropped_notes": 0}

    def read() -> None:
        for raw in process.stdout:
            seen["bytes"] += len(raw)
            if raw[:9].isdigit():
                seen["shown"] += 1
            elif b"not shown here" in raw:
                seen["dropped_notes"] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak = {"driver": 0.0, "monitor": 0.0}
    monitor = None
    while process.poll() is None:
        peak["driver"] = max(peak["driver"], _rss_mib(process.pid))
        monitor = monitor or _monitor_pid(env["ORCHESTRATOR_STATE_DIR"])
        if monitor:
            peak["monitor"] = max(peak["monitor"], _rss_mib(monitor))
        time.sleep(0.5)
    reader.join(timeout=30)
    with open(os.path.join(storage, "flood", "logs", "rank-0.log"), "rb") as f:
        logged = sum(1 for _ in f)
    return {"mib": mib, "lines": lines, "exit": process.returncode, "wall_s": time.monotonic() - started,
            "driver_mib": peak["driver"], "monitor_mib": peak["monitor"], "shown": seen["shown"],
            "dropped_notes": seen["dropped_notes"], "logged": logged}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=200.0, help="MiB rank 0 prints in the big run")
    parser.add_argument("--small-mib", type=float, default=2.0, help="MiB it prints in the baseline run")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="output-flood-")
    try:
        small, big = run(args.small_mib, root), run(args.mib, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in (small, big):
        print(f"{r['mib']:g} MiB printed ({r['lines']} lines): exit {r['exit']}, {r['wall_s']:.1f} s; peak RSS "
              f"driver {r['driver_mib']:.0f} MiB, run monitor {r['monitor_mib']:.0f} MiB; console showed "
              f"{r['shown']} lines ({r['dropped_notes']} drop notes); rank-0.log holds {r['logged']} lines")
    print(f"peak RSS, {args.mib:g} MiB ÷ {args.small_mib:g} MiB printed: driver "
          f"{big['driver_mib'] / max(small['driver_mib'], 1e-9):.2f}, run monitor "
          f"{big['monitor_mib'] / max(small['monitor_mib'], 1e-9):.2f} (flat: about 1)")
    return 0 if small["exit"] == big["exit"] == 0 and big["logged"] == big["lines"] else 1


if __name__ == "__main__":
    sys.exit(main())
