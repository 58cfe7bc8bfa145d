"""A ctx or Lightning rank's SIGTERM (orchestrator/rank/stop_signal.py), in real processes: one sent
from outside (a scheduler, `kill` from a shell) marks the run's stop and leaves the rank running, a
second marks "at once"; its agent's SIGTERM (the parent's: a restart in place, the run's end) still
ends it by SIGTERM at once, even while its main thread waits in a C call. What it forks (a DataLoader
worker) carries on through the outside SIGTERM and ends at its rank's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, wait_for

from orchestrator.processes import is_alive
from orchestrator.rank.stop_signal import STOP_AGAIN_SUFFIX, STOP_SUFFIX

# The rank: the stop signal set up as the bootstrap sets it up (loaded by path, before any thread),
# then a thread of its own, a forked helper whose pid it prints, and a main thread in a C call.
RANK = textwrap.dedent("""
    import os, sys, threading, time
    sys.path.insert(0, os.path.join(sys.argv[1], "orchestrator", "rank", "script"))
    import bootstrap
    bootstrap._load_beside("stop_signal.py").install()
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # would take SIGTERM if unblocked
    helper = os.fork()
    if helper == 0:
        time.sleep(3600)
        os._exit(0)
    print(helper, flush=True)
    time.sleep(3600)
""")


def _outside_sigterm(pid: int) -> None:
    """SIGTERM from a process that is neither the rank's agent nor its parent: a shell's `kill`."""
    subprocess.run(["kill", "-TERM", str(pid)], check=True, timeout=10)


@pytest.mark.timeout(60)
def test_a_rank_sent_sigterm_from_outside_asks_for_the_stop_and_its_agents_sigterm_still_ends_it(tmp_path):
    failure_file = str(tmp_path / "failure.json")
    env = {**os.environ, "ORCHESTRATOR_FAILURE_FILE": failure_file, "ORCHESTRATOR_SUPERVISOR_PID": str(os.getpid()),
           "RANK": "1"}
    rank = subprocess.Popen([sys.executable, "-c", RANK, REPO], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        helper = int(rank.stdout.readline())
        _outside_sigterm(rank.pid)
        assert wait_for(lambda: os.path.exists(failure_file + STOP_SUFFIX), timeout=20), "no stop marked"
        assert rank.poll() is None and not os.path.exists(failure_file + STOP_AGAIN_SUFFIX)
        _outside_sigterm(helper)
        _outside_sigterm(rank.pid)
        assert wait_for(lambda: os.path.exists(failure_file + STOP_AGAIN_SUFFIX), timeout=20), "no second stop"
        assert rank.poll() is None and is_alive(helper)  # (the helper had its SIGTERM before the rank's second)

        os.kill(rank.pid, signal.SIGTERM)  # this process is the rank's agent (ORCHESTRATOR_SUPERVISOR_PID)
        assert rank.wait(timeout=20) == -signal.SIGTERM
        # The helper's own parent is gone with the rank; a SIGTERM then ends it (as the agent's sweep does).
        _outside_sigterm(helper)
        assert wait_for(lambda: not is_alive(helper), timeout=20), "the helper outlived its rank's end"
        assert "rank 1 was sent SIGTERM (by pid" in rank.stderr.read()
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
