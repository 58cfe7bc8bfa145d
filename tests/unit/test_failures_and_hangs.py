"""How failures are classified, how hangs are judged, how goodput is counted (no Ray cluster)."""

from __future__ import annotations

import dataclasses
import errno
import pickle

import pytest
import torch.distributed as dist

from orchestrator.driver.signals import JOB_STOP_MARGIN_S, grace_seconds
from orchestrator.failures import (
    HANG,
    INFRASTRUCTURE,
    USER,
    TransientStartError,
    WorkerFailure,
    classify,
    raised_at,
)
from orchestrator.monitor.classifier import describe_ray_error
from orchestrator.monitor.watchdog import HangWatchdog
from orchestrator.observe import goodput
from orchestrator.protocol import Beat, Failure, Finished, Progress, RankStarted


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the test wants the exception with its traceback
        return caught


@pytest.mark.parametrize("exc, kind", [
    (ValueError("bad batch"), USER),
    (KeyError("feature"), USER),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (32x64 and 128x10)"), USER),
    (FileNotFoundError(errno.ENOENT, "No such file", "data/train.parquet"), USER),
    (TypeError("Trainer() got multiple values for keyword argument 'enable_progress_bar'"), USER),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:123"),
     INFRASTRUCTURE),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv"),
     INFRASTRUCTURE),
    (dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), INFRASTRUCTURE),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), INFRASTRUCTURE),
    (OSError(errno.EIO, "Input/output error"), INFRASTRUCTURE),
    (TransientStartError("rank 1 could not read it"), INFRASTRUCTURE),
])
def test_exceptions_are_classified_as_the_users_or_the_infrastructures(exc, kind):
    assert classify(exc) == kind


def test_a_failed_background_write_is_classified_by_its_cause():
    try:
        try:
            raise OSError(errno.EIO, "Input/output error")
        except OSError as cause:
            raise RuntimeError("a background checkpoint write failed: OSError: Input/output error") from cause
    except RuntimeError as exc:
        assert classify(exc) == INFRASTRUCTURE


def test_the_place_an_error_was_raised_is_the_users_own_line():
    def user_function():
        raise ValueError("boom")

    exc = _raised_from(user_function)
    assert raised_at(exc).startswith("tests/unit/test_failures_and_hangs.py:")
    assert raised_at(exc).endswith("in user_function")


def _raised_from(function) -> BaseException:
    try:
        function()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_a_worker_failure_carries_its_classification_across_processes():
    exc = _raised_from(lambda: int("seven"))
    failure = WorkerFailure.from_exception(exc, rank=1)
    again = pickle.loads(pickle.dumps(failure))
    assert again.record == failure.record
    assert again.kind == USER and again.record.rank == 1
    assert again.record.error == "ValueError: invalid literal for int() with base 10: 'seven'"
    assert "test_failures_and_hangs.py" in again.record.where
    assert str(again) == failure.message


def test_errors_of_workers_that_died_or_froze_are_classified_on_the_controller():
    from ray.exceptions import ActorDiedError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError, WorkerHealthCheckTimeoutError

    frozen = describe_ray_error(1, WorkerHealthCheckTimeoutError("no answer"), hang_timeout_s=30)
    assert frozen.kind == HANG and "30 s" in frozen.error
    died = describe_ray_error(0, WorkerHealthCheckFailedError("dead", ActorDiedError()), hang_timeout_s=30)
    assert died.kind == INFRASTRUCTURE


# --- the hang watchdog ------------------------------------------------------------------------

def _beat(rank, step, phase="training", idle=0.0):
    return Beat(rank=rank, step=step, phase=phase, idle_s=idle, node_id=f"node-{rank}", pid=100 + rank)


def test_a_rank_that_stops_answering_is_named_once_the_timeout_passes():
    dog = HangWatchdog(hang_timeout_s=10)
    dog.new_attempt(1, world_size=2, now=0)
    dog.observe(1, _beat(0, 5), now=0)
    dog.observe(1, _beat(1, 5), now=0)
    for t in range(1, 11):  # rank 1 is silent from t=0; rank 0 keeps beating
        assert dog.observe(1, _beat(0, 5, idle=0.5), now=t) is None
    verdict = dog.observe(1, _beat(0, 5, idle=0.5), now=10.5)
    assert verdict is not None and verdict.ranks == [1] and verdict.what == "stopped answering"
    assert "rank 1 (node node-1, pid 101)" in verdict.message


def test_ranks_that_take_no_step_while_training_are_a_hang_and_other_phases_are_not():
    dog = HangWatchdog(hang_timeout_s=10)
    dog.new_attempt(3, world_size=2, now=0)
    for phase in ("starting", "checkpoint", "validation", "epoch_end", "finishing"):
        assert dog.observe(3, _beat(0, 7, phase, idle=600), now=1) is None
    assert dog.observe(3, _beat(1, 7, "training", idle=9.9), now=1) is None
    verdict = dog.observe(3, _beat(1, 7, "training", idle=10.1), now=2)
    assert verdict.ranks == [1] and verdict.what == "made no progress"


def test_a_frozen_rank_is_named_rather_than_the_peers_it_stalls():
    dog = HangWatchdog(hang_timeout_s=10)
    dog.new_attempt(1, world_size=2, now=0)
    dog.observe(1, _beat(1, 25), now=1.0)  # rank 1's last heartbeat, a second after its last step
    # Rank 0, blocked in a collective with rank 1, crosses the timeout first.
    verdict = dog.observe(1, _beat(0, 25, idle=10.2), now=10.2)
    assert verdict.what == "stopped answering" and verdict.ranks == [1]


