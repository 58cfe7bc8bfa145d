"""A local run in a long-lived Python process (orchestrator.run(), driver/local.py): its agent and
run monitor live in the caller's process, so once run() returns nothing of the run may stay there:
no thread, file descriptor or socket of it, and no run monitor, agent or agent link alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

HELPER = os.path.join(REPO, "tests", "helpers", "repeated_local_runs.py")


@pytest.mark.timeout(400)
def test_each_local_run_of_a_python_process_leaves_no_thread_descriptor_socket_or_monitor_of_it(tmp_path):
    done = subprocess.run([sys.executable, HELPER, str(tmp_path), "3"], capture_output=True, text=True, cwd=REPO,
                          timeout=360, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    after = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [a["status"] for a in after] == ["finished"] * 3, done.stdout[-2000:]
    for state in after:
        assert state["objects"] == {"RunMonitor": 0, "Supervisor": 0, "LinkServer": 0}, state
        assert state["sockets"] == [], state
    # The first run is the warm-up: what its one-time imports start or open for the process's life
    # (a library's thread or file) is not the run's. Each later run must leave the process as the
    # one before it left it: a thread or descriptor per run is a leak.
    first, *later = after
    for state in later:
        assert state["threads"] == first["threads"], (first["threads"], state["threads"])
        assert state["fds"] == first["fds"], (first["fds"], state["fds"])
    assert first["threads"] == ["MainThread"], first["threads"]
