"""The pairs doctor --nodes measures, a round at a time (cli/doctor_probes.py)."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.cli.doctor_probes import pair_rounds


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("rounds", [1, 3])
def test_each_member_meets_distinct_peers_at_most_once_a_round(members, rounds):
    ranks = list(range(10, 10 + members))
    schedule = pair_rounds(ranks, rounds)
    pairs = [pair for round_ in schedule for pair in round_]
    assert len(pairs) == len(set(pairs))  # no pair twice
    for round_ in schedule:
        busy = [rank for pair in round_ for rank in pair]
        assert len(busy) == len(set(busy)) and set(busy) <= set(ranks)  # one pair a member a round
    met = {rank: {b if a == rank else a for a, b in pairs if rank in (a, b)} for rank in ranks}
    # Everyone meets `rounds` peers (all of them, on a smaller group), less one round sat out when odd.
    for rank in ranks:
        assert min(rounds, members - 1) - (members % 2) <= len(met[rank]) <= min(rounds, members - 1)


def test_three_members_meet_each_other_in_three_rounds():
    assert sorted(itertools.chain(*pair_rounds([0, 1, 2], 3))) == [(0, 1), (0, 2), (1, 2)]
