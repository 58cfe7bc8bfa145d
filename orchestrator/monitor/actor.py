"""The run monitor: a small actor owned by the driver that workers tell what is happening.

Ranks and agents push events (protocol.py: a rank started, progress, a checkpoint committed,
finished...) with fire-and-forget calls; the driver polls them to print live progress and to write
summary.json.
The actor outlives worker-group restarts, so it is also where
- each start of the ranks is numbered (an attempt), and the newest checkpoint committed during this
  run is remembered: rank 0 of a new group asks it which checkpoint the group resumes from;
- the workers' heartbeats arrive, and the hang watchdog (`watchdog.py`) judges them; its
  verdict goes back to every worker of the group in the reply to its next heartbeat; the same
  beats name a straggler (`stragglers.py`);
- the driver's stop request (Ctrl-C, SIGTERM, `ray job stop`) waits for the workers to see it.

Every duration it judges (a rank's silence, a failure's settling, a straggler's spell) is timed on
time.monotonic(), which a step of the wall clock (NTP, a resumed VM) does not move; the wall clock
only stamps what is written down (an event's time, the steps' time line, goodput's last steps).

A script's rank-0 output is not an event: it waits in a bounded buffer until the driver takes it
(`take_output`), so that a script printing for a day costs the monitor and the driver no memory.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.failures import HANG, FailureRecord
from orchestrator.monitor.attempts import InPlaceAttempts
from orchestrator.monitor.collectives import odd_ranks
from orchestrator.monitor.series import StepSeries
from orchestrator.monitor.stragglers import StragglerWatch
from orchestrator.monitor.watchdog import HangWatchdog
from orchestrator.observe.metrics import RankMetrics
from orchestrator.protocol import (
    RESTART,
    AttemptBegun,
    AttemptState,
    Beat,
    BeatReply,
    CheckpointCommitted,
    Event,
    Failure,
    FailureContext,
    Finished,
    HangCollectives,
    Output,
    Phase,
    RankPlace,
    RankStarted,
    RestartInPlace,
    Stacks,
    StopRequested,
    StragglerTotals,
    Verdict,
)
from orchestrator.spec import FailureSpec

# Lines of a script's rank-0 output held for the driver at most; older ones are dropped, counted.
OUTPUT_LINES_HELD = 20_000
# Seconds between updates of each rank's step-time and work gauges.
RANK_METRICS_EVERY_S = 2.0


class OutputBuffer:
    """A script's rank-0 lines on their way to the driver's console: at most `held`, the oldest
    dropped (and counted) when the console falls behind; whatever is taken is forgotten here."""

    def __init__(self, held: int = OUTPUT_LINES_HELD):
        self._lines: collections.deque[str] = collections.deque(maxlen=held)
        self._dropped = 0

    def add(self, lines: list[str]) -> None:
        self._dropped += max(0, len(self._lines) + len(lines) - self._lines.maxlen)
        self._lines.extend(lines)

    def take(self) -> tuple[list[str], int]:
        lines, dropped = list(self._lines), self._dropped
        self._lines.clear()
        self._dropped = 0
        return lines, dropped


def start_monitor(run: str, failure: FailureSpec) -> ray.actor.ActorHandle:
    """The RunMonitor of run `run` (its failure section), on the driver's own node.

    It needs no CPU, so Ray could place it on any node; on a worker node it would die with that
    node, taking the run's record of committed checkpoints with it. The driver's node lives
    exactly as long as the run does. It is named by its run (`<run> monitor`, in the driver's own
    namespace), so that Ray's dashboard lists it as the run's.
    """
    here = ray.get_runtime_context().get_node_id()
    return RunMonitor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                              name=f"{run} monitor").remote(failure, run)


@ray.remote(num_cpus=0)
class RunMonitor:
    def __init__(self, failure: FailureSpec, run: str = "") -> None:
        self._run = run
        self._events: list[Event] = []
        self._latest_checkpoint: CheckpointCommitted | None = None
        # The attempt running now (protocol.py): the watchdog judges its beats alone.
        self._attempt = 0
        self._watchdog = HangWatchdog(failure.hang_timeout_s, failure.phase_limits)
        self._stragglers = StragglerWatch(failure.straggler_ratio, failure.straggler_after_s, host_of=self._host_of)
        # Each rank's step time and own work a step, for Prometheus.
        self._rank_metrics = RankMetrics(run, RANK_METRICS_EVERY_S)
        # Each rank's steps over time, for `orchestrator report` (the run's history file).
        self._series = StepSeries()
        # Per attempt, the agents heard from after a hang verdict, and their ranks' flight records.
        self._flight_records: dict[int, dict[str, Any]] = {}
        self._stop_requested: float | None = None
        # A rank sent SIGTERM from outside, as its agent said (agent/rank_signals.py): who, and
        # whether again; the driver takes it as its own SIGTERM (driver/attempt.py).
        self._rank_signal: tuple[str, bool] | None = None
        # Set by the driver when a stop's grace period ran out: the workers end themselves.
        self._abort_reason: str | None = None
        # Set when another driver took the run over: why (LeaseLost's text).
        self._taken_over: str | None = None
        # Per attempt: the newest step rank 0's heartbeat reported, and when (for goodput).
        self._last_steps: dict[int, tuple[int, float]] = {}
        # Every rank is a child of its node's agent: a failed rank restarts every rank in place
        # (attempts.py), each restart a new attempt in the same worker group (failure.max_failures
        # counts both kinds of restart).
        self._attempts = InPlaceAttempts(failure.max_failures)
        self._ranks = 0
        # The agents of the current group that ended and removed what they kept on their node.
        self._agents_done: set[int] = set()
        self._output = OutputBuffer()

    def __repr__(self) -> str:
        """What Ray's dashboard shows as the actor's Repr, and its log lines' prefix."""
        return f"RunMonitor(run={self._run!r})"

    def push(self, event: Event | Output) -> None:
        if isinstance(event, Output):
            self._output.add(event.lines)
            return
        event.time = time.time()
        if isinstance(event, CheckpointCommitted):
            self._latest_checkpoint = event
        self._events.append(event)
        if isinstance(event, Stacks):
            self._compare_collectives(event)

    def _compare_collectives(self, stacks: Stacks) -> None:
        """Once every agent of the group sent its hung ranks' flight records: the rank whose last
        collective differs from its peers' (monitor/collectives.py), named in the run's events."""
        heard = self._flight_records.setdefault(stacks.attempt, {"agents": 0, "ranks": {}})
        heard["agents"] += 1
        heard["ranks"].update({int(rank): found for rank, found in stacks.collectives.items()})
        if heard["agents"] < self._attempts.workers or not heard["ranks"]:
            return
        ranks, message = odd_ranks(heard["ranks"], list(range(self._ranks)))
        if message:
            self._events.append(HangCollectives(attempt=stacks.attempt, ranks=ranks, message=message, time=time.time()))

    def events_since(self, index: int) -> list[Event]:
        return self._events[index:]

    def take_output(self) -> tuple[list[str], int]:
        """The script's rank-0 lines not taken yet, and how many were dropped since the last take."""
        return self._output.take()

    def finished(self, stopped: bool = False) -> bool:
        """Whether rank 0 reported the end of training, every checkpoint committed: of a run that
        ran to its end, or with `stopped` of one the driver stopped (its stop checkpoint committed)."""
        return any(isinstance(e, Finished) and e.stopped == stopped for e in self._events)

    def agent_done(self, worker: int) -> None:
        """Agent `worker` of the current group ended: its ranks, their helpers and its scratch are gone."""
        self._agents_done.add(worker)

    def ended(self) -> bool:
        """Whether the run ran to its end and every agent of the group cleaned up after it (a
        driver that leaves then, before Ray Train's teardown, leaves nothing behind)."""
        return self.finished() and len(self._agents_done) >= self._attempts.workers

    def begin_group(self, world_size: int, workers: int = 1) -> AttemptBegun:
        """Agent 0 of a new worker group (`workers` agents, running `world_size` ranks): the
        attempt it starts, and the newest checkpoint of this run."""
        self._ranks = world_size
        self._agents_done = set()
        self._new_attempt(self._attempts.new_group(workers))
        return AttemptBegun(self._attempt, self._latest_uri())

    def _new_attempt(self, attempt: int) -> None:
        """Attempt `attempt` starts (a group's start, or a restart in place): what judges the
        ranks' beats starts afresh with it."""
        self._attempt = attempt
        self._watchdog.new_attempt(attempt, self._ranks, time.monotonic())
        self._stragglers.new_attempt(attempt)
        self._rank_metrics.new_attempt()

    def _latest_uri(self) -> str | None:
        return self._latest_checkpoint.uri if self._latest_checkpoint else None

    # --- the attempts in place (attempts.py) -----------------------------------------------------

    def attempt_state(self) -> AttemptState:
        """The attempt starting now, the restarts allowed, and the newest checkpoint committed in
        this run (a ctx job's rank 0 resumes from it)."""
        return self._attempts.state(self._latest_uri())

    def attempt_report(self, attempt: int, worker: int, failure: FailureRecord | None) -> None:
        """A node's ranks of `attempt` ended: all exited 0 (None), or one failed (its record)."""
        self._attempts.report(attempt, worker, failure, time.monotonic())

    def attempt_verdict(self, attempt: int) -> Verdict:
        undecided = attempt not in self._attempts.verdicts
        verdict = self._attempts.verdict(attempt, time.monotonic())
        if undecided and verdict.action == RESTART:
            self._new_attempt(verdict.attempt)
            self.push(RestartInPlace(attempt=verdict.attempt, restarts=verdict.restarts,
                                     max_restarts=self._attempts.max_restarts, failure=verdict.failure))
        return verdict

    def beat(self, attempt: int, beat: Beat) -> BeatReply:
        """A rank's heartbeat. The reply tells it whether to end now, or to stop (a hang verdict is
        a failure of the attempt: every rank restarts in place, attempts.py)."""
        now, wall = time.monotonic(), time.time()
        if beat.rank == 0 and beat.step > self._last_steps.get(attempt, (0, 0.0))[0]:
            self._last_steps[attempt] = (beat.step, wall)
        undecided = self._watchdog.verdict is None
        verdict = self._watchdog.observe(attempt, beat, now)
        if verdict is not None and undecided:
            verdict.time = wall  # an event's time is the wall clock's (protocol.Event)
        stop = self._stop_requested is not None
        if beat.phase == Phase.TRAINING and attempt == self._attempt:
            self._rank_metrics.seen(beat.rank, beat.step, beat.work_s)
        if attempt == self._attempt and beat.phase not in (Phase.STARTING, Phase.WORKING):
            # Before its first step a rank's count is not yet the resumed step it goes on from.
            self._series.seen(beat.rank, attempt, beat.step, wall)
        straggler = self._stragglers.observe(attempt, beat, now)
        if straggler is not None:
            self.push(straggler)
        if verdict is not None and undecided:
            for rank in verdict.ranks:
                self._attempts.report(attempt, -1, FailureRecord(rank, HANG, verdict.message, decisive=True,
                                                                 hang=verdict.to_record()), now)
        return BeatReply(abort=self._abort_reason, stop=stop)

    def last_steps(self) -> dict[int, tuple[int, float]]:
        return dict(self._last_steps)

    def stragglers(self) -> StragglerTotals:
        """The seconds the group waited for its slowest rank, and the slowest rank now (summary.json)."""
        return StragglerTotals(round(self._stragglers.wait_s, 3), self._stragglers.slowest())

    def step_series(self) -> dict[str, list[list[float]]]:
        """Each rank's (time, attempt, step) samples (monitor/series.py), for the run's history."""
        return self._series.to_dict()

    def _host_of(self, rank: int) -> str:
        return next((e.hostname for e in reversed(self._events)
                     if isinstance(e, RankStarted) and e.rank == rank and e.attempt == self._attempt), "")

    def failure_context(self) -> FailureContext:
        """What Ray Train's controller needs to classify a failure of the current group (a lost
        agent): whether the run is stopping, where each rank ran, and the earlier failures'
        errors a retry could have got past (an error back at the same step is the data's). A hang
        is never one: its ranks restart in place."""
        places = {e.rank: RankPlace(e.node_id, e.pid, e.hostname)
                  for e in self._events if isinstance(e, RankStarted) and e.attempt == self._attempt}
        earlier = [r for e in self._events if isinstance(e, Failure) for r in e.ranks if r.signature]
        exhausted = None
        if self._attempts.exhausted:
            exhausted = (f"the run used all {self._attempts.restarts} restart(s) failure.max_failures "
                         f"({self._attempts.max_restarts}) allows, in place and of the whole group together")
        return FailureContext(stopping=self._stop_requested is not None, places=places, taken_over=self._taken_over,
                              restarts_exhausted=exhausted, earlier=earlier)

    def request_stop(self, deadline: float) -> None:
        if self._stop_requested is None:
            self._stop_requested = deadline
            self.push(StopRequested(deadline=deadline))

    def rank_signalled(self, by: str, again: bool = False) -> None:
        """A rank was sent SIGTERM from outside (a scheduler's time limit, scancel): `by` says which;
        `again`: a second time. The driver asks for the stop (`rank_signal`), with its own grace."""
        first = self._rank_signal
        self._rank_signal = (first[0] if first else by, again or bool(first and first[1]))

    def rank_signal(self) -> tuple[str, bool] | None:
        return self._rank_signal

    def take_over(self, reason: str) -> None:
        """Another driver took the run over (the lease's heartbeat noticed): end the current worker
        group now, without a restart, its failure classified as taken_over."""
        self._taken_over = reason
        self.request_stop(time.time())
        self._abort_reason = f"this driver lost the run to another driver: {reason}"

    def abort(self, reason: str) -> None:
        """End the current worker group now (a stop whose grace period ran out)."""
        self._abort_reason = reason
