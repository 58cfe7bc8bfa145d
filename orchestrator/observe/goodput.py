"""Goodput: how much of a run's wall time went into steps whose work reached the final weights.

Computed on the driver from the run monitor's record. Each worker group is known by its start
(the step it resumed from), its first and last optimizer step (with their times), and the
checkpoint stall it reported. A group's steps count as productive up to the step the next group
resumed from; the steps after that were trained again (recomputed). The rest of the wall time is
lost, by cause:

- startup: from the command's start to the first group's first step (Ray, workers, imports,
  the process group, restoring, the first step);
- restarts: from the last step of a group that failed to the next group's first step (noticing
  the failure, which for a hang is the hang timeout, tearing down, starting again, restoring);
- recomputed: the steps trained again after a restart;
- checkpoint_stall: the training loop blocked by checkpointing;
- capacity_wait: waiting for the cluster to have room for the workers (taken out of the
  startup and restart windows it overlaps);
- other: the rest (evaluation between epochs, the end of the run, shutdown).

A group's step time is what its ranks timed where they time it (a torchrun script's bootstrap
reports the median time between rank 0's consecutive optimizer steps, `step_time_s` in its
events), else its span: (last step's time - first's) / steps between them. A run with no group
that timed two steps cannot be judged: its goodput is None, and `not_timed` says why, rather
than a 0% that would read as a run that did nothing useful.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from orchestrator.protocol import Event, Finished, Progress, RankStarted


@dataclass
class _Group:
    restored_step: int
    first_step: int | None = None
    first_time: float | None = None
    last_step: int | None = None
    last_time: float | None = None
    stall_s: float = 0.0
    # The step time the group's ranks measured themselves (a script's median), if they did.
    timed_s: float | None = None

    def see(self, step: int, when: float) -> None:
        if self.first_time is None or when < self.first_time:
            self.first_step, self.first_time = step, when
        # The first time a step was seen is when it was done (later reports only repeat it).
        if self.last_step is None or step > self.last_step:
            self.last_step, self.last_time = step, when

    def saw(self, event: Progress | Finished, stall_s: float) -> None:
        """A progress report of the group's rank 0 (Progress or Finished), with its stall so far."""
        self.see(int(event.step), event.time)
        self.stall_s = float(stall_s)
        if event.step_time_s:
            self.timed_s = float(event.step_time_s)

    def step_time(self) -> float | None:
        if self.timed_s:
            return self.timed_s
        if self.last_step is None or self.first_step is None or self.last_step <= self.first_step:
            return None
        return (self.last_time - self.first_time) / (self.last_step - self.first_step)


def compute(events: list[Event], *, started: float, ended: float,
            capacity_waits: list[tuple[float, float]] = (),
            last_steps: dict[int, tuple[int, float]] | None = None, straggler_wait_s: float = 0.0) -> dict[str, Any]:
    """Goodput of a run: `events` from the monitor, wall times on the driver's clock.

    `last_steps`: per attempt, the newest (step, time) the monitor saw in heartbeats (more recent
    than the last progress event, which comes every few seconds). `straggler_wait_s`: the seconds
    of the steps the group spent waiting for its slowest rank (monitor/stragglers.py), part of
    the productive time, said apart: what an even group would have saved.
    """
    groups: dict[int, _Group] = {}  # per attempt
    for event in events:
        match event:
            case RankStarted(rank=0):
                groups[event.attempt] = _Group(restored_step=event.restored_step or 0)
            # (Progress at the step its attempt resumed from: an epoch-boundary report before any step, left out.)
            case Progress() if event.attempt in groups and event.step > groups[event.attempt].restored_step:
                groups[event.attempt].saw(event, event.stall_s)
            case Finished() if event.attempt in groups:
                groups[event.attempt].saw(event, event.checkpoint_stall_s)
    for attempt, (step, when) in (last_steps or {}).items():
        if attempt in groups and step > groups[attempt].restored_step:
            groups[attempt].see(step, when)

    stepped = [g for _, g in sorted(groups.items()) if g.first_time is not None]
    times = [t for t in (g.step_time() for g in stepped) if t is not None]
    typical = statistics.median(times) if times else 0.0
    wall = max(ended - started, 1e-9)
    lost = {"startup": 0.0, "restarts": 0.0, "recomputed": 0.0, "checkpoint_stall": 0.0, "capacity_wait": 0.0}
    productive = 0.0
    recomputed_steps = 0
    windows = []
    for i, group in enumerate(stepped):
        step_time = group.step_time() or typical
        kept_end = stepped[i + 1].restored_step if i + 1 < len(stepped) else group.last_step
        kept = max(0, min(group.last_step, kept_end) - group.restored_step)
        redo = max(0, group.last_step - max(kept_end, group.restored_step))
        recomputed_steps += redo
        lost["recomputed"] += redo * step_time
        lost["checkpoint_stall"] += group.stall_s
        productive += kept * step_time
        if i == 0:
            windows.append(("startup", started, group.first_time))
        else:
            windows.append(("restarts", stepped[i - 1].last_time, group.first_time))
    if not stepped:
        windows.append(("startup", started, ended))
    for cause, begin, end in windows:
        waited = sum(max(0.0, min(end, b) - max(begin, a)) for a, b in capacity_waits)
        lost["capacity_wait"] += waited
        lost[cause] += max(0.0, end - begin - waited)
    productive = max(0.0, productive - lost["checkpoint_stall"])
    lost["other"] = max(0.0, wall - productive - sum(lost.values()))
    timed = typical > 0 or any(g.step_time() for g in stepped)
    result = {
        "wall_s": round(wall, 3),
        "productive_s": round(productive, 3),
        "lost_s": {k: round(v, 3) for k, v in lost.items()},
        "recomputed_steps": recomputed_steps,
        "goodput": round(productive / wall, 4) if timed else None,
        # 0 when no group has two distinct steps yet: productive time cannot be judged then.
        "step_time_s": round(typical, 6),
        "straggler_wait_s": round(straggler_wait_s, 3),
    }
    if not timed:
        steps = max((g.last_step - g.restored_step for g in stepped), default=0)
        result["not_timed"] = (f"no start of the ranks timed two optimizer steps ({steps} step(s) seen): "
                               "too short to tell productive time from the rest")
    return result


def describe(goodput: dict[str, Any]) -> str:
    """One line for the driver's final summary."""
    lost = ", ".join(f"{k} {v:.1f}" for k, v in goodput["lost_s"].items() if v >= 0.05)
    if goodput.get("goodput") is None:
        return (f"goodput not measured: {goodput.get('not_timed', 'no optimizer step was timed')}; "
                f"{goodput['wall_s']:.1f} s wall; lost (s): {lost or 'none'}")
    waited = goodput.get("straggler_wait_s") or 0.0
    return (f"goodput {goodput['goodput']:.1%}: {goodput['productive_s']:.1f} s productive of "
            f"{goodput['wall_s']:.1f} s wall; lost (s): {lost or 'none'}; "
            f"{goodput['recomputed_steps']} step(s) recomputed"
            + (f"; {waited:.1f} s of the steps waited for the slowest rank" if waited >= 0.05 else ""))
