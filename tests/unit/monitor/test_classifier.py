"""Ray Train's controller callback (monitor/classifier.py) decides, for each failure of a worker
group, how it is classified, what the run monitor records, and whether the run ends without a retry.
No Ray cluster: the exceptions are real (raised, and wrapped as a worker wraps them), and the
monitor's view of the run comes from a real RunMonitor object, fed the events its workers push."""

from __future__ import annotations

import pickle
import time

import ray
import torch
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

from orchestrator.errors import LeaseLost
from orchestrator.failures import (
    GPU,
    INFRASTRUCTURE,
    STOPPED,
    TAKEN_OVER,
    USER,
    WorkerFailure,
)
from orchestrator.monitor.actor import RunMonitor
from orchestrator.monitor.classifier import DIED, classify_failure, describe_ray_error
from orchestrator.monitor.controller_errors import RestartsExhausted, RunStoppedOnController, RunTakenOver, UserCodeFailed
from orchestrator.protocol import RankStarted
from orchestrator.spec import FailureSpec

HANG_TIMEOUT_S = 30.0
NODES = {0: ("a" * 56, "node-a", 4100), 1: ("b" * 56, "node-b", 4200)}


def _monitor(max_restarts: int = -1):
    """The run monitor (the plain object inside the actor) after a group of two ranks started on
    two nodes, as their worker_started events tell it."""
    monitor = RunMonitor.__ray_actor_class__(FailureSpec(hang_timeout_s=HANG_TIMEOUT_S, max_failures=max_restarts))
    _start_group(monitor)
    return monitor


def _start_group(monitor) -> None:
    attempt = monitor.begin_group(len(NODES), workers=len(NODES)).attempt
    for rank, (node_id, hostname, pid) in NODES.items():
        monitor.push(RankStarted(rank=rank, attempt=attempt, node_id=node_id, hostname=hostname, pid=pid,
                                 world_size=len(NODES)))


def _raised(function) -> BaseException:
    try:
        function()
    except BaseException as exc:  # noqa: BLE001 - the test wants the exception with its traceback
        return exc
    raise AssertionError("did not raise")


def _worker(function, rank: int, step: int | None = 7) -> WorkerFailure:
    """What a worker raises when its training code raises (agent/worker.py)."""
    return WorkerFailure.from_exception(_raised(function), rank, step=step)


def _bug():
    return int("seven")


def _peer_gone():
    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4242")


def _damaged_page():
    raise OSError("Couldn't deserialize thrift: TProtocolException: Invalid data")  # pyarrow's, without errno


def test_each_failed_rank_is_recorded_with_the_node_host_and_process_it_ran_on_and_retried():
    decision = classify_failure({1: _worker(_peer_gone, 1), 0: _worker(_peer_gone, 0)},
                                _monitor().failure_context(), HANG_TIMEOUT_S)
    assert decision.kind == INFRASTRUCTURE and decision.end is None  # Ray Train retries it
    assert [(r.rank, r.node_id, r.hostname, r.pid) for r in decision.records] == [
        (rank, *NODES[rank]) for rank in (0, 1)]
    event = decision.event()
    assert event.classification == INFRASTRUCTURE and not event.exhausted and event.hang is None
    assert [r.hostname for r in event.ranks] == ["node-a", "node-b"]
    # A rank the monitor never saw start is recorded without a place.
    unknown = classify_failure({5: _worker(_peer_gone, 5)}, _monitor().failure_context(), HANG_TIMEOUT_S)
    assert (unknown.records[0].node_id, unknown.records[0].hostname, unknown.records[0].pid) == ("", "", 0)


def test_a_lost_agent_is_an_infrastructure_failure_retried_by_ray_train_and_a_bug_is_not():
    # A hang never reaches Ray Train's controller (its ranks restart in place): a dead agent, as
    # Ray Train's health check reports it, is a lost worker, which the group restart heals.
    died = WorkerHealthCheckFailedError("Worker health check failed.", ray.exceptions.RayActorError())
    lost = classify_failure({1: died}, _monitor().failure_context(), HANG_TIMEOUT_S)
    assert lost.kind == INFRASTRUCTURE and lost.records[0].error.startswith(DIED) and lost.end is None
    assert lost.event().hang is None
    bug = classify_failure({0: _worker(_bug, 0)}, _monitor().failure_context(), HANG_TIMEOUT_S)
    assert bug.records[0].kind == USER and isinstance(bug.end, UserCodeFailed)


def test_an_error_back_at_the_same_step_after_a_restart_ends_the_run_as_the_users_data():
    monitor = _monitor()
    first = classify_failure({0: _worker(_damaged_page, 0, step=31)}, monitor.failure_context(), HANG_TIMEOUT_S)
    assert first.kind == INFRASTRUCTURE and first.end is None and first.records[0].signature  # maybe a hiccup
    monitor.push(first.event())
    _start_group(monitor)  # Ray Train restarted the group from the newest checkpoint

    elsewhere = classify_failure({0: _worker(_damaged_page, 0, step=57)}, monitor.failure_context(), HANG_TIMEOUT_S)
    assert elsewhere.kind == INFRASTRUCTURE and elsewhere.end is None

    again = classify_failure({0: _worker(_damaged_page, 0, step=31)}, monitor.failure_context(), HANG_TIMEOUT_S)
    record = again.records[0]
    assert again.kind == USER and record.kind == USER and record.repeated and "same step (31)" in record.note
    assert isinstance(again.end, UserCodeFailed) and again.end.records[0].repeated


