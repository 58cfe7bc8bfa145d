"""Spares: the next attempt's rank processes of a ctx or Lightning job, started ahead of need.

A restart in place spends most of its seconds in the new ranks' start: Python, torch, Lightning
and the harness imported before a rank joins the process group. So once every rank of an attempt
beats itself (its imports and its process group done: a spare takes no core they need to start),
the agent starts one spare a rank (bootstrap.py --spare), which imports those modules and waits.
A restart hands each spare its rank's new environment (children.py); a rank with no spare alive
is started afresh. Spares not handed an attempt end with the agent's ranks. A local run's command
starts its first attempt's ranks as spares too, before it imports the job's code itself
(driver/local.py `first_spares`).

Their cost: each spare holds the imported modules (its own resident memory, much of it shared
libraries it shares with its rank) and takes a few CPU-seconds once an attempt. A torchrun script
gets none: importing torch before the script runs would change what the script sees (a script may
set variables before its imports).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from orchestrator.agent import sessions
from orchestrator.agent.children import BOOTSTRAP, LocalRanks
from orchestrator.agent.flight_records import FR_SIGNAL
from orchestrator.rank.agent_contract import FR_SIGNAL_VAR

# What a spare imports, by the job's kind: what every rank of that kind imports first.
SPARE_MODULES = {
    # (rank_main itself is not: it runs as __main__, and runpy warns of a module imported twice.)
    "torch": ("torch", "orchestrator.rank.torch.loop", "orchestrator.rank.session"),
    "lightning": ("torch", "lightning.pytorch", "orchestrator.rank.lightning.fit", "orchestrator.rank.session"),
}
# Seconds spares are given to end once they are not needed (they wait on their stdin, doing nothing).
END_GRACE_S = 0.5


class Spares:
    """One spare process a local rank, for the next attempt of this agent's ranks."""

    def __init__(self, kind: str, command: list[str], cwd: str, first: bool = False):
        self.modules, self.command, self.cwd = ",".join(SPARE_MODULES[kind]), command, cwd
        # A local run's first ranks (bootstrap.py --first): humble as processes, not as sessions;
        # the spares of its later attempts are a next attempt's like any other (`take`).
        self.flag = "--first" if first else "--spare"
        self._ready: dict[int, subprocess.Popen] = {}  # local rank -> its spare
        self._attempt_seen = 0

    def start_when_settled(self, ranks: LocalRanks, attempt: int, beats_itself: Callable[[int], bool]) -> bool:
        """Start this attempt's spares, once, when each of its ranks beats itself. True when they
        were started now."""
        if attempt == self._attempt_seen or not all(beats_itself(c.rank) for c in ranks.children):
            return False
        self._attempt_seen = attempt
        for child in ranks.children:
            # The rank's own environment: what a spare imports sees what the rank would
            # (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES); the attempt's values come at the handover.
            self.start(child.local_rank, child.env)
        return True

    def start(self, local_rank: int, env: dict[str, str]) -> None:
        """A spare for `local_rank`, importing under `env`, unless one waits already."""
        if local_rank not in self._ready:
            # The flight recorder's signal is known from the start (a local run's first ranks start
            # before their attempt's environment is): blocked before the imports start a thread,
            # or it would end the rank at a hang verdict instead of bringing its record.
            env = {**env, FR_SIGNAL_VAR: str(int(FR_SIGNAL))}
            self._ready[local_rank] = subprocess.Popen(
                [sys.executable, BOOTSTRAP, self.flag, self.modules, *self.command], cwd=self.cwd, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def take(self) -> dict[int, subprocess.Popen]:
        """The spares still alive, handed to the next attempt (and no longer this object's)."""
        ready, self._ready = self._ready, {}
        self.flag = "--spare"  # from now on, whoever started the first: a next attempt's, humble as a session too
        for process in [p for p in ready.values() if p.poll() is not None]:
            process.stdout.close()
        return {rank: p for rank, p in ready.items() if p.returncode is None}

    @property
    def pids(self) -> set[int]:
        """Each spare's pid, which is its session's id."""
        return {p.pid for p in self._ready.values()}

    def close(self) -> None:
        sessions.end_sessions(self.pids, END_GRACE_S)
        for process in self._ready.values():
            process.wait()
            process.stdout.close()
        self._ready = {}