def test_a_rank_frozen_before_its_first_heartbeat_is_named():
    dog = HangWatchdog(hang_timeout_s=10)
    dog.new_attempt(1, world_size=2, now=100.0)
    verdict = dog.observe(1, _beat(0, 25, idle=10.5), now=111.0)
    assert verdict.what == "stopped answering" and verdict.ranks == [1]


def test_beats_of_a_replaced_group_are_ignored():
    dog = HangWatchdog(hang_timeout_s=10)
    dog.new_attempt(2, world_size=2, now=0)
    assert dog.observe(1, _beat(0, 3, idle=100), now=0) is None
    assert dog.beats == {}


# --- goodput ----------------------------------------------------------------------------------

def _events_of_a_run_with_one_restart():
    # Group 1 starts at t=10, steps 1..30 at 0.5 s each from t=20; checkpoint at 20; fails after 30.
    # Group 2 resumes from 20 at t=50, steps 21..60 at 0.5 s each from t=60.
    events = [RankStarted(rank=0, attempt=1, world_size=2, time=10.0)]
    events += [Progress(attempt=1, step=s, stall_s=0.5, time=20.0 + (s - 1) * 0.5) for s in (1, 10, 20, 30)]
    events.append(Failure(time=40.0, classification="hang", ranks=[]))
    events.append(RankStarted(rank=0, attempt=2, world_size=2, restored_step=20, time=50.0))
    events += [Progress(attempt=2, step=s, stall_s=1.0, time=60.0 + (s - 21) * 0.5) for s in (21, 40, 60)]
    events.append(Finished(attempt=2, step=60, checkpoint_stall_s=1.0, time=85.0))
    return events


def test_goodput_counts_only_steps_that_reached_the_final_weights():
    g = goodput.compute(_events_of_a_run_with_one_restart(), started=0.0, ended=100.0)
    assert g["recomputed_steps"] == 10  # steps 21..30 of the first group were trained again
    assert g["lost_s"]["recomputed"] == pytest.approx(5.0)
    assert g["lost_s"]["startup"] == pytest.approx(20.0)  # to the first step
    assert g["lost_s"]["restarts"] == pytest.approx(60.0 - 34.5)  # last step of group 1 to first of group 2
    assert g["lost_s"]["checkpoint_stall"] == pytest.approx(1.5)
    # 20 + 40 steps kept at 0.5 s, less the stall.
    assert g["productive_s"] == pytest.approx(30.0 - 1.5)
    assert g["goodput"] == pytest.approx(0.285)
    assert sum(g["lost_s"].values()) + g["productive_s"] == pytest.approx(100.0)


def test_time_waiting_for_capacity_is_taken_out_of_the_restart_it_overlaps():
    g = goodput.compute(_events_of_a_run_with_one_restart(), started=0.0, ended=100.0,
                        capacity_waits=[(40.0, 55.0)])
    assert g["lost_s"]["capacity_wait"] == pytest.approx(15.0)
    assert g["lost_s"]["restarts"] == pytest.approx(60.0 - 34.5 - 15.0)
    assert "goodput 28.5%" in goodput.describe(g)


def test_a_run_that_never_stepped_has_no_goodput():
    g = goodput.compute([], started=0.0, ended=30.0)
    assert g["goodput"] is None and g["lost_s"]["startup"] == pytest.approx(30.0)
    assert goodput.describe(g).startswith("goodput not measured: no start of the ranks timed two optimizer steps")


def test_a_script_too_short_to_time_by_its_span_is_timed_by_its_own_step_time():
    """24 steps of 0.03 s seen in one progress report (rank 0 reports every 2 s): the span of the
    reports times nothing, and the old count gave 0% (or a step time from the epoch's end). The
    bootstrap's median time between steps times them."""
    events = [RankStarted(rank=0, attempt=1, world_size=2, time=5.0),
              Progress(attempt=1, step=24, time=8.0, step_time_s=0.03),
              Finished(attempt=1, step=24, time=9.0, step_time_s=0.03)]
    g = goodput.compute(events, started=0.0, ended=10.0)
    assert g["step_time_s"] == pytest.approx(0.03) and g["productive_s"] == pytest.approx(24 * 0.03)
    assert g["goodput"] == pytest.approx(0.072)
    untimed = [events[0]] + [dataclasses.replace(e, step_time_s=None) for e in events[1:]]
    g = goodput.compute(untimed, started=0.0, ended=10.0)
    assert g["goodput"] is None and "24 step(s) seen" in g["not_timed"]


# --- stop grace -------------------------------------------------------------------------------

def test_the_stop_grace_follows_what_the_sender_allows(monkeypatch):
    for var in ("ORCHESTRATOR_STOP_GRACE_S", "RAY_JOB_STOP_WAIT_TIME_S", "RAY_JOB_CONFIG_JSON_ENV_VAR"):
        monkeypatch.delenv(var, raising=False)
    assert grace_seconds("SIGINT") == 30
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # a driver of `ray job submit`
    assert grace_seconds("SIGTERM") == pytest.approx(3 - JOB_STOP_MARGIN_S)
    monkeypatch.setenv("RAY_JOB_STOP_WAIT_TIME_S", "60")
    assert grace_seconds("SIGTERM") == pytest.approx(60 - JOB_STOP_MARGIN_S)
    monkeypatch.setenv("ORCHESTRATOR_STOP_GRACE_S", "5")
    assert grace_seconds("SIGTERM") == 5
