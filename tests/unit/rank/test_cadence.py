"""When checkpoints are due: steps, seconds, and a preemption notice (one rank, no process group)."""

from __future__ import annotations

import time
from itertools import pairwise

from orchestrator.rank.cadence import AGREEMENT_INTERVAL_S, MAX_STEPS_BETWEEN_AGREEMENTS, SaveCadence
from orchestrator.spec import CheckpointSpec


def test_step_saves_fall_on_multiples_of_every_n_steps():
    cadence = SaveCadence(CheckpointSpec(every_n_steps=5, on_preemption=False), rank=0, world_size=1)
    assert [s for s in range(1, 16) if cadence.reason(s)] == [5, 10, 15]
    assert cadence.reason(10) == "steps"


def test_a_preemption_notice_triggers_exactly_one_save():
    notice = {"value": None}
    cadence = SaveCadence(CheckpointSpec(every_n_steps=None), rank=0, world_size=1, notice=lambda: notice["value"])
    assert cadence.reason(1) is None
    notice["value"] = "node-a is going away"
    reasons = []
    for step in range(2, 200):
        reasons.append(cadence.reason(step))
        time.sleep(0.01)
    assert reasons.count("preemption") == 1
    assert cadence.preemption == "node-a is going away"
    assert set(reasons) == {None, "preemption"}


def _agreement_steps_and_times(step_s: float, run_s: float) -> list[tuple[int, float]]:
    """Train one rank for `run_s` seconds at `step_s` a step; when did rank 0 poll for a notice?"""
    polls = []
    step = 0
    cadence = SaveCadence(CheckpointSpec(every_n_steps=None), rank=0, world_size=1,
                          notice=lambda: polls.append((step, time.monotonic())))
    start = time.monotonic()
    while time.monotonic() - start < run_s:
        step += 1
        cadence.reason(step)
        time.sleep(step_s)
    return polls


def test_agreements_come_about_once_a_second_whatever_the_step_time():
    polls = _agreement_steps_and_times(step_s=0.02, run_s=4.5)
    gaps = [b[1] - a[1] for a, b in pairwise(polls[1:])]  # the first two measure the step time
    assert 3 <= len(gaps) <= 6, polls
    assert all(0.6 * AGREEMENT_INTERVAL_S < gap < 1.6 * AGREEMENT_INTERVAL_S for gap in gaps), gaps


def test_fast_steps_still_agree_at_least_every_hundred_steps():
    polls = _agreement_steps_and_times(step_s=0.001, run_s=1.5)
    steps = [p[0] for p in polls]
    assert all(0 < b - a <= MAX_STEPS_BETWEEN_AGREEMENTS for a, b in pairwise(steps)), steps


def test_every_n_seconds_saves_once_the_time_has_passed_since_the_last_save():
    cadence = SaveCadence(CheckpointSpec(every_n_seconds=0.3, on_preemption=False), rank=0, world_size=1)
    assert cadence.reason(1) is None  # the first agreement: nothing is due yet
    time.sleep(AGREEMENT_INTERVAL_S + 0.1)
    assert cadence.reason(2) == "seconds"
    cadence.saved()
    time.sleep(AGREEMENT_INTERVAL_S + 0.1)
    assert cadence.reason(3) == "seconds"
