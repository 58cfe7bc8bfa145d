"""A rank whose training raised is given its grace (failure.hang_timeout_s) on the agent's monotonic
clock, not by its failing mark's mtime (agent/children.py `Child.failing_for`): a step of the wall
clock (NTP, a resumed VM) between the mark and the agent's look neither ends the rank at once,
before its rank 0 could commit the checkpoint in flight, nor lets it run on for ever. The step is
played by the mark's mtime set an hour off the wall clock (os.utime), as a step after the mark
was written leaves it; a real rank under the bootstrap wrote the mark."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import wait_for

from orchestrator.agent.children import LocalRanks, Placement
from orchestrator.rank.agent_contract import FAILING_SUFFIX

pytestmark = pytest.mark.timeout(120)

GRACE_S = 2.0
# A rank whose training raised, said so (as a ctx or Lightning rank's session does), and then never
# leaves the exception's handlers.
FAILING = """import os, sys, time
from orchestrator.rank.script.bootstrap import mark_failing
try:
    {}["no such feature"]
except KeyError as exc:
    mark_failing(exc)
    open(sys.argv[1], "w").close()
    time.sleep(600)
    raise
"""


@pytest.mark.parametrize("mtime_off_s", [-3600.0, 3600.0], ids=["clock-stepped-forward", "clock-stepped-back"])
def test_a_failing_rank_is_ended_after_its_grace_on_the_monotonic_clock_whatever_its_marks_mtime(
        tmp_path, mtime_off_s):
    script, marked = tmp_path / "train.py", tmp_path / "marked"
    script.write_text(FAILING)
    placement = Placement(group_rank=0, group_world_size=1, local_world_size=1, master_addr="127.0.0.1",
                          master_port=29500, attempt=1, max_restarts=0, run_id="failing")
    ranks = LocalRanks([str(script), str(marked)], cwd=str(tmp_path), base_env=dict(os.environ),
                       placement=placement, scratch=str(tmp_path / "scratch"), log_dir=str(tmp_path / "logs"))
    child = ranks.children[0]
    try:
        wait_for(marked.exists, timeout=60)
        # The wall clock stepped by an hour since the rank marked itself failing: its mark's mtime is
        # an hour behind (stepped forward) or ahead (stepped back) of the wall clock now.
        stamp = time.time() + mtime_off_s
        os.utime(child.failure_file + FAILING_SUFFIX, (stamp, stamp))
        first_look = time.monotonic()  # the agent's first look at the mark is below, none came before
        wait_for(lambda: ranks.end_failing(GRACE_S) or child.ended_failing, timeout=GRACE_S + 20, interval=0.05)
        took = time.monotonic() - first_look
        assert GRACE_S <= took < GRACE_S + 15, f"ended {took:.2f} s after the agent first saw its mark"
        assert child.process.wait(timeout=30) == -signal.SIGKILL
    finally:
        ranks.stop()
