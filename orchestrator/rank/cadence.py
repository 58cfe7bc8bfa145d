"""When to checkpoint: every N steps, every N seconds, and as soon as a node of the run is
announced to be preempted.

Step counts are equal on every rank, so step-based saves need no communication. Wall-clock and
preemption decisions belong to rank 0: clocks differ between ranks, and Ray tells each worker of
a coming preemption at a slightly different moment, while a save needs every rank at the same
step. Rank 0 therefore shares its decisions at *agreement steps* that every rank knows in
advance: at each one it broadcasts four numbers (a time-based save is due; a preemption is
coming; the step of the next agreement; the driver asked the run to stop), spacing agreements
about AGREEMENT_INTERVAL_S apart whatever the step time. That is one tiny broadcast a second
instead of one every step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from orchestrator.rank.collectives import broadcast_tensor
from orchestrator.spec import CheckpointSpec

log = logging.getLogger("orchestrator.worker")

# Seconds between agreement steps (the resolution of every_n_seconds and of preemption notices).
AGREEMENT_INTERVAL_S = 1.0
# At most this many steps between agreements, however fast the steps are.
MAX_STEPS_BETWEEN_AGREEMENTS = 100


class SaveCadence:
    def __init__(self, spec: CheckpointSpec, rank: int, world_size: int,
                 notice: Callable[[], object | None] = lambda: None,
                 stop_requested: Callable[[], bool] = lambda: False):
        self.spec = spec
        self.rank, self.world_size = rank, world_size
        self._notice = notice
        self._stop_requested = stop_requested
        self._last_save_time = time.monotonic()
        self._next_agreement: int | None = None  # None: the first step after (re)start agrees
        self._last_agreement = (0, time.monotonic())
        self._preemption_handled = False
        # The notice that triggered a preemption save (rank 0), for the driver's log.
        self.preemption: object | None = None

    def reason(self, step: int) -> str | None:
        """Why to save after `step`: "stop", "preemption", "steps", "seconds", or None.

        Every rank must call it after every optimizer step, with the same step numbers. "stop"
        (the driver asked the run to stop) means: save, then end training.
        """
        reason = "steps" if self.spec.every_n_steps and step % self.spec.every_n_steps == 0 else None
        if self._next_agreement is None or step >= self._next_agreement:
            seconds_due, preempted, stop = self._agree(step)
            if stop:
                return "stop"
            if preempted and not self._preemption_handled:
                self._preemption_handled = True
                return "preemption"
            if seconds_due:
                reason = reason or "seconds"
        return reason

    def saved(self) -> None:
        self._last_save_time = time.monotonic()

    def _agree(self, step: int) -> tuple[bool, bool, bool]:
        decision = torch.zeros(4, dtype=torch.int64)
        if self.rank == 0:
            now = time.monotonic()
            seconds = self.spec.every_n_seconds
            decision[0] = int(seconds is not None and now - self._last_save_time >= seconds)
            if self.spec.on_preemption and not self._preemption_handled:
                self.preemption = self._notice()
                decision[1] = int(self.preemption is not None)
            decision[2] = step + self._steps_to_next_agreement(step, now)
            decision[3] = int(self._stop_requested())
            self._last_agreement = (step, now)
        broadcast_tensor(decision)
        self._next_agreement = int(decision[2])
        return bool(decision[0]), bool(decision[1]), bool(decision[3])

    def _steps_to_next_agreement(self, step: int, now: float) -> int:
        if self._next_agreement is None:
            return 1  # the first agreement after a start: measure the step time until the next
        last_step, last_time = self._last_agreement
        step_time = max(now - last_time, 1e-6) / max(step - last_step, 1)
        # Capped, so that steps that slow down later (evaluation, a bigger batch) cannot push
        # the next agreement far away.
        return max(1, min(round(AGREEMENT_INTERVAL_S / step_time), MAX_STEPS_BETWEEN_AGREEMENTS))
