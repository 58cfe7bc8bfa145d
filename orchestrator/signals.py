"""How a driver is stopped from outside: Ctrl-C, `ray job stop`, a scheduler's SIGTERM.

The first SIGINT or SIGTERM asks the run to stop gracefully: the workers take a last checkpoint
at the next step they agree on, commit it, and end (see `cadence.py`). The grace period is what
the sender allows before it kills the driver: for `ray job stop`, `RAY_JOB_STOP_WAIT_TIME_S`
(3 s by Ray's default) less a margin for writing summary.json; for Ctrl-C, DEFAULT_GRACE_S.
`ORCHESTRATOR_STOP_GRACE_S` sets it for both. When the grace runs out, or at a second signal,
the driver stops waiting and the workers are ended: nothing already committed is touched, and
the next run resumes from the newest committed checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

GRACE_ENV_VAR = "ORCHESTRATOR_STOP_GRACE_S"
# Seconds a Ctrl-C leaves the workers to checkpoint and stop (a second Ctrl-C stops at once).
DEFAULT_GRACE_S = 30.0
# Seconds kept back from `ray job stop`'s wait for summary.json and shutting down.
JOB_STOP_MARGIN_S = 2.0

EXIT_CODES = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}


def grace_seconds(signal_name: str) -> float:
    if GRACE_ENV_VAR in os.environ:
        return max(0.0, float(os.environ[GRACE_ENV_VAR]))
    job_wait = os.environ.get("RAY_JOB_STOP_WAIT_TIME_S")
    # A driver started by `ray job submit` has its job config in the environment.
    if signal_name == "SIGTERM" and (job_wait or os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")):
        return max(0.0, float(job_wait or 3) - JOB_STOP_MARGIN_S)
    return DEFAULT_GRACE_S


class StopSignals:
    """Turns SIGINT and SIGTERM into a stop request with a deadline; a second one means now.

    `on_stop(deadline)` is called (in the main thread) at the first signal.
    """

    def __init__(self, on_stop: Callable[[float], None] = lambda deadline: None) -> None:
        self.received: str | None = None
        self.deadline: float | None = None
        self.immediate = False
        self._on_stop = on_stop

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        # Python delivers signals to the main thread only; a driver run from another thread
        # (a notebook's worker thread, a test) keeps the process's own handling.
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            self.immediate = True
            return
        self.received = name
        self.deadline = time.monotonic() + grace_seconds(name)
        self._on_stop(self.deadline)

    def grace_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def stopped_by(self, error: BaseException | None) -> str | None:
        """The signal that ended the run, or None if it ended on its own (finished or failed)."""
        if self.received:
            return self.received
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            return "SIGINT"
        return None