def test_a_gpu_hardware_fault_is_retried_with_the_node_to_drain_in_its_note():
    def ecc():
        exc = torch.AcceleratorError("CUDA error: uncorrectable ECC error encountered\n")
        exc.error_code = 214
        raise exc

    decision = classify_failure({1: _worker(ecc, 1)}, _monitor().failure_context(), HANG_TIMEOUT_S)
    record = decision.records[0]
    assert decision.kind == INFRASTRUCTURE and decision.end is None and record.fault == GPU
    assert f"ray drain-node --node-id {NODES[1][0]}" in record.note and "(host node-b)" in record.note
    assert decision.event().ranks[0].note == record.note  # what the console and summary.json show


def test_a_bug_in_the_training_code_ends_the_run_at_once_as_that_ranks_and_not_as_its_peers():
    decision = classify_failure({0: _worker(_bug, 0), 1: _worker(_peer_gone, 1)}, _monitor().failure_context(),
                                HANG_TIMEOUT_S)
    assert decision.kind == USER and isinstance(decision.end, UserCodeFailed)
    assert [r.rank for r in decision.end.records] == [0]  # the peer's lost connection is the consequence
    assert decision.end.message.startswith("rank 0: ValueError: invalid literal for int() with base 10: 'seven' at ")
    assert "test_classifier.py" in decision.end.message and "in _bug" in decision.end.message
    again = pickle.loads(pickle.dumps(decision.end))  # it crosses from the controller to the driver
    assert type(again) is UserCodeFailed and again.records == decision.end.records


def test_a_run_being_stopped_is_not_restarted_whatever_failed():
    monitor = _monitor()
    monitor.request_stop(time.time() + 30)
    decision = classify_failure({0: _worker(_bug, 0), 1: _worker(_peer_gone, 1)}, monitor.failure_context(),
                                HANG_TIMEOUT_S)
    assert decision.kind == STOPPED and isinstance(decision.end, RunStoppedOnController)
    assert decision.event().classification == STOPPED


def test_a_run_another_driver_took_over_ends_as_taken_over_without_a_retry():
    monitor = _monitor()
    monitor.take_over("generation 2 now holds it (host other, pid 77)")
    decision = classify_failure({1: _worker(_peer_gone, 1)}, monitor.failure_context(), HANG_TIMEOUT_S)
    assert decision.kind == TAKEN_OVER and isinstance(decision.end, RunTakenOver)
    assert decision.end.message == "generation 2 now holds it (host other, pid 77)" and decision.end.records == []


def test_a_rank_that_lost_the_run_to_another_driver_ends_it_as_taken_over_naming_that_rank():
    def lost():
        raise LeaseLost("generation 2 now holds it (host other, pid 77)")

    decision = classify_failure({0: _worker(lost, 0), 1: _worker(_peer_gone, 1)}, _monitor().failure_context(),
                                HANG_TIMEOUT_S)
    assert decision.kind == TAKEN_OVER and type(decision.end) is RunTakenOver
    assert [r.rank for r in decision.end.records] == [0] and "generation 2 now holds it" in decision.end.message


def test_restarts_used_up_end_the_run_with_the_last_failure_but_a_bug_still_ends_it_as_a_bug():
    monitor = _monitor(max_restarts=1)  # a torchrun script's run: in-place and group restarts count together
    _start_group(monitor)  # the one group restart failure.max_failures allows
    view = monitor.failure_context()
    assert view.restarts_exhausted

    decision = classify_failure({1: _worker(_peer_gone, 1)}, view, HANG_TIMEOUT_S)
    assert decision.kind == INFRASTRUCTURE and decision.event().exhausted
    assert isinstance(decision.end, RestartsExhausted) and decision.end.message.startswith(view.restarts_exhausted)
    assert "; the last failure (infrastructure): rank 1: RuntimeError: " in decision.end.message

    bug = classify_failure({0: _worker(_bug, 0)}, view, HANG_TIMEOUT_S)
    assert type(bug.end) is UserCodeFailed and not bug.event().exhausted


def test_a_dead_workers_record_carries_rays_own_reason_for_the_death():
    """Ray knows why a worker's process died (its exit type and detail): the record says it, so
    that "killed for memory" is not left to a guess among a lost node, a kill and a freeze."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    context = ActorDiedErrorContext(
        error_message="The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY "
                      "Worker exit detail: Task was killed due to the node running low on memory.",
        class_name="RayTrainWorker", actor_id=b"\x01" * 16, pid=4321, node_ip_address="127.0.0.1")
    died = describe_ray_error(1, WorkerHealthCheckFailedError("dead", ActorDiedError(context)), hang_timeout_s=30)
    assert died.kind == INFRASTRUCTURE
    assert died.error.endswith("; Ray says: The actor is dead because its worker process has died. Worker exit type: "
                               "NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low "
                               "on memory.")
    assert "actor_id" not in died.error and "4321" not in died.error
