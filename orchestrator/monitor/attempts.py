"""The in-place restarts of every rank (a torchrun script's, a ctx or Lightning job's), decided in the run monitor.

Each node's supervisor (agent/supervisor.py) runs its K ranks as children. An attempt
(protocol.py) is one start of the children across all nodes. When a child dies or fails, its
supervisor reports it here; every supervisor polls for the attempt's verdict:

- fail: a rank's own code failed (a user error), or the restarts are used up. A peer that only saw
  the failed rank go (a communication error) is the consequence, not the cause: any user error
  reported within SETTLE_S of the attempt's first failure decides the verdict.
- restart: an infrastructure failure (a signal death, an OOM kill, a lost peer), a hang verdict,
  or a script's own exit with a non-zero status (`sys.exit(N)`: restarted, as torchrun does).
  Every supervisor stops its children and starts the next attempt's, in the same Ray Train workers,
  with TORCHELASTIC_RESTART_COUNT one higher. A lost worker or node is not seen here: Ray Train
  restarts the whole group for it, and that restart counts against the same budget.
- finish: every node's children exited 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from orchestrator.failures import TAKEN_OVER, USER, FailureRecord, mark_repeats
from orchestrator.protocol import FAIL, FINISH, RESTART, WAIT, AttemptState, Verdict, cause_order

# Seconds the monitor waits, after the first failure of an attempt that could be a consequence (a
# communication error), for a peer's report that could be its cause (a user error).
SETTLE_S = 1.0


@dataclass
class InPlaceAttempts:
    # failure.max_failures: restarts of either kind before the run fails (-1: unlimited).
    max_restarts: int
    # The attempt running now (protocol.py): 1 for the first start of the ranks, one more for
    # every restart, in place or of the whole group. 0 before the first.
    attempt: int = 0
    workers: int = 0
    failures: list[FailureRecord] = field(default_factory=list)
    first_failure: float | None = None
    decisive: bool = False
    done: set[int] = field(default_factory=set)
    # Per attempt: the verdict once reached.
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    # Every failure reported in this run, for errors a restart brings back at the same step.
    history: list[FailureRecord] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        """Restarts so far, in place and of the whole group: the ranks' TORCHELASTIC_RESTART_COUNT."""
        return max(0, self.attempt - 1)

    @property
    def exhausted(self) -> bool:
        return 0 <= self.max_restarts <= self.restarts

    def new_group(self, workers: int) -> int:
        """A (re)start of Ray Train's worker group, `workers` agents: the next attempt (a group
        restart counts as a restart too)."""
        self.attempt += 1
        self.workers = workers
        self._new_attempt()
        return self.attempt

    def state(self, latest_uri: str | None = None) -> AttemptState:
        return AttemptState(self.attempt, self.restarts, self.max_restarts, latest_uri)

    def report(self, attempt: int, worker: int, failure: FailureRecord | None, now: float) -> None:
        """A node's children ended: every one exited 0 (`failure` None), or one failed, its record."""
        if attempt != self.attempt or attempt in self.verdicts:
            return  # a late report of an attempt already decided
        if failure is None:
            self.done.add(worker)
            return
        failure = _marked_if_repeated(failure, self.history)
        self.history.append(failure)
        self.failures.append(failure)
        if self.first_failure is None:
            self.first_failure = now
        # A signal death or a hang has no cause to wait for; a communication error may be a peer's bug.
        self.decisive = self.decisive or failure.decisive

    def verdict(self, attempt: int, now: float) -> Verdict:
        decided = self.verdicts.get(attempt)
        if decided is not None or attempt != self.attempt:
            return decided or Verdict(FAIL, reason="this worker group was replaced")
        if self.failures:
            # Not restarted: another driver holds the run now (a rank's commit found the lease
            # gone), or a rank's own code failed.
            final = [f for f in self.failures if f.kind == TAKEN_OVER] or [f for f in self.failures if f.kind == USER]
            if final:
                return self._decide(Verdict(FAIL, failure=min(final, key=lambda f: f.rank)))
            if not self.decisive and now - self.first_failure < SETTLE_S:
                return Verdict(WAIT)
            cause = min(self.failures, key=cause_order)
            if self.exhausted:
                return self._decide(Verdict(FAIL, failure=cause, exhausted=True))
            decided = self._decide(Verdict(RESTART, failure=cause, attempt=self.attempt + 1,
                                           restarts=self.restarts + 1))
            self.attempt += 1
            self._new_attempt()
            return decided
        if len(self.done) >= self.workers:
            return self._decide(Verdict(FINISH))
        return Verdict(WAIT)

    def _decide(self, verdict: Verdict) -> Verdict:
        self.verdicts[self.attempt] = verdict
        return verdict

    def _new_attempt(self) -> None:
        self.failures, self.first_failure, self.decisive = [], None, False
        self.done = set()


def _marked_if_repeated(failure: FailureRecord, earlier: list[FailureRecord]) -> FailureRecord:
    """The failure as the user's when an earlier attempt raised the same error at the same step
    (failures.mark_repeats: exact resume replayed the same batch into it), else unchanged."""
    record = dataclasses.replace(failure)
    mark_repeats([record], earlier)
    if not record.repeated:
        return failure
    record.decisive = True
    return record
