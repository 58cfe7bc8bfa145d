"""The straggler verdict (monitor/stragglers.py) from the ranks' beats: a rank whose own work a step
stays at the ratio of its peers' median for the window is named once, with its node and host; noise,
a short spell and a tiny excess are not; the group's wait for its slowest rank is counted."""

from __future__ import annotations

from orchestrator.monitor.stragglers import StragglerWatch
from orchestrator.protocol import Beat

HOSTS = {0: "gpu-a", 1: "gpu-b", 2: "gpu-c"}


def _watch(ratio: float = 1.3, after_s: float = 20.0) -> StragglerWatch:
    watch = StragglerWatch(ratio, after_s, host_of=HOSTS.get)
    watch.new_attempt(1)
    return watch


def _beat(rank: int, work_s: float | None, step: int = 10, phase: str = "training") -> Beat:
    return Beat(rank=rank, step=step, phase=phase, idle_s=0.0, node_id=f"node{rank}" * 4, pid=100 + rank,
                work_s=work_s)


def _second(watch: StragglerWatch, now: float, works: dict[int, float], step: int = 10):
    """One second of beats from every rank; the warnings they gave."""
    return [w for r, work in works.items() if (w := watch.observe(1, _beat(r, work, step), now)) is not None]


def test_a_rank_slower_by_half_for_the_window_is_named_once_with_its_node_and_host():
    watch = _watch()
    warnings = []
    for second in range(40):
        warnings += _second(watch, float(second), {0: 0.100, 1: 0.150, 2: 0.102}, step=second)
    assert len(warnings) == 1
    warning = warnings[0]
    assert (warning.rank, warning.host, warning.node_id, warning.pid) == (1, "gpu-b", "node1" * 4, 101)
    assert 1.45 < warning.ratio < 1.5 and abs(warning.peers_median_s - 0.101) < 1e-9
    assert warning.time == 0.0 and "rank 1 (node node1node1no, host gpu-b, pid 101) is a straggler" in warning.message
    assert "1.49x" in warning.message and "failure.straggler_ratio 1.3" in warning.message


def test_it_is_named_only_after_the_window():
    watch = _watch(after_s=20.0)
    assert all(not _second(watch, float(s), {0: 0.1, 1: 0.15}) for s in range(20))
    assert [w.rank for w in _second(watch, 20.0, {0: 0.1, 1: 0.15})] == [1]


def test_a_short_spell_starts_the_window_again():
    watch = _watch(after_s=20.0)
    for second in range(15):
        assert not _second(watch, float(second), {0: 0.1, 1: 0.15})
    assert not _second(watch, 15.0, {0: 0.1, 1: 0.11})  # back in step: the spell is over
    for second in range(16, 35):
        assert not _second(watch, float(second), {0: 0.1, 1: 0.15})
    assert _second(watch, 36.0, {0: 0.1, 1: 0.15})


def test_two_ranks_are_compared_with_each_other_not_with_their_mean():
    """With two ranks the median of both would halve the gap; each is compared with its peer."""
    watch = _watch(after_s=0.0)
    warnings = _second(watch, 0.0, {0: 0.100, 1: 0.140})
    assert [w.rank for w in warnings] == [1] and abs(warnings[0].ratio - 1.4) < 1e-9


def test_noise_below_the_ratio_and_a_tiny_excess_name_nobody():
    assert not _second(_watch(after_s=0.0), 0.0, {0: 0.100, 1: 0.125, 2: 0.098})  # within 1.3x
    # 3x, but 2 ms a step: jitter of a tiny step on a busy machine, which costs nothing.
    assert not _second(_watch(after_s=0.0), 0.0, {0: 0.001, 1: 0.003, 2: 0.001})


def test_ranks_outside_training_or_without_a_measure_are_left_out():
    watch = _watch(after_s=0.0)
    assert watch.observe(1, _beat(1, 0.5, phase="checkpoint"), 0.0) is None
    assert watch.observe(1, _beat(0, None), 0.0) is None
    assert watch.observe(1, _beat(2, 0.1), 0.0) is None  # alone: no peer to compare with
    assert watch.slowest() is None


def test_the_slowest_rank_is_still_known_once_the_ranks_finish():
    watch = _watch()
    _second(watch, 0.0, {0: 0.10, 1: 0.15})
    _second(watch, 1.0, {0: None, 1: None})  # finishing: no step, no measure
    assert watch.observe(1, _beat(1, 0.15, phase="finishing"), 2.0) is None
    assert watch.slowest().rank == 1


def test_a_new_attempt_judges_afresh_and_a_late_beat_is_ignored():
    watch = _watch(after_s=0.0)
    assert _second(watch, 0.0, {0: 0.1, 1: 0.2})
    assert not _second(watch, 1.0, {0: 0.1, 1: 0.2})  # said once an attempt
    watch.new_attempt(2)
    assert watch.observe(1, _beat(1, 0.2), 2.0) is None  # attempt 1's
    assert watch.observe(2, _beat(0, 0.1), 2.0) is None
    assert watch.observe(2, _beat(1, 0.2), 2.0).attempt == 2


def test_the_groups_wait_for_its_slowest_rank_is_counted_by_rank_zeros_steps():
    watch = _watch()
    _second(watch, 0.0, {1: 0.15, 2: 0.10, 0: 0.10}, step=100)
    _second(watch, 1.0, {1: 0.15, 2: 0.10, 0: 0.10}, step=110)  # 10 steps, 50 ms each behind
    assert abs(watch.wait_s - 0.5) < 1e-9
    slowest = watch.slowest()
    assert slowest.rank == 1 and slowest.host == "gpu-b" and abs(slowest.ratio - 1.5) < 1e-9
