"""What a failed worker group means, decided in one place for both ways a group runs: Ray Train's
controller calls `GroupFailureCallback` each time workers fail, before it decides to retry; a local
run's agent (driver/local.py) calls `handle` when its agent raised.

`handle` asks the run monitor for its view of the run (a view it cannot get does not stop the
classification), classifies the failure (classifier.py), records the decision with the monitor,
and returns it: its `end` is the error that ends the run without a retry (None: the group is
started again, up to failure.max_failures times: Ray Train counts them, or the local agent's loop).
"""

from __future__ import annotations

import logging

import ray.train

from orchestrator import handles
from orchestrator.monitor.classifier import NO_VIEW, Classified, classify_failure

log = logging.getLogger("orchestrator.monitor.classifier")

# Seconds each call to the run monitor may take.
MONITOR_S = 10


def handle(monitor, worker_exceptions: dict[int, BaseException], hang_timeout_s: float) -> Classified:
    """The decision on one failure of the group, recorded with the run monitor."""
    try:
        view = handles.get(monitor.failure_context.remote(), timeout=MONITOR_S)
    except Exception:  # noqa: BLE001 - the classification still stands without the monitor's view
        view = NO_VIEW
    decision = classify_failure(worker_exceptions, view, hang_timeout_s)
    try:
        handles.get(monitor.push.remote(decision.event()), timeout=MONITOR_S)
    except Exception as exc:  # noqa: BLE001 - recording must not change the outcome
        log.warning("could not record the failure with the run monitor: %s", exc)
    return decision


class GroupFailureCallback(ray.train.UserCallback):
    """Runs on Ray Train's controller each time workers fail: ends the run at once when the training
    code itself raised, when an error came back at the same step after a restart, or when another
    driver took the run over (an exception raised in a callback is a controller error, which Ray
    Train does not retry)."""

    def __init__(self, monitor, hang_timeout_s: float):
        self.monitor = monitor
        self.hang_timeout_s = hang_timeout_s

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        decision = handle(self.monitor, worker_exceptions, self.hang_timeout_s)
        if decision.end is not None:
            raise decision.end
