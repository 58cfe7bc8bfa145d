"""The in-place restarts of a torchrun script's ranks, decided in the run monitor.

Each node's supervisor (runtime/script/supervisor.py) runs its K ranks as children. A round is one
generation of children across all nodes. When a child dies or fails, its supervisor reports it
here; every supervisor polls for the round's verdict:

- fail: a rank's own code failed (a user error), or the restarts are used up. A peer that only saw
  the failed rank go (a communication error) is the consequence, not the cause: any user error
  reported within SETTLE_S of the round's first failure decides the verdict.
- restart: an infrastructure failure (a signal death, an OOM kill, a lost peer), a hang verdict,
  or a script's own exit with a non-zero status (`sys.exit(N)`: restarted, as torchrun does).
  Every supervisor stops its children and starts the next round's, in the same Ray Train workers,
  with TORCHELASTIC_RESTART_COUNT one higher. A lost worker or node is not seen here: Ray Train
  restarts the whole group for it, and that restart counts against the same budget.
- finish: every node's children exited 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Seconds the monitor waits, after the first failure of a round that could be a consequence (a
# communication error), for a peer's report that could be its cause (a user error).
SETTLE_S = 1.0
RESTART, FAIL, FINISH, WAIT = "restart", "fail", "finish", "wait"


@dataclass
class InPlaceRounds:
    # failure.max_failures: restarts of either kind before the run fails (-1: unlimited).
    max_restarts: int
    # Restarts so far, in place and of the whole group: the children's TORCHELASTIC_RESTART_COUNT.
    restarts: int = 0
    group: int = 0
    workers: int = 0
    round: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    first_failure: float | None = None
    decisive: bool = False
    done: set[int] = field(default_factory=set)
    # Per (group, round): the verdict once reached.
    verdicts: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    @property
    def exhausted(self) -> bool:
        return 0 <= self.max_restarts <= self.restarts

    def new_group(self, group: int, workers: int) -> None:
        """A (re)start of Ray Train's worker group: a group restart counts as a restart too."""
        if self.group:
            self.restarts += 1
        self.group, self.workers, self.round = group, workers, 0
        self._new_round()

    def state(self) -> dict[str, Any]:
        return {"group": self.group, "round": self.round, "restarts": self.restarts,
                "max_restarts": self.max_restarts}

    def report(self, group: int, round_: int, worker: int, outcome: dict[str, Any], now: float) -> None:
        """A node's children ended: outcome {"ok": True} or a failure record (kind user|infrastructure|hang)."""
        if (group, round_) != (self.group, self.round) or (group, round_) in self.verdicts:
            return  # a late report of a round already decided
        if outcome.get("ok"):
            self.done.add(worker)
            return
        self.failures.append(outcome)
        if self.first_failure is None:
            self.first_failure = now
        # A signal death or a hang has no cause to wait for; a communication error may be a peer's bug.
        self.decisive = self.decisive or outcome.get("decisive", False)

    def verdict(self, group: int, round_: int, now: float) -> dict[str, Any]:
        decided = self.verdicts.get((group, round_))
        if decided is not None or (group, round_) != (self.group, self.round):
            return decided or {"action": FAIL, "reason": "this worker group was replaced"}
        if self.failures:
            users = [f for f in self.failures if f.get("kind") == "user"]
            if users:
                return self._decide({"action": FAIL, "failure": min(users, key=lambda f: f["rank"])})
            if not self.decisive and now - self.first_failure < SETTLE_S:
                return {"action": WAIT}
            # A signal death or a hang first; then a rank that exited on its own (sys.exit), whose
            # peers' communication errors follow from it; then the lowest rank.
            cause = min(self.failures, key=lambda f: (not f.get("decisive"), f.get("kind") != "exit", f["rank"]))
            if self.exhausted:
                return self._decide({"action": FAIL, "failure": cause, "exhausted": True})
            self.restarts += 1
            decided = self._decide({"action": RESTART, "failure": cause, "failures": list(self.failures),
                                    "restarts": self.restarts})
            self.round += 1
            self._new_round()
            return decided
        if len(self.done) >= self.workers:
            return self._decide({"action": FINISH})
        return {"action": WAIT}

    def _decide(self, verdict: dict[str, Any]) -> dict[str, Any]:
        self.verdicts[(self.group, self.round)] = verdict
        return verdict

    def _new_round(self) -> None:
        self.failures, self.first_failure, self.decisive = [], None, False
        self.done = set()
