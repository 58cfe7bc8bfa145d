"""The run monitor times every duration it judges on the monotonic clock (monitor/actor.py): a step
of the wall clock (NTP, a resumed VM) while ranks beat neither names a beating rank hung nor hides
a silent one, and a hang's verdict still carries the wall clock's time, as every event does. The
step is played by time.time() moved an hour for the rest of the test; time.monotonic() is the
kernel's own."""

from __future__ import annotations

import time

import pytest

from orchestrator.monitor.actor import RunMonitor
from orchestrator.monitor.watchdog import SILENT_AFTER_S
from orchestrator.protocol import RESTART, WAIT, Beat
from orchestrator.spec import FailureSpec

pytestmark = pytest.mark.timeout(120)

HANG_TIMEOUT_S = 2.0


def _beat(monitor, rank: int, step: int) -> None:
    monitor.beat(1, Beat(rank=rank, step=step, phase="training", idle_s=0.0, node_id="node", pid=100 + rank))


@pytest.mark.parametrize("step_s", [3600.0, -3600.0], ids=["forward", "back"])
def test_a_wall_clock_step_neither_names_a_beating_rank_hung_nor_hides_a_silent_one(monkeypatch, step_s):
    monitor = RunMonitor.__ray_actor_class__(FailureSpec(hang_timeout_s=HANG_TIMEOUT_S, max_failures=-1))
    assert monitor.begin_group(2, 1).attempt == 1
    _beat(monitor, 0, 1)
    _beat(monitor, 1, 1)
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + step_s)
    # Rank 0 beat a moment ago, whatever the wall clock says now.
    _beat(monitor, 1, 2)
    assert monitor.attempt_verdict(1).action == WAIT
    # Rank 0 falls silent from here: named once it has been silent long enough, by the clock that did not step.
    silent_from = time.monotonic()
    step = 2
    while monitor.attempt_verdict(1).action == WAIT:
        assert time.monotonic() - silent_from < SILENT_AFTER_S + 30, "a silent rank was never named"
        step += 1
        _beat(monitor, 1, step)
        time.sleep(0.2)
    silent_s = time.monotonic() - silent_from
    verdict = monitor.attempt_verdict(1)
    assert verdict.action == RESTART and verdict.failure.kind == "hang", verdict
    assert verdict.failure.rank == 0 and "stopped answering" in verdict.failure.error, verdict
    assert silent_s >= SILENT_AFTER_S - 0.5, f"named after {silent_s:.1f} s of silence"
    assert abs(verdict.failure.hang["time"] - time.time()) < 60, verdict.failure.hang
