"""Each rank's optimizer steps over time, kept by the run monitor for `orchestrator report`: its
step rate on a time line, drawn beside the attempts, failures and checkpoints (the run's history
file, observe/history.py).

A sample (time, attempt, step) a rank every SAMPLE_S from its beats, in every phase after its
first step (a validation or a checkpoint shows as the rate it is, none); past MAX_POINTS a rank, every
other old sample is dropped, so a week's run keeps the same few hundred points a rank as an hour's,
at a coarser grain (the newest half keeps its grain until the next halving).
"""

from __future__ import annotations

import itertools

SAMPLE_S = 2.0
MAX_POINTS = 600


class StepSeries:
    def __init__(self, sample_s: float = SAMPLE_S, max_points: int = MAX_POINTS):
        self.sample_s = sample_s
        self.max_points = max_points
        # rank -> [(time, attempt, step)], in order.
        self._points: dict[int, list[tuple[float, int, int]]] = {}

    def seen(self, rank: int, attempt: int, step: int, now: float) -> None:
        points = self._points.setdefault(rank, [])
        if points and now - points[-1][0] < self.sample_s and points[-1][1] == attempt:
            return
        points.append((round(now, 3), attempt, step))
        if len(points) > self.max_points:
            half = len(points) // 2
            points[:half] = points[:half:2]

    def to_dict(self) -> dict[str, list[list[float]]]:
        """{rank: [[time, attempt, step], ...]} as JSON keeps it."""
        return {str(rank): [list(p) for p in points] for rank, points in sorted(self._points.items())}


def step_rates(points: list[list[float]]) -> list[tuple[float, float | None]]:
    """(time, steps/s) between consecutive samples of one attempt; a new attempt (a restart, which
    may step back to a checkpoint) starts a new stretch, after a (time, None) that breaks the line."""
    rates: list[tuple[float, float | None]] = []
    for (t0, a0, s0), (t1, a1, s1) in itertools.pairwise(points):
        if a1 != a0 or s1 < s0:
            if rates and rates[-1][1] is not None:
                rates.append((t0, None))
        elif t1 > t0:
            rates.append((t1, (s1 - s0) / (t1 - t0)))
    return rates
