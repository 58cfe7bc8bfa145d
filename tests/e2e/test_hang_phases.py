"""The hang watchdog times training steps only: a long first step, a wait for the previous
checkpoint write, and the user's work after a loop ended by max_steps are not hangs. The phases
that are not training have limits of their own, so a storage stall there does not hang a run."""

from __future__ import annotations

import pytest
from cli_runs import run_spec
from specs import lightning_spec, torch_spec

from orchestrator.monitor.watchdog import HangWatchdog
from orchestrator.protocol import Beat
from orchestrator.rank.heartbeat import STARTING, TRAINING, VALIDATION, Heartbeat
from orchestrator.spec import SpecError, validate

LIMITS = {"starting": 100.0, "checkpoint": 20.0, "finishing": 30.0}


def _beat(rank, phase, idle, step=7):
    return Beat(rank=rank, step=step, phase=phase, idle_s=idle, pid=100 + rank)


def _beats_until(dog, seconds, phases):
    """Every rank beats once a second, in its phase since t=0; the verdict at the end (or None)."""
    verdict = None
    for now in range(1, seconds + 1):
        for rank, phase in enumerate(phases):
            verdict = dog.observe(1, _beat(rank, phase, float(now)), now=float(now))
    return verdict


def test_peers_blocked_behind_a_rank_that_checkpoints_are_not_hung():
    dog = HangWatchdog(hang_timeout_s=10, phase_limits=LIMITS)
    dog.new_attempt(1, 2, now=0.0)

    assert _beats_until(dog, 19, ["checkpoint", TRAINING]) is None


def test_a_peers_last_beat_from_the_wait_that_just_ended_is_not_a_hang():
    dog = HangWatchdog(hang_timeout_s=10, phase_limits=LIMITS)
    dog.new_attempt(1, 2, now=0.0)
    _beats_until(dog, 12, ["checkpoint", TRAINING])
    # Rank 0's write is done and it trains on; rank 1's beat, sent just before it was released,
    # still says it has waited 12.5 s in the step.
    dog.observe(1, _beat(0, TRAINING, 0.2, step=8), now=12.6)

    assert dog.observe(1, _beat(1, TRAINING, 12.5), now=12.7) is None
    # With no rank in a limited phase since, a stall is a stall again.
    verdicts = [dog.observe(1, _beat(rank, TRAINING, now - 12.6, step=8), now=now)
                for now in range(13, 25) for rank in (0, 1)]
    assert verdicts[-1].what == "made no progress"


def test_a_rank_past_its_checkpoint_limit_is_named_with_the_field_to_raise():
    dog = HangWatchdog(hang_timeout_s=10, phase_limits=LIMITS)
    dog.new_attempt(1, 2, now=0.0)

    verdict = _beats_until(dog, 21, ["checkpoint", TRAINING])

    assert verdict.ranks == [0]
    assert "stayed in the checkpoint phase for more than 20 s (failure.checkpoint_timeout_s)" in verdict.message


@pytest.mark.parametrize("phase,limit_field", [("starting", "startup_timeout_s"), ("finishing", "finish_timeout_s")])
def test_a_one_worker_run_stalled_outside_training_gets_a_verdict(phase, limit_field):
    dog = HangWatchdog(hang_timeout_s=10, phase_limits=LIMITS)
    dog.new_attempt(1, 1, now=0.0)
    limit = int(LIMITS[phase])

    assert _beats_until(dog, limit, [phase]) is None
    verdict = _beats_until(dog, limit + 1, [phase])

    assert verdict.ranks == [0] and f"failure.{limit_field}" in verdict.message


def test_training_entered_before_the_groups_first_step_still_counts_as_starting():
    beat = Heartbeat(monitor=None, attempt=1, rank=0)  # not started: no thread, no Ray
    beat.enter(VALIDATION)  # Lightning's sanity check
    beat.enter(TRAINING)  # on_train_batch_start of the first batch
    assert beat.phase == STARTING
    beat.stepped(1)
    beat.enter(VALIDATION)
    beat.enter(TRAINING)
    assert beat.phase == TRAINING


def test_the_phase_limits_are_spec_fields_with_a_floor():
    spec = validate({"name": "x", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 5},
                     "failure": {"checkpoint_timeout_s": 120}})
    assert spec.failure.phase_limits == {"starting": 1800.0, "checkpoint": 120.0, "finishing": 1800.0}
    with pytest.raises(SpecError, match=r"failure\.finish_timeout_s"):
        validate({"name": "x", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 5},
                  "failure": {"finish_timeout_s": 1}})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slow_write_and_an_evaluation_after_max_steps_do_not_restart_a_torch_run(tmp_path):
    spec = torch_spec("slow-io", tmp_path, loop="phase_jobs:slow_storage_then_evaluation", every=1)
    spec["torch"].update(max_steps=6, max_epochs=None)  # an epoch has 21 steps: it ends mid-epoch
    spec["failure"]["hang_timeout_s"] = 5

    result = run_spec(spec, str(tmp_path))

    assert result.status == "finished" and result.global_step == 6
    assert result.restarts == 0, result.failures
    assert result.metrics["evaluated"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_long_first_lightning_step_is_not_a_hang(tmp_path):
    spec = lightning_spec("slow-first", tmp_path, model_class="phase_jobs.SlowFirstStep")
    spec["lightning"]["trainer"] = {"max_steps": 3, "limit_val_batches": 2}
    spec["failure"]["hang_timeout_s"] = 5

    result = run_spec(spec, str(tmp_path))

    assert result.status == "finished" and result.global_step == 3
    assert result.restarts == 0, result.failures
