"""Stragglers: the rank whose own work a step stays well above its peers', named while the run goes on.

Under DDP every rank takes the same time a step: the gradients' all-reduce waits for the slowest.
What tells the ranks apart is each one's own work in a step, from the end of one optimizer step to
the end of the next step's forward (the batch, the forward, the loss: rank/script/bootstrap.py's
_StepWork, on every path), which the beats carry as `work_s`. Here, in the run monitor, each
training rank's newest work is compared with the median of its peers'. A rank at
`failure.straggler_ratio` times that median or more, for `failure.straggler_after_s`, is named in
one warning (its rank, node, host and pid, by how much, and what the group loses to it), once per
attempt. A rank slower by less than MIN_EXCESS_S a step is never named: on a busy machine a tiny
step's jitter reads as a large ratio and costs nothing.

The group's wait for its slowest rank, (slowest work - the others' median) for each step rank 0
takes, is summed for goodput; `slowest()` is what summary.json and `orchestrator status` show.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.protocol import Beat, Phase, SlowestRank, Straggler

# Seconds a step a straggler must be behind its peers' median to be named.
MIN_EXCESS_S = 0.005


@dataclass
class StragglerWatch:
    ratio: float
    after_s: float
    # The rank's host, by its rank (the run monitor knows it from the ranks' starts).
    host_of: Callable[[int], str] = lambda rank: ""
    attempt: int = -1
    # Each rank's newest training beat that carried its own work (kept through a save or the end).
    beats: dict[int, Beat] = field(default_factory=dict)
    # Since when each rank has been at the ratio or above (the monitor's clock).
    since: dict[int, float] = field(default_factory=dict)
    warned: set[int] = field(default_factory=set)
    # Rank 0's newest step, and the seconds the group has waited for its slowest rank in all attempts.
    step: int | None = None
    wait_s: float = 0.0

    def new_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self.beats.clear()
        self.since.clear()
        self.warned.clear()
        self.step = None

    def observe(self, attempt: int, beat: Beat, now: float) -> Straggler | None:
        """Take a rank's beat; the warning, the moment the rank counts as a straggler (else None)."""
        if attempt != self.attempt:
            return None
        if beat.phase != Phase.TRAINING or not beat.work_s:
            self.since.pop(beat.rank, None)  # its last training beat stays its measure
            return None
        self.beats[beat.rank] = beat
        if beat.rank == 0:
            self._count_wait(beat.step)
        peers = [b.work_s for r, b in self.beats.items() if r != beat.rank]
        if not peers:
            return None
        median = statistics.median(peers)
        if beat.work_s < self.ratio * median or beat.work_s - median < MIN_EXCESS_S:
            self.since.pop(beat.rank, None)
            return None
        since = self.since.setdefault(beat.rank, now)
        if now - since < self.after_s or beat.rank in self.warned:
            return None
        self.warned.add(beat.rank)
        return self._warning(beat, median, now - since)

    def _count_wait(self, step: int) -> None:
        if self.step is not None and step > self.step and len(self.beats) > 1:
            works = sorted(b.work_s for b in self.beats.values())
            slowest, others = works[-1], works[:-1]
            self.wait_s += (step - self.step) * max(0.0, slowest - statistics.median(others))
        self.step = step if self.step is None else max(self.step, step)

    def slowest(self) -> SlowestRank | None:
        """The slowest training rank now, against its peers' median (None with fewer than two)."""
        if len(self.beats) < 2:
            return None
        rank, beat = max(self.beats.items(), key=lambda item: item[1].work_s)
        median = statistics.median(b.work_s for r, b in self.beats.items() if r != rank)
        return SlowestRank(rank=rank, node_id=beat.node_id, host=self.host_of(rank), work_s=beat.work_s,
                           peers_median_s=median, ratio=beat.work_s / median if median else None)

    def _warning(self, beat: Beat, median: float, for_s: float) -> Straggler:
        host = self.host_of(beat.rank)
        where = ", ".join(part for part in (f"node {beat.node_id[:12]}" if beat.node_id else "",
                                            f"host {host}" if host else "", f"pid {beat.pid}" if beat.pid else "")
                          if part)
        ratio = beat.work_s / median
        message = (f"rank {beat.rank} ({where}) is a straggler: its own work takes {beat.work_s * 1000:.0f} ms a step, "
                   f"{ratio:.2f}x its peers' median of {median * 1000:.0f} ms, for {for_s:.0f} s "
                   f"(failure.straggler_ratio {self.ratio:g}, straggler_after_s {self.after_s:g}); every step "
                   f"of the group waits about {(beat.work_s - median) * 1000:.0f} ms for it. A slow node (a "
                   "thermal limit, a busy neighbour, a failing disk) or uneven data is the usual cause.")
        return Straggler(rank=beat.rank, node_id=beat.node_id, host=host, pid=beat.pid, attempt=self.attempt,
                         work_s=beat.work_s, peers_median_s=median, ratio=ratio, message=message)
