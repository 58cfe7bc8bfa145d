"""The classification of each failure of a worker group (failures.py has the rules), and the error
that ends the run at once where a retry cannot help.

`classify_failure` decides from the workers' exceptions and the run monitor's view of the run;
group_failure.py fetches that view, records the decision and carries it out, for Ray Train's
controller and for local mode alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from orchestrator.errors import OrchestratorError
from orchestrator.failures import (
    GPU,
    HANG,
    INFRASTRUCTURE,
    MEMORY,
    STOPPED,
    TAKEN_OVER,
    USER,
    FailureRecord,
    RestartsExhausted,
    RunStoppedOnController,
    RunTakenOver,
    UserCodeFailed,
    WorkerFailure,
    drain_advice,
    mark_repeats,
    memory_advice,
    overall,
    record_of,
)
from orchestrator.protocol import Failure

DIED = "the worker process died or became unreachable"

# The monitor's view when it cannot be asked: the classification still stands without it.
NO_VIEW: dict[str, Any] = {"stopping": False, "places": {}}
# What to do about a fault of a node (FailureRecord.fault), said in the record's note.
ADVICE = {GPU: drain_advice, MEMORY: memory_advice}


@dataclass
class Classified:
    """The decision on one failure of a worker group: what the monitor records, and the error that
    ends the run on the controller (None: Ray Train retries it against failure.max_failures)."""

    kind: str
    records: list[FailureRecord]
    hang: dict[str, Any] | None
    exhausted: bool
    end: OrchestratorError | None

    def event(self) -> Failure:
        """The monitor's `failure` event."""
        return Failure(classification=self.kind, ranks=[asdict(r) for r in self.records], hang=self.hang,
                       exhausted=self.exhausted)


def describe_ray_error(rank: int, exc: BaseException, hang_timeout_s: float) -> FailureRecord:
    """Classify an error that reached Ray Train's controller for one rank."""
    if isinstance(exc, WorkerFailure):
        return exc.record
    # Ray Train's health-check errors, known by name: their module is private (ray_private.py).
    name = type(exc).__name__
    if name == "WorkerHealthCheckTimeoutError":
        return FailureRecord(rank, HANG, f"the worker stopped answering for more than {hang_timeout_s:g} s")
    if name == "WorkerHealthCheckFailedError":
        cause = getattr(exc, "health_check_failure", None)
        what = DIED
        if isinstance(cause, ray.exceptions.RayActorError):
            what += f" ({type(cause).__name__}: its node was lost, it was killed, e.g. out of memory, or it froze)"
            reason = _ray_reason(cause)
            if reason:
                what += f"; Ray says: {reason}"
        return FailureRecord(rank, INFRASTRUCTURE, what)
    return record_of(rank, exc)


def _ray_reason(error: ray.exceptions.RayActorError, limit: int = 300) -> str:
    """Ray's own account of an actor's death (its worker's exit type and detail: out of memory,
    a node gone, killed by a signal), without the boilerplate and the ids around it."""
    lines = [line.strip() for line in (error.error_msg or "").splitlines()
             if line.strip() and not line.startswith("\t") and ActorDiedError.BASE_ERROR_MSG not in line]
    reason = " ".join(lines)
    return reason if len(reason) <= limit else reason[:limit - 3] + "..."


def classify_failure(worker_exceptions: dict[int, BaseException], view: dict[str, Any],
                     hang_timeout_s: float) -> Classified:
    """Classify a failure of the group from each failed rank's exception and the monitor's view
    (RunMonitor.failure_context: whether the run is stopping or taken over,
    where each rank ran, the earlier failures' signatures, whether restarts are used up)."""
    records = [describe_ray_error(rank, exc, hang_timeout_s) for rank, exc in sorted(worker_exceptions.items())]
    stopping = view["stopping"]
    for record in records:
        place = view["places"].get(record.rank) or {}
        record.node_id, record.pid = place.get("node_id", ""), place.get("pid", 0)
        record.hostname = place.get("hostname", "")
    mark_repeats(records, view.get("earlier", []))
    for record in records:
        if record.kind == INFRASTRUCTURE and record.fault in ADVICE:
            record.note = ADVICE[record.fault](record)
    kind = TAKEN_OVER if view.get("taken_over") else overall(records, None, stopping)
    exhausted = view.get("restarts_exhausted") if kind not in (STOPPED, TAKEN_OVER, USER) else None
    return Classified(kind, records, None, bool(exhausted), _end(kind, records, view, exhausted))


def _end(kind: str, records: list[FailureRecord], view: dict[str, Any],
         exhausted: str | None) -> OrchestratorError | None:
    """The error that ends the run without a retry, or None. Ray Train treats an exception raised
    in a callback as a controller error, which it does not retry."""
    if kind == STOPPED:  # the driver is stopping the run: a failure now is no reason to start again
        return RunStoppedOnController("the run was asked to stop; the worker group is not restarted")
    if view.get("taken_over"):  # the driver learnt it first, and ended the workers itself
        return RunTakenOver(view["taken_over"], [])
    if kind in (TAKEN_OVER, USER):
        ended = [r for r in records if r.kind == kind]
        error = RunTakenOver if kind == TAKEN_OVER else UserCodeFailed
        return error("; ".join(r.describe() for r in ended), [asdict(r) for r in ended])
    if exhausted:  # a script's in-place restarts count too, which Ray Train does not see
        return RestartsExhausted(f"{exhausted}; the last failure ({kind}): "
                                 + "; ".join(r.describe() for r in records), [asdict(r) for r in records])
    return None
