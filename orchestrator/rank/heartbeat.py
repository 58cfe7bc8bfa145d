"""A rank's heartbeat: what its training thread is doing, sent to the run monitor every second.

The training thread only sets a few attributes (`phase`, `stepped`): nothing on the hot path
talks to the monitor. A daemon thread sends them (through its agent: agent_link.py), with where
the training thread stands, and acts on the reply:
- the ranks are to end now (a stop whose grace ran out, the run taken over by another driver):
  this rank ends its own process with HANG_EXIT_CODE, which its agent takes as that order. The
  training thread may be blocked in a collective that would otherwise wait for half an hour,
  and a process that exits needs nobody's cooperation. (A hang verdict is not sent this way: the
  run monitor restarts every rank in place through their agents, monitor/attempts.py.);
- the driver asked the run to stop: `stop_requested` turns true, and the next step's agreement
  (`cadence.py`) takes a last checkpoint and ends training.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator

from orchestrator.failures import is_user_file
from orchestrator.protocol import Beat, Phase, RunWarning
from orchestrator.rank import build_lock
from orchestrator.rank.agent_contract import BEAT_FILE_VAR, HANG_EXIT_CODE, SECONDS, WORK_OFFSET

log = logging.getLogger("orchestrator.worker")

# Seconds between heartbeats.
HEARTBEAT_INTERVAL_S = 1.0
# Seconds a heartbeat may wait for the monitor's reply.
REPLY_TIMEOUT_S = 10.0
# What the training thread does (protocol.Phase), by the short names the harnesses use.
STARTING, TRAINING, CHECKPOINT, VALIDATION, EPOCH_END, FINISHING = (
    Phase.STARTING, Phase.TRAINING, Phase.CHECKPOINT, Phase.VALIDATION, Phase.EPOCH_END, Phase.FINISHING)
WORKING, FINISHED = Phase.WORKING, Phase.FINISHED


class Heartbeat:
    def __init__(self, monitor, attempt: int, rank: int, *, node_id: str = "",
                 flush_logs: Callable[[], None] = lambda: None, interval_s: float = HEARTBEAT_INTERVAL_S,
                 stale_lock_after_s: float = build_lock.STALE_AFTER_S):
        self.monitor, self.attempt, self.rank = monitor, attempt, rank
        self.node_id = node_id
        self.step = 0
        self.phase = STARTING
        self._since = time.monotonic()
        # Until this group's first optimizer step, training counts as starting: a first step
        # that compiles the model or autotunes kernels is legitimately long, on every restart.
        self._stepped_once = False
        self.stop_requested = False
        self._flush_logs = flush_logs
        self._interval_s = interval_s
        self._training_thread = threading.get_ident()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orchestrator-heartbeat", daemon=True)
        self._locks = build_lock.StaleLockWatch(stale_lock_after_s)
        beat_file = os.environ.get(BEAT_FILE_VAR)
        try:
            self._beat_fd = os.open(beat_file, os.O_RDONLY) if beat_file else None
        except OSError:
            self._beat_fd = None

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    # --- called by the training thread -------------------------------------------------------

    def stepped(self, step: int) -> None:
        """After every optimizer step: progress, and back in the timed phase."""
        self.step = step
        self.phase = TRAINING
        self._stepped_once = True
        self._since = time.monotonic()

    def enter(self, phase: str) -> None:
        if phase == TRAINING and not self._stepped_once:
            phase = STARTING
        self.phase = phase
        self._since = time.monotonic()

    @contextlib.contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """Mark a block as `phase` (not timed unless TRAINING), then resume the previous phase."""
        previous = self.phase
        self.enter(phase)
        try:
            yield
        finally:
            self.enter(previous)

    # --- the heartbeat thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.wait(self._interval_s):
            try:
                reply = self.monitor.beat(self.attempt, self._beat(), REPLY_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a missed beat is the watchdog's to judge, not ours
                continue
            if reply.stop:
                self.stop_requested = True
            if reply.abort and not self._closed.is_set():
                self._end_process(reply.abort)

    def _beat(self) -> Beat:
        idle = time.monotonic() - self._since
        return Beat(rank=self.rank, step=self.step, phase=self.phase, idle_s=idle, node_id=self.node_id,
                    pid=os.getpid(), frame=self._where(idle), work_s=self._own_work())

    def _own_work(self) -> float | None:
        """The median seconds of this rank's own work a step, as its bootstrap notes it in the beat
        file (rank/script/bootstrap.py); None where there is none or it is not known yet."""
        if self._beat_fd is None:
            return None
        try:
            (work,) = SECONDS.unpack(os.pread(self._beat_fd, SECONDS.size, WORK_OFFSET))
        except (OSError, struct.error):
            return None
        return work or None

    def _where(self, idle: float) -> str:
        """Where the training thread stands, once it has stood still a while: its innermost frame
        in the user's own code, and the innermost frame of all (`at train.py:88 in train_loop, in
        threading.py:355 wait`), with the lock it waits for if it is torch's build lock, which
        the run hears of once no build holds it (build_lock.py)."""
        frame = sys._current_frames().get(self._training_thread) if idle > 2 else None
        lock = build_lock.waited_on(frame)
        if self._locks.observe(lock, time.monotonic()):
            self._tell(RunWarning(message=build_lock.warning(lock, self.node_id, self._locks.stale_after_s)))
        if frame is None:
            return ""
        innermost, own = frame, None
        while frame is not None and own is None:
            if is_user_file(frame.f_code.co_filename):
                own = frame
            frame = frame.f_back
        parts = [_where(f) for f in (own, innermost) if f is not None]
        return "at " + ", in ".join(dict.fromkeys(parts)) + (f", waiting for torch's build lock {lock}" if lock else "")

    def _tell(self, warning: RunWarning) -> None:
        try:
            self.monitor.send(warning)
        except Exception:  # noqa: BLE001 - the rank's own log has it still
            pass
        log.warning("%s", warning.message)

    def _end_process(self, reason: str) -> None:
        log.error("ending rank %d now: %s (the newest committed checkpoint is kept)", self.rank, reason)
        self._flush_logs()
        os._exit(HANG_EXIT_CODE)


def _where(frame) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
