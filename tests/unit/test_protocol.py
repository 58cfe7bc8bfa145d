"""The typed protocol between ranks, agents, the run monitor and the driver (orchestrator/protocol.py):
every event is a dataclass with a kind of its own, and one attempt number runs through it all."""

from __future__ import annotations

import json
import pickle

from orchestrator import protocol
from orchestrator.failures import INFRASTRUCTURE, FailureRecord
from orchestrator.monitor.actor import RunMonitor
from orchestrator.protocol import (
    FINISH,
    RESTART,
    Beat,
    CheckpointCommitted,
    Event,
    Finished,
    Output,
    RankStarted,
    RestartInPlace,
    RunWarning,
)
from orchestrator.spec import FailureSpec


def _events() -> list[type[Event]]:
    return [c for c in vars(protocol).values()
            if isinstance(c, type) and issubclass(c, Event) and not c.__name__.startswith("_") and c is not Event]


def test_every_event_has_a_kind_of_its_own_and_becomes_plain_json():
    kinds = [cls.kind for cls in _events()]
    assert len(kinds) == len(set(kinds)) and all(kinds), kinds
    started = RankStarted(rank=1, world_size=2, attempt=3, node_id="n", pid=7, time=1.5)
    record = started.to_record()
    assert next(iter(record)) == "kind" and record["kind"] == "rank_started" and record["attempt"] == 3
    assert json.loads(json.dumps(record)) == record
    # Events cross Ray (pickled) and come back as the same typed objects.
    assert pickle.loads(pickle.dumps(started)) == started


def _monitor(max_restarts: int = -1) -> RunMonitor:
    return RunMonitor.__ray_actor_class__(FailureSpec(hang_timeout_s=10.0, max_failures=max_restarts))


def test_the_monitor_stamps_events_keeps_the_newest_checkpoint_and_buffers_output_apart():
    monitor = _monitor()
    begun = monitor.begin_group(2)
    assert (begun.attempt, begun.latest_uri) == (1, None)
    monitor.push(CheckpointCommitted(uri="store://step-5", step=5))
    monitor.push(Output(rank=0, lines=["hello"]))
    monitor.push(RunWarning(message="careful"))
    events = monitor.events_since(0)
    assert [type(e) for e in events] == [CheckpointCommitted, RunWarning] and all(e.time > 0 for e in events)
    assert monitor.take_output() == (["hello"], 0)
    # A restarted group is the next attempt, and resumes from the newest checkpoint of this run.
    assert monitor.begin_group(2) == protocol.AttemptBegun(2, "store://step-5")
    assert not monitor.finished()
    monitor.push(Finished(attempt=2, step=9, stopped=True))
    assert monitor.finished(stopped=True) and not monitor.finished()


def test_a_scripts_restart_in_place_is_the_next_attempt_and_late_beats_of_the_last_one_are_ignored():
    monitor = _monitor(max_restarts=3)
    assert monitor.begin_group(2, workers=1).attempt == 1
    monitor.attempt_report(1, 0, FailureRecord(rank=1, kind=INFRASTRUCTURE, decisive=True, error="SIGKILL"))
    verdict = monitor.attempt_verdict(1)
    assert verdict.action == RESTART and (verdict.attempt, verdict.restarts) == (2, 1)
    restart = monitor.events_since(0)[-1]
    assert isinstance(restart, RestartInPlace) and restart.attempt == 2 and restart.failure.rank == 1
    # Attempt 1's ranks are gone: their beats are not the new attempt's.
    reply = monitor.beat(1, Beat(rank=0, step=5, phase="training", idle_s=0.0))
    assert reply == protocol.BeatReply() and list(monitor.last_steps()) == [1]
    monitor.attempt_report(2, 0, None)
    assert monitor.attempt_verdict(2).action == FINISH
    # A group restart after that is one more attempt of the same budget.
    assert monitor.begin_group(2, workers=1).attempt == 3
    assert monitor.attempt_state() == protocol.AttemptState(attempt=3, restarts=2, max_restarts=3, latest_uri=None)
    # The newest checkpoint committed in the run is where the next attempt's rank 0 resumes.
    monitor.push(CheckpointCommitted(uri="store://step-8", step=8))
    assert monitor.attempt_state().latest_uri == "store://step-8"

