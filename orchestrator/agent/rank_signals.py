"""A ctx or Lightning rank sent SIGTERM from outside (rank/stop_signal.py marks it beside its
failure file), passed on to the run monitor: the run's stop, which the driver takes as a SIGTERM of
its own (driver/attempt.py), and a second one its "stop at once". Looked for at every look at the
children (supervisor.py), while they run: the agent's own SIGTERM, which ends them, is not marked.
"""

from __future__ import annotations

import os

from orchestrator.rank.agent_contract import STOP_AGAIN_SUFFIX, STOP_SUFFIX


class RankSignals:
    def __init__(self, monitor):
        self.monitor = monitor
        # (attempt, rank, again) told the monitor already.
        self._told: set[tuple[int, int, bool]] = set()

    def pass_on(self, attempt: int, children) -> None:
        for child in children:
            again = (attempt, child.rank, False) in self._told
            if (attempt, child.rank, again) in self._told:
                continue
            if os.path.exists(child.failure_file + (STOP_AGAIN_SUFFIX if again else STOP_SUFFIX)):
                self._told.add((attempt, child.rank, again))
                self.monitor.rank_signalled.remote(f"rank {child.rank} was sent SIGTERM", again)
