"""The run monitor (monitor/actor.py) is built from the run's failure spec and its name, and each
attempt, a group's start or a restart in place alike, is judged afresh by one reset; its answers
are typed (protocol.py): the attempt's state and the view Ray Train's controller classifies by."""

from __future__ import annotations

import time

from orchestrator.failures import INFRASTRUCTURE, FailureRecord
from orchestrator.monitor.actor import RunMonitor
from orchestrator.protocol import RESTART, AttemptState, Beat, Failure, FailureContext, RankPlace, RankStarted
from orchestrator.spec import FailureSpec


def _monitor(**failure) -> RunMonitor:
    return RunMonitor.__ray_actor_class__(FailureSpec(**failure), "wire")


def test_the_monitor_takes_its_limits_and_its_restarts_from_the_failure_spec_and_its_name_from_the_run():
    monitor = _monitor(max_failures=1, hang_timeout_s=7.0, startup_timeout_s=11.0, straggler_ratio=2.5,
                       straggler_after_s=3.0)
    assert repr(monitor) == "RunMonitor(run='wire')"
    assert monitor.begin_group(2).attempt == 1
    assert monitor.attempt_state() == AttemptState(attempt=1, restarts=0, max_restarts=1, latest_uri=None)
    assert monitor._watchdog.hang_timeout_s == 7.0 and monitor._watchdog.phase_limits["starting"] == 11.0
    assert (monitor._stragglers.ratio, monitor._stragglers.after_s) == (2.5, 3.0)


def test_a_restart_in_place_judges_the_new_attempt_afresh_as_a_group_start_does():
    monitor = _monitor(hang_timeout_s=1.0, max_failures=-1)
    monitor.begin_group(2, workers=1)
    for rank in (0, 1):
        monitor.beat(1, Beat(rank=rank, step=4, phase="training", idle_s=0.0, node_id="n", pid=10 + rank))
    monitor.attempt_report(1, 0, FailureRecord(1, INFRASTRUCTURE, "the process was killed by SIGKILL", decisive=True))
    assert monitor.attempt_verdict(1).action == RESTART
    for attempt, start in ((2, lambda: None), (3, lambda: monitor.begin_group(2, workers=1))):
        start()
        watchdog, stragglers = monitor._watchdog, monitor._stragglers
        assert (watchdog.attempt, watchdog.world_size, watchdog.beats, watchdog.verdict) == (attempt, 2, {}, None)
        assert stragglers.attempt == attempt and stragglers.beats == {}
        assert monitor.attempt_state().attempt == attempt
        # A late beat of the attempt before is not this one's.
        monitor.beat(attempt - 1, Beat(rank=0, step=9, phase="training", idle_s=0.0))
        assert watchdog.beats == {}


def test_the_controllers_view_names_each_ranks_place_and_the_earlier_errors_a_retry_could_pass():
    monitor = _monitor(max_failures=-1)
    attempt = monitor.begin_group(2).attempt
    monitor.push(RankStarted(rank=1, world_size=2, attempt=attempt, node_id="node-b", hostname="host-b", pid=51))
    hiccup = FailureRecord(1, INFRASTRUCTURE, "ParquetReadError: row group 5", step=31, signature="abc")
    bug = FailureRecord(0, INFRASTRUCTURE, "RuntimeError: Connection closed by peer")
    monitor.push(Failure(classification=INFRASTRUCTURE, ranks=[hiccup, bug]))
    view = monitor.failure_context()
    assert view == FailureContext(places={1: RankPlace("node-b", 51, "host-b")}, earlier=[hiccup])
    monitor.request_stop(time.time() + 30)
    assert monitor.failure_context().stopping
