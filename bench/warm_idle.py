"""What the warm local cluster costs while it waits: the CPU of its whole process tree (the keeper,
`ray start`, the GCS, the raylet, the agents, and the dashboard when it has one), over a minute
with no run, with Ray's dashboard (the default of `orchestrator up`) and with --no-dashboard.

    python bench/warm_idle.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of `root` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    for flags in ([], ["--no-dashboard"]):
        with tempfile.TemporaryDirectory(prefix="bench-warm-idle-") as state:
            env = {**os.environ, "ORCHESTRATOR_STATE_DIR": state}
            subprocess.run([sys.executable, "-m", "orchestrator", "up", "--num-cpus", "2", *flags], env=env,
                           cwd=REPO, check=True, capture_output=True)
            try:
                with open(os.path.join(state, "warm-cluster.json")) as f:
                    keeper = json.load(f)["keeper_pid"]
                time.sleep(10)  # past the start's own work
                before = tree_cpu_s(keeper)
                time.sleep(args.seconds)
                share = (tree_cpu_s(keeper) - before) / args.seconds
                print(f"orchestrator up {' '.join(flags) or '(dashboard)'}: idle CPU {share:.1%} of a core")
            finally:
                subprocess.run([sys.executable, "-m", "orchestrator", "down"], env=env, cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
