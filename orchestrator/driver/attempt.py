"""One run of the worker group, watched from the driver: `fit()` on a thread of its own, live
progress (console.py), stop signals and their grace (signals.py), the lease lost to another
driver, and the result with its goodput. The same for a Ray Train trainer and for a local run's
agent (local.py): the run monitor is reached the same way (handles.py).
"""

from __future__ import annotations

import os
import socket
import threading
import time

from orchestrator import handles
from orchestrator.checkpoint.lease import RunLease
from orchestrator.driver import resume
from orchestrator.driver.console import Console, RunWatcher, describe_failure
from orchestrator.driver.signals import StopSignals
from orchestrator.observe import history
from orchestrator.observe.goodput import compute as compute_goodput
from orchestrator.observe.metrics import RunMetrics
from orchestrator.observe.result import TAKEN_OVER, RunResult, write_summary
from orchestrator.spec import JobSpec

# Seconds the driver waits for ended workers to be torn down after a stop's grace period.
ABORT_WAIT_S = 15.0
# Seconds between the driver's asks whether a rank was sent SIGTERM (driver/signals.py `adopt`).
RANK_SIGNAL_POLL_S = 0.5


class Attempt:
    """One `trainer.fit()` watched from the driver: progress lines, stop signals, the result."""

    def __init__(self, job: JobSpec, run_dir, choice: resume.ResumeChoice, monitor, say: Console, started: float,
                 run_lease: RunLease, finished_grace_s: float | None = None):
        self.job, self.run_dir, self.choice, self.monitor, self.say = job, run_dir, choice, monitor, say
        self.started = started
        # Its `lost` is set (and on_lost called) by the lease's heartbeat once another driver took the run over.
        self.run_lease = run_lease
        # Stop waiting for trainer.fit() this long after rank 0 reported the end (checkpoints
        # committed): what is left is Ray Train's teardown, which the caller's exit makes moot.
        self.finished_grace_s = finished_grace_s
        self.watcher = RunWatcher(monitor, job, say, RunMetrics(job.name, started),
                                  on_ray=not isinstance(monitor, handles.InProcess))
        self.signals = StopSignals(on_stop=self._request_stop)

    def fit(self, trainer) -> tuple[RunResult, BaseException | None]:
        self.watcher.start()
        try:
            with self.signals.installed():
                error = self._fit(trainer)
        finally:
            self.watcher.stop()
        stopped_by = self.signals.stopped_by(error)
        result = self.result(error, stopped_by)
        if error is not None and not stopped_by:
            result.error = describe_failure(self.job, error, self.run_dir, result, self.watcher)
        return result, error

    def _fit(self, trainer) -> BaseException | None:
        """trainer.fit() on a thread of its own, so that this (main) thread keeps its signal handling.

        A stop request gives the workers until the grace period's end to checkpoint and finish;
        then they are ended (the run monitor tells them); a second signal stops waiting at once.
        """
        outcome: dict[str, BaseException | None] = {"error": None}

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as exc:  # noqa: BLE001 - reported by the caller, with the worker's own message
                outcome["error"] = exc

        thread = threading.Thread(target=fit, name="trainer-fit", daemon=True)
        thread.start()
        aborting_since = None
        summarized = stop_recorded = False
        finished_since = None
        rank_signal_asked = 0.0
        while thread.is_alive():
            thread.join(timeout=0.2)
            if time.monotonic() - rank_signal_asked >= RANK_SIGNAL_POLL_S and self.run_lease.lost is None:
                rank_signal_asked = time.monotonic()
                self._take_rank_signal()
            if self.finished_grace_s is not None and not self.signals.received and thread.is_alive():
                if finished_since is None and self._finished():
                    finished_since = time.monotonic()
                if finished_since is not None and time.monotonic() - finished_since > self.finished_grace_s:
                    return None
            if self.run_lease.lost is not None and aborting_since is None:
                # Another driver holds the run now: end this one's workers at once, with no restart
                # (their commits are fenced off already), rather than at their next checkpoint.
                self.monitor.take_over.remote(str(self.run_lease.lost))
                aborting_since = time.monotonic()
            if self.signals.received and not summarized and self.run_lease.lost is None:
                summarized = True
                self._write_partial_summary()  # the sender may kill this process before the workers are done
            if summarized and not stop_recorded and self._stop_committed():
                # Rank 0 committed the stop checkpoint and ended: the summary is final now, before
                # Ray Train's teardown (~1 s), which `ray job stop`'s SIGKILL may cut short.
                stop_recorded = True
                self._write_partial_summary()
            left = self.signals.grace_left()
            if left is not None and left <= 0 and aborting_since is None:
                if not stop_recorded:  # (else the workers are done: only Ray Train's teardown is left)
                    self.say("the stop's grace period ran out: ending the workers (the newest committed "
                             "checkpoint is kept)")
                self.monitor.abort.remote("the run was stopped and its grace period ran out")
                aborting_since = time.monotonic()
            if self.signals.immediate or (aborting_since and time.monotonic() - aborting_since > ABORT_WAIT_S):
                return outcome["error"] or RuntimeError("stopped before the workers finished")
        return outcome["error"]

    def _finished(self) -> bool:
        try:
            return bool(handles.get(self.monitor.ended.remote(), timeout=5))
        except Exception:  # noqa: BLE001 - then wait for fit() as usual
            return False

    def _stop_committed(self) -> bool:
        """Whether rank 0 reported the end of a stopped run (its stop checkpoint committed)."""
        try:
            return handles.get(self.monitor.finished.remote(stopped=True), timeout=5)
        except Exception:  # noqa: BLE001 - then the summary is written when fit() returns
            return False

    def _take_rank_signal(self) -> None:
        """A rank sent SIGTERM from outside, as its agent told the run monitor: this driver's own stop."""
        try:
            signalled = handles.get(self.monitor.rank_signal.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - asked again at the next poll
            return
        if signalled is not None:
            self.signals.adopt(*signalled)

    def _request_stop(self, deadline_monotonic: float, by: str = "") -> None:
        grace = max(0.0, deadline_monotonic - time.monotonic())
        sent = f"{by}, which stops the run as a SIGTERM to this command does: " if by else ""
        self.say(f"stop requested: {sent}the workers checkpoint at the next step and stop (grace {grace:.1f} s; "
                 "signal again to stop at once)")
        self.monitor.request_stop.remote(time.time() + grace)

    def result(self, error: BaseException | None, stopped_by: str | None) -> RunResult:
        ended = time.time()
        events = handles.get(self.monitor.events_since.remote(0), timeout=30)
        last_steps = handles.get(self.monitor.last_steps.remote(), timeout=30)
        stragglers = handles.get(self.monitor.stragglers.remote(), timeout=30)
        goodput = compute_goodput(events, started=self.started, ended=ended,
                                  capacity_waits=self.watcher.capacity_waits(), last_steps=last_steps,
                                  straggler_wait_s=stragglers.wait_s)
        return RunResult.from_events(self.job, self.run_dir, events, self.choice, wall_seconds=ended - self.started,
                                     error=error, stopped_by=stopped_by, goodput=goodput, slowest=stragglers.slowest)

    def _write_partial_summary(self) -> None:
        """At a stop signal: summary.json and the history as things stand, in case the driver is
        killed before the end."""
        try:
            result = self.result(None, self.signals.received)
            write_summary(self.run_dir, result)
            self.save_history(result)
        except Exception:  # noqa: BLE001 - the final summary is written again at the end
            pass

    def save_history(self, result: RunResult) -> None:
        """This driver's part of the run for `orchestrator report` (observe/history.py); a storage
        that cannot take it costs the report its part, never the run."""
        if result.status == TAKEN_OVER:
            return  # the run directory is the newer driver's
        try:
            events = handles.get(self.monitor.events_since.remote(0), timeout=30)
            series = handles.get(self.monitor.step_series.remote(), timeout=30)
            history.write(self.run_dir, history.record(
                started=self.started, ended=time.time(), host=socket.gethostname(), pid=os.getpid(),
                status=result.status, error=result.error, goodput=result.goodput, events=events, step_series=series))
        except Exception as exc:  # noqa: BLE001 - see above
            self.say(f"warning: the run's history file could not be written ({exc}): `orchestrator report` "
                     "will miss this driver's part")
