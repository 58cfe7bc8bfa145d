"""The classification of each failure of a worker group (failures.py has the rules), and the error
that ends the run at once where a retry cannot help.

`classify_failure` decides from the workers' exceptions and the run monitor's view of the run;
group_failure.py fetches that view, records the decision and carries it out, for Ray Train's
controller and for local mode alike."""

from __future__ import annotations

from dataclasses import dataclass
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
    FailureKind,
    FailureRecord,
    WorkerFailure,
    mark_repeats,
    overall,
    record_of,
)
from orchestrator.monitor.controller_errors import (
    RestartsExhausted,
    RunStoppedOnController,
    RunTakenOver,
    UserCodeFailed,
)
from orchestrator.protocol import Failure, FailureContext, RankPlace

DIED = "the worker process died or became unreachable"

# The monitor's view when it cannot be asked: the classification still stands without it.
NO_VIEW = FailureContext()


@dataclass
class Classified:
    """The decision on one failure of a worker group: what the monitor records, and the error that
    ends the run on the controller (None: Ray Train retries it against failure.max_failures)."""

    kind: FailureKind
    records: list[FailureRecord]
    hang: dict[str, Any] | None
    exhausted: bool
    end: OrchestratorError | None

    def event(self) -> Failure:
        """The monitor's `failure` event."""
        return Failure(classification=self.kind, ranks=list(self.records), hang=self.hang, exhausted=self.exhausted)


def drain_advice(record: FailureRecord) -> str:
    """For a GPU hardware fault: which node, and how to keep Ray from placing work on it again."""
    if not record.node_id:
        return ("a GPU hardware fault; its node is unknown here: find the host in this rank's log, drain that "
                "node (`ray drain-node --node-id NODE_ID --reason DRAIN_NODE_REASON_PREEMPTION --reason-message "
                "'GPU fault'`) and have its GPU checked")
    host = f" (host {record.hostname})" if record.hostname else ""
    return (f"a GPU hardware fault on node {record.node_id}{host}: the group restarts from the newest checkpoint, "
            "and Ray may place it on that node again. Drain the node so that it takes no new work: `ray drain-node "
            f"--node-id {record.node_id} --reason DRAIN_NODE_REASON_PREEMPTION --reason-message 'GPU fault'` "
            "(from any node of the cluster), then have its GPU checked (nvidia-smi -q -d ECC; Xid lines in dmesg)")


def memory_advice(record: FailureRecord) -> str:
    """For a DataLoader worker killed by SIGKILL: that the node ran out of memory, which node, and
    how to need less memory."""
    host = f" (host {record.hostname})" if record.hostname else ""
    node = f"node {record.node_id}{host}" if record.node_id else "its node (unknown here: see the rank's log)"
    return (f"a DataLoader worker of rank {record.rank} was killed by SIGKILL, most likely by the kernel's OOM killer: "
            f"{node} ran out of memory (`dmesg` or `journalctl -k` there names the killed process). It is retried "
            "from the newest checkpoint; if it comes back, need less memory per node: fewer DataLoader workers "
            "(num_workers of the rank's DataLoader: ctx.data_loader(), ctx.data() or the LightningDataModule's), a "
            "smaller prefetch_factor, a smaller batch (data.<source>.batch_size) or data.<source>.window (row groups "
            "each loader worker keeps decoded), fewer workers per node (scaling.resources_per_worker with a "
            "`memory` amount in bytes makes Ray place fewer on each node), or nodes with more memory")


# What to do about a fault of a node (FailureRecord.fault), said in the record's note.
ADVICE = {GPU: drain_advice, MEMORY: memory_advice}


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


def classify_failure(worker_exceptions: dict[int, BaseException], view: FailureContext,
                     hang_timeout_s: float) -> Classified:
    """Classify a failure of the group from each failed rank's exception and the monitor's view
    (RunMonitor.failure_context: whether the run is stopping or taken over,
    where each rank ran, the earlier failures' signatures, whether restarts are used up)."""
    records = [describe_ray_error(rank, exc, hang_timeout_s) for rank, exc in sorted(worker_exceptions.items())]
    for record in records:
        place = view.places.get(record.rank, RankPlace())
        record.node_id, record.pid, record.hostname = place.node_id, place.pid, place.hostname
    mark_repeats(records, view.earlier)
    for record in records:
        if record.kind == INFRASTRUCTURE and record.fault in ADVICE:
            record.note = ADVICE[record.fault](record)
    kind = TAKEN_OVER if view.taken_over else overall(records, None, view.stopping)
    exhausted = view.restarts_exhausted if kind not in (STOPPED, TAKEN_OVER, USER) else None
    return Classified(kind, records, None, bool(exhausted), _end(kind, records, view, exhausted))


def _end(kind: FailureKind, records: list[FailureRecord], view: FailureContext,
         exhausted: str | None) -> OrchestratorError | None:
    """The error that ends the run without a retry, or None. Ray Train treats an exception raised
    in a callback as a controller error, which it does not retry."""
    if kind == STOPPED:  # the driver is stopping the run: a failure now is no reason to start again
        return RunStoppedOnController("the run was asked to stop; the worker group is not restarted")
    if view.taken_over:  # the driver learnt it first, and ended the workers itself
        return RunTakenOver(view.taken_over, [])
    if kind in (TAKEN_OVER, USER):
        ended = [r for r in records if r.kind == kind]
        error = RunTakenOver if kind == TAKEN_OVER else UserCodeFailed
        return error("; ".join(r.describe() for r in ended), ended)
    if exhausted:  # a script's in-place restarts count too, which Ray Train does not see
        return RestartsExhausted(f"{exhausted}; the last failure ({kind}): "
                                 + "; ".join(r.describe() for r in records), list(records))
    return None
