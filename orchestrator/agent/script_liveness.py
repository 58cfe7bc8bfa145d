"""How the agent speaks for a torchrun script's ranks, which know nothing of the run monitor: their
starts, a beat each second from what the bootstrap measures (optimizer steps, when the Python stack
last moved) and from the CPU time the rank's session uses, rank 0's progress and its end.

The hang watchdog judges an unmodified script by what it does, not by whether it steps an
optimizer (monitor/watchdog.py): a rank whose session uses CPU is alive though it takes no step.
"""

from __future__ import annotations

from orchestrator.agent import sessions
from orchestrator.agent.children import Child, LocalRanks, Placement, RankProgress
from orchestrator.agent.launcher import Liveness, RankSetting
from orchestrator.protocol import Beat, Event, Finished, RankStarted
from orchestrator.protocol import Progress as ProgressEvent
from orchestrator.rank.heartbeat import TRAINING, WORKING

# CPU seconds a rank's session must use within one heartbeat to count as alive by its CPU: more
# than the clock ticks the bootstrap's own look at the stack can add (1 tick = 10 ms).
CPU_ALIVE_S = 0.02
# Seconds between progress events to the driver.
PROGRESS_S = 2.0


class ScriptLiveness(Liveness):
    def __init__(self, setting: RankSetting):
        self.node_id, self.hostname = setting.group.node_id, setting.hostname
        # Per session: its CPU seconds now (`look`); per rank: at its last beat, and when they last grew.
        self._used: dict[int, float] = {}
        self._cpu: dict[int, tuple[float, float]] = {}
        self._progress_at = 0.0
        self._first_step_seen, self._last_progress_step = False, 0

    def new_attempt(self) -> None:
        self._cpu.clear()
        self._first_step_seen, self._last_progress_step = False, 0

    def started(self, ranks: LocalRanks, placement: Placement, in_place: bool) -> list[Event]:
        """One event per rank: the driver's "N workers up" line, summary.json's workers, failure places."""
        return [RankStarted(rank=child.rank, world_size=placement.world_size, attempt=placement.attempt,
                            node_id=self.node_id, hostname=self.hostname, pid=child.process.pid, in_place=in_place)
                for child in ranks.children]

    def look(self, ranks: LocalRanks) -> None:
        self._used = sessions.cpu_seconds(ranks.sessions)

    def beat(self, child: Child, progress: RankProgress, now: float) -> Beat:
        used = self._used.get(child.process.pid, 0.0)
        before, alive_at = self._cpu.get(child.rank, (used, now - progress.idle_s))
        if used - before >= CPU_ALIVE_S:
            alive_at = now
        self._cpu[child.rank] = (used, alive_at)
        active_idle = min(progress.idle_s, progress.stack_idle_s, now - alive_at)
        return Beat(rank=child.rank, step=progress.steps, phase=TRAINING if progress.steps else WORKING,
                    idle_s=progress.idle_s, node_id=self.node_id, pid=child.process.pid,
                    stack_idle_s=progress.stack_idle_s, active_idle_s=active_idle, work_s=progress.work_s or None)

    def finished_step(self, child: Child, progress: RankProgress) -> int:
        return progress.steps

    def progress(self, ranks: LocalRanks, attempt: int, now: float) -> ProgressEvent | None:
        """Every PROGRESS_S, and at each beat until rank 0's first step is seen."""
        if now - self._progress_at < PROGRESS_S and self._first_step_seen:
            return None
        self._progress_at = now
        progress = ranks.children[0].progress()
        steps = progress.steps
        if not steps or steps == self._last_progress_step:
            return None
        self._last_progress_step = steps
        first = not self._first_step_seen
        self._first_step_seen = True
        # step_time_s: the median time between rank 0's consecutive optimizer steps, as the
        # bootstrap timed them (goodput counts the steps by it).
        return ProgressEvent(step=steps, batch_in_epoch=1, attempt=attempt, first_step=first, script=True,
                             step_time_s=progress.step_time_s or None)

    def finished(self, ranks: LocalRanks, attempt: int, stopped: bool) -> Finished:
        progress = ranks.children[0].progress()
        return Finished(attempt=attempt, stopped=stopped, step=progress.steps, step_time_s=progress.step_time_s or None)
