"""Ray Train's controller callback that classifies each failure of a worker group (failures.py has
the rules) and ends the run at once where a retry cannot help."""

from __future__ import annotations

import logging
from dataclasses import asdict

import ray
import ray.train

from orchestrator.failures import (
    DIED,
    GPU,
    HANG,
    INFRASTRUCTURE,
    STOPPED,
    TAKEN_OVER,
    USER,
    RestartsExhausted,
    RunStoppedOnController,
    RunTakenOver,
    UserCodeFailed,
    describe_ray_error,
    drain_advice,
    mark_repeats,
    overall,
)

log = logging.getLogger(__name__)


class FailureClassifier(ray.train.UserCallback):
    """Runs on Ray Train's controller each time workers fail, before it decides to retry.

    Records the failure (its classification per rank) with the run monitor, and ends the run at
    once when the training code itself raised, when an error came back at the same step after a
    restart, or when another driver took the run over: Ray Train treats an exception raised here
    as a controller error it does not retry.
    """

    def __init__(self, monitor, hang_timeout_s: float):
        self.monitor = monitor
        self.hang_timeout_s = hang_timeout_s

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        records = [describe_ray_error(rank, exc, self.hang_timeout_s)
                   for rank, exc in sorted(worker_exceptions.items())]
        try:
            view = ray.get(self.monitor.failure_context.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the classification still stands without the monitor's view
            view = {"hang": None, "stopping": False, "places": {}}
        verdict, stopping = view["hang"], view["stopping"]
        for record in records:
            place = view["places"].get(record.rank) or {}
            record.node_id, record.pid = place.get("node_id", ""), place.get("pid", 0)
            record.hostname = place.get("hostname", "")
            if verdict and record.error.startswith(DIED):
                # The watchdog's verdict made this worker end itself (runtime/heartbeat.py).
                record.kind, record.error = HANG, "ended by the hang watchdog: " + verdict["message"]
        mark_repeats(records, view.get("earlier", []))
        for record in records:
            if record.fault == GPU and record.kind == INFRASTRUCTURE:
                record.note = drain_advice(record)
        kind = TAKEN_OVER if view.get("taken_over") else overall(records, verdict, stopping)
        exhausted = view.get("restarts_exhausted") if kind not in (STOPPED, TAKEN_OVER, USER) else None
        payload = {"classification": kind, "ranks": [asdict(r) for r in records], "hang": verdict,
                   "exhausted": bool(exhausted)}
        try:
            ray.get(self.monitor.push.remote("failure", **payload), timeout=10)
        except Exception as exc:  # noqa: BLE001 - recording must not change the outcome
            log.warning("could not record the failure with the run monitor: %s", exc)
        if kind == STOPPED:  # the driver is stopping the run: a failure now is no reason to start again
            raise RunStoppedOnController("the run was asked to stop; the worker group is not restarted")
        if view.get("taken_over"):  # the driver learnt it first, and ended the workers itself
            raise RunTakenOver(view["taken_over"], [])
        if kind in (TAKEN_OVER, USER):
            ended = [r for r in records if r.kind == kind]
            error = RunTakenOver if kind == TAKEN_OVER else UserCodeFailed
            raise error("; ".join(r.describe() for r in ended), [asdict(r) for r in ended])
        if exhausted:  # a script's in-place restarts count too, which Ray Train does not see
            raise RestartsExhausted(f"{exhausted}; the last failure ({kind}): "
                                    + "; ".join(r.describe() for r in records), [asdict(r) for r in records])
