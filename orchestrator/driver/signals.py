"""How a driver is stopped from outside: Ctrl-C, `ray job stop`, a scheduler's SIGTERM.

The first SIGINT or SIGTERM asks the run to stop gracefully: the workers take a last checkpoint
at the next step they agree on, commit it, and end (see `cadence.py`). The grace period is what
the sender allows before it kills the driver: for `ray job stop`, `RAY_JOB_STOP_WAIT_TIME_S`
(3 s by Ray's default) less JOB_STOP_MARGIN_S for the driver's own end; for Ctrl-C,
DEFAULT_GRACE_S. `ORCHESTRATOR_STOP_GRACE_S` sets it for both. When the grace runs out, or at a
second signal, the driver stops waiting and the workers are ended: nothing already committed is
touched, and the next run resumes from the newest committed checkpoint.

A SIGTERM sent to a ctx or Lightning rank rather than to the driver (Slurm's time limit and
`scancel`, systemd's stop and earlyoom signal every process of the job) is the same stop: the
rank passes it on (rank/stop_signal.py, through its agent and the run monitor) and the driver
takes it as a SIGTERM of its own (`adopt`), with its grace and its exit status, 143. Sent to the
ranks and the driver both, it is one stop, not two; a second one, to either, stops at once.

`ray job stop` in Ray 2.60 (dashboard/modules/job/job_supervisor.py): the job's supervisor sends
SIGTERM to the driver and every process under it, waits `int(RAY_JOB_STOP_WAIT_TIME_S)` seconds
(read from its own environment: the head's, or the job's runtime_env env_vars, which the driver
inherits too) for them to exit, then SIGKILLs them. A value that is not a whole number makes that
int() fail: the supervisor marks the job failed and exits, and its watcher SIGKILLs the driver
within a second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from orchestrator.storage import in_ray_job

GRACE_ENV_VAR = "ORCHESTRATOR_STOP_GRACE_S"
JOB_STOP_WAIT_ENV_VAR = "RAY_JOB_STOP_WAIT_TIME_S"
# Seconds a Ctrl-C leaves the workers to checkpoint and stop (a second Ctrl-C stops at once).
DEFAULT_GRACE_S = 30.0
# Ray's own default for RAY_JOB_STOP_WAIT_TIME_S.
RAY_DEFAULT_JOB_STOP_WAIT_S = 3
# Seconds kept back from `ray job stop`'s wait for the driver's own end. Measured (2 workers, 2
# CPUs): from rank 0's report that the stop checkpoint is committed to summary.json written,
# 0.03-0.26 s when the driver writes it at that report (it polls its run monitor every 0.2 s),
# then 0.3-0.6 s to leave Ray and exit; what comes after the summary (Ray Train's teardown,
# leaving Ray) may be cut short by the SIGKILL without losing anything: the checkpoint is
# committed and the next run resumes from it.
JOB_STOP_MARGIN_S = 0.5
# The workers need about 2 s to act on a stop (a heartbeat reply, then the next step they agree
# on, ~1 s each) before the save itself; a shorter wait than this is worth a note at start.
SHORT_JOB_STOP_WAIT_S = 10

EXIT_CODES = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}


def job_stop_wait_s() -> int | None:
    """Seconds `ray job stop` waits between SIGTERM and SIGKILL, as Ray's supervisor reads it;
    None when the value is not a whole number (the supervisor then kills the driver at once)."""
    try:
        return int(os.environ.get(JOB_STOP_WAIT_ENV_VAR, RAY_DEFAULT_JOB_STOP_WAIT_S))
    except ValueError:
        return None


def grace_seconds(signal_name: str) -> float:
    if GRACE_ENV_VAR in os.environ:
        return max(0.0, float(os.environ[GRACE_ENV_VAR]))
    # A driver started by `ray job submit` has its job config in the environment.
    if signal_name == "SIGTERM" and (JOB_STOP_WAIT_ENV_VAR in os.environ or in_ray_job()):
        wait = job_stop_wait_s()
        return 0.0 if wait is None else max(0.0, wait - JOB_STOP_MARGIN_S)
    return DEFAULT_GRACE_S


def job_stop_note() -> str | None:
    """For the driver of a Ray job whose `ray job stop` leaves little time for a last checkpoint:
    one line on what it leaves and how to give more (None otherwise)."""
    if not in_ray_job():
        return None
    how = ("submit with --runtime-env-json '{\"env_vars\": {\"RAY_JOB_STOP_WAIT_TIME_S\": \"60\"}}' (or set it "
           "in the environment of `ray start --head`)")
    raw = os.environ.get(JOB_STOP_WAIT_ENV_VAR)
    wait = job_stop_wait_s()
    if wait is None:
        return (f"warning: {JOB_STOP_WAIT_ENV_VAR}={raw!r} is not a whole number of seconds: Ray's job supervisor "
                "reads it with int(), so `ray job stop` fails and this driver is killed at once, without a last "
                f"checkpoint. Fix: a whole number of seconds; {how}.")
    if wait >= SHORT_JOB_STOP_WAIT_S:
        return None
    source = "Ray's default" if raw is None else "set"
    return (f"note: `ray job stop` kills this driver {wait} s after its SIGTERM ({JOB_STOP_WAIT_ENV_VAR}, "
            f"{source}); the workers get {grace_seconds('SIGTERM'):g} s of it to agree on a step (about 2 s) and "
            f"commit a last checkpoint. If a checkpoint takes longer to save, {how}; otherwise the run resumes "
            "from the newest checkpoint committed before the stop.")


class StopSignals:
    """Turns SIGINT and SIGTERM into a stop request with a deadline; a second one means now.

    `on_stop(deadline, by)` is called (in the main thread) at the first signal: `by` names the
    rank it was sent to, or is "" for this process's own.
    """

    def __init__(self, on_stop: Callable[[float, str], None] = lambda deadline, by: None) -> None:
        self.received: str | None = None
        self.deadline: float | None = None
        self.immediate = False
        self._on_stop = on_stop
        # Whether the stop under way is a rank's (`adopt`), not yet followed by this process's own signal.
        self._adopted = False

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
            # The scheduler's SIGTERM reached a rank first, then this process: the same stop.
            self.immediate = self.immediate or not self._adopted
            self._adopted = False
            return
        self.received = name
        self.deadline = time.monotonic() + grace_seconds(name)
        self._on_stop(self.deadline, "")

    def adopt(self, by: str, again: bool = False, name: str = "SIGTERM") -> None:
        """The stop a rank was sent (`by` names it), taken as this process's own first `name`;
        `again`: the rank was sent a second one, which stops at once, as a second signal here does."""
        if self.received is None:
            self.received, self._adopted = name, True
            self.deadline = time.monotonic() + grace_seconds(name)
            self._on_stop(self.deadline, by)
        self.immediate = self.immediate or again

    def grace_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def stopped_by(self, error: BaseException | None) -> str | None:
        """The signal that ended the run, or None if it ended on its own (finished or failed)."""
        if self.received:
            return self.received
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            return "SIGINT"
        return None
