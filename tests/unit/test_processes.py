"""The processes a warm cluster's `down` ends are its keeper's tree, found through /proc: every
process below the keeper, however deep, and none beside it (such as a driver that ran on it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from orchestrator.processes import descendants, is_alive

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# A child that starts a grandchild, prints the grandchild's pid, and waits for it.
TREE = f"import subprocess; g = subprocess.Popen({SLEEP!r}); print(g.pid, flush=True); g.wait()"


def test_descendants_are_every_process_below_and_none_beside():
    child = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    beside = subprocess.Popen(SLEEP)
    grandchild = 0
    try:
        grandchild = int(child.stdout.readline())
        assert descendants(child.pid) == [grandchild]
        assert descendants(beside.pid) == []
        assert {child.pid, grandchild, beside.pid} <= set(descendants(os.getpid()))
    finally:
        if is_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)  # by its own pid: the child's end would orphan it
        for process in (child, beside):
            process.kill()
            process.wait()
        child.stdout.close()
