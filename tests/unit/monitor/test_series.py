"""Each rank's steps over time for the report: sampled, bounded, and turned into step rates that
never join two attempts (monitor/series.py)."""

from __future__ import annotations

import itertools

from orchestrator.monitor.series import StepSeries, step_rates


def test_one_sample_a_rank_each_interval_and_at_once_on_a_new_attempt():
    series = StepSeries(sample_s=2.0)
    for second in range(7):  # a beat a second
        series.seen(0, 1, 10 * second, 100.0 + second)
    series.seen(0, 2, 40, 106.5)  # a restart: sampled at once
    assert series.to_dict() == {"0": [[100.0, 1, 0], [102.0, 1, 20], [104.0, 1, 40], [106.0, 1, 60],
                                      [106.5, 2, 40]]}


def test_a_long_run_keeps_a_bounded_number_of_points_a_rank_spread_over_all_of_it():
    series = StepSeries(sample_s=1.0, max_points=100)
    for second in range(10_000):
        series.seen(3, 1, second, float(second))
    points = series.to_dict()["3"]
    assert len(points) <= 100
    assert points[0][0] == 0.0 and points[-1][0] == 9_999.0  # the whole run, at a coarser grain
    assert all(a[0] < b[0] for a, b in itertools.pairwise(points))


def test_rates_within_an_attempt_and_a_break_at_a_restart():
    points = [[0.0, 1, 0], [2.0, 1, 20], [4.0, 1, 30], [5.0, 2, 20], [7.0, 2, 40]]
    assert step_rates(points) == [(2.0, 10.0), (4.0, 5.0), (4.0, None), (7.0, 10.0)]
    assert step_rates(points[:1]) == []
