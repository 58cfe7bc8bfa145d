"""Hang detection from the workers' heartbeats: the part Ray and torch do not cover.

Ray Train's health check (`RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S`, set to the hang timeout)
catches a worker process that stops answering at all. It cannot see a worker that answers but
trains no more: a deadlock, or every rank waiting in a collective for one that never comes.
torch's process-group timeout can, but it cannot tell a stuck collective from one rank's long
solo work (a download, a rank-0 evaluation) and so is kept long, as a backstop.

Each worker's heartbeat thread sends, about once a second, its last optimizer step, what the
training thread is doing (a phase) and for how long it has made no progress. This watchdog,
inside the run monitor, gives a verdict when
- a rank of the current worker group has sent no heartbeat for `hang_timeout_s` while its peers
  do (the process is frozen: SIGSTOP, a stalled node), or
- a rank has spent longer in `starting` (up to its group's first optimizer step: restoring,
  compiling, autotuning), `checkpoint` (a save, waiting for the previous write) or `finishing`
  (the end save, the last write) than that phase's own limit (`failure.startup_timeout_s`,
  `checkpoint_timeout_s`, `finish_timeout_s`): a storage stall there would otherwise hang a run
  for ever, or
- a rank in the `training` phase has taken no step for `hang_timeout_s`, while no rank of its
  group is in one of the phases above: peers blocked in the next collective while one rank
  checkpoints or starts up are waiting for it, not hung, and that rank has a limit of its own.
Validation and the end of an epoch (the user's evaluation) are not timed.

A torchrun script's ranks say less (agent/supervisor.py): only their optimizer steps,
and, measured by their agent, when their Python stack last moved and when their processes last
used CPU. For them:
- a rank that exited 0 is `finished`: never silent, never hung, whatever its peers still do;
- a rank that has taken no optimizer step (an evaluation, preprocessing or inference script, a
  hand-written update, or one still loading) is `working`: it has no phase limit, and is judged
  by its liveness alone;
- a rank counts as still when, for `hang_timeout_s`, it took no step and its stack did not move
  (and, unless it is a `training` rank with every peer still running, its CPU time did not grow:
  a long call into C moves no line of Python but uses CPU, while a rank spinning in an NCCL
  collective uses CPU without progress). The group is hung when every unfinished rank is still:
  one rank at work (a rank-0 evaluation, a save, an upload) keeps its waiting peers from a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.protocol import Beat, Hang, Phase

TIMED_PHASE = Phase.TRAINING
# The spec field that bounds each phase with a limit of its own.
PHASE_LIMIT_FIELDS = {Phase.STARTING: "failure.startup_timeout_s", Phase.CHECKPOINT: "failure.checkpoint_timeout_s",
                      Phase.FINISHING: "failure.finish_timeout_s"}
# Seconds without a heartbeat (sent every second) after which a rank counts as silent.
SILENT_AFTER_S = 4.0


@dataclass
class HangWatchdog:
    hang_timeout_s: float
    # Seconds allowed in each phase of PHASE_LIMIT_FIELDS (a phase absent here is not timed).
    phase_limits: dict[str, float] = field(default_factory=dict)
    # The attempt judged now (protocol.py): beats of any other are late, and ignored.
    attempt: int = -1
    world_size: int = 0
    beats: dict[int, Beat] = field(default_factory=dict)
    verdict: Hang | None = None
    started: float = 0.0
    # When a rank of the group was last seen in a phase with a limit of its own.
    limited_seen: float = float("-inf")

    def new_attempt(self, attempt: int, world_size: int, now: float) -> None:
        self.attempt, self.world_size = attempt, world_size
        self.beats.clear()
        self.verdict = None
        self.limited_seen = float("-inf")
        # A rank frozen before its first heartbeat is silent since the attempt began.
        self.started = now

    def observe(self, attempt: int, beat: Beat, now: float) -> Hang | None:
        """Record a heartbeat; return the verdict once the attempt counts as hung (else None)."""
        if attempt != self.attempt:
            return None  # a late beat of an attempt already replaced
        beat.received = now
        self.beats[beat.rank] = beat
        if beat.phase in self.phase_limits:
            self.limited_seen = now
        return self.check(now)

    def check(self, now: float) -> Hang | None:
        if self.verdict is not None:
            return self.verdict
        limit = self.hang_timeout_s
        everyone = [self.beats.get(r) or Beat(r, 0, Phase.STARTING, 0.0, received=self.started)
                    for r in range(self.world_size)]
        # A rank that finished is done, not silent; its peers go on alone.
        finished = [b for b in everyone if b.phase == Phase.FINISHED]
        everyone = [b for b in everyone if b.phase != Phase.FINISHED]
        if not everyone:
            return None
        # Frozen ranks: silent while a peer still beats (with every rank silent there is no one
        # to tell, and Ray's own health check takes over). A finished rank's agent beats for it.
        silent = [b for b in everyone if now - b.received > SILENT_AFTER_S]
        if len(silent) == len(everyone) and not any(now - b.received <= SILENT_AFTER_S for b in finished):
            silent = []
        overlong = [b for b in self.beats.values()
                    if b.phase in self.phase_limits and b.idle_s > self.phase_limits[b.phase]]
        # Peers blocked behind a rank in a limited phase wait for it: only its own limit counts,
        # and their stall counts from the last time a rank was seen there. (Beats are a second
        # apart: a peer's newest beat may still show the wait that just ended.)
        waiting_s = now - self.limited_seen
        stalled = [b for b in everyone if b.phase == TIMED_PHASE and min(b.idle_s, waiting_s) > limit
                   and b.stack_idle_s is None]
        scripts = [b for b in everyone if b.active_idle_s is not None]
        if scripts and not silent and len(scripts) == len(everyone):
            stalled = self._still_scripts(everyone, bool(finished), limit)
        if any(now - b.received > limit for b in silent) or ((stalled or overlong) and silent):
            # A frozen rank stalls its peers too; it is the one to name.
            self.verdict = self._verdict("stopped answering", silent, now)
        elif overlong:
            phase = overlong[0].phase
            self.verdict = self._verdict(f"stayed in the {phase} phase", [b for b in overlong if b.phase == phase],
                                         now, self.phase_limits[phase], PHASE_LIMIT_FIELDS.get(phase))
        elif stalled and stalled[0].active_idle_s is not None:
            self.verdict = self._verdict("made no progress (no optimizer step, no move of its Python stack"
                                         + (")" if stalled[0].phase == TIMED_PHASE and not finished
                                            else " and no CPU time)"), stalled, now)
        elif stalled:
            self.verdict = self._verdict("made no progress", stalled, now)
        return self.verdict

    @staticmethod
    def _still_scripts(ranks: list[Beat], peer_finished: bool, limit: float) -> list[Beat]:
        """A script's unfinished ranks, if every one of them is still (module docstring); else []."""
        def still(b: Beat) -> bool:
            if b.phase == TIMED_PHASE and not peer_finished:
                return min(b.idle_s, b.stack_idle_s) > limit
            return b.active_idle_s > limit

        return ranks if all(still(b) for b in ranks) else []

    def _verdict(self, what: str, ranks: list[Beat], now: float, limit_s: float | None = None,
                 limit_field: str | None = None) -> Hang:
        culprits = sorted(ranks, key=lambda b: b.rank)
        culprit_ranks = {b.rank for b in culprits}
        others = [b for r, b in sorted(self.beats.items()) if r not in culprit_ranks]
        who = ", ".join(f"rank {b.rank} (node {b.node_id[:12]}, pid {b.pid})" if b.pid else f"rank {b.rank}"
                        for b in culprits)
        detail = [(f"rank {b.rank}'s last heartbeat, {now - b.received:.0f} s ago, said step {b.step} ({b.phase})"
                   if b.pid else f"rank {b.rank} sent no heartbeat in the {now - b.received:.0f} s since the start")
                  + (f", {b.frame}" if b.frame else "") for b in culprits]
        detail += [f"rank {b.rank} at step {b.step} ({b.phase})" + (f", {b.frame}" if b.frame else "")
                   for b in others]
        limit_s = self.hang_timeout_s if limit_s is None else limit_s
        limit_field = limit_field or "failure.hang_timeout_s"
        message = f"{who} {what} for more than {limit_s:g} s ({limit_field}): " + "; ".join(detail)
        return Hang(attempt=self.attempt, what=what, ranks=[b.rank for b in culprits],
                    nodes=[b.node_id for b in culprits], message=message, time=now)
