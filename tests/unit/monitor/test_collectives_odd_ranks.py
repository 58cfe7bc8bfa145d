"""Which rank's last collective differs from its peers' (monitor/collectives.py)."""

from __future__ import annotations

from orchestrator.monitor.collectives import odd_ranks


def _at(seq: int, op: str = "nccl:all_reduce", sizes=((1024,),), group: str = "default_pg") -> dict:
    return {group: {"seq": seq, "op": op, "state": "started", "sizes": [list(s) for s in sizes]}}


def test_every_rank_at_the_same_collective_names_nobody():
    assert odd_ranks({r: _at(7) for r in range(4)}, list(range(4))) == ([], None)


def test_a_rank_behind_its_peers_is_named_as_never_having_entered():
    ranks, message = odd_ranks({0: _at(7), 1: _at(7), 2: _at(6, "nccl:all_gather"), 3: _at(7)}, list(range(4)))
    assert ranks == [2]
    assert "rank 2 never entered collective #7 nccl:all_reduce on default_pg, which its peers wait in (its last " \
           "was #6 nccl:all_gather)" in message


def test_a_rank_ahead_of_its_peers_is_named_as_gone_on():
    ranks, message = odd_ranks({0: _at(9), 1: _at(8), 2: _at(8)}, [0, 1, 2])
    assert ranks == [0] and "rank 0 went on to collective #9 nccl:all_reduce on default_pg while its peers are " \
                              "at #8 nccl:all_reduce" in message


def test_a_mismatched_call_at_the_same_number_is_named_with_both_calls():
    ranks, message = odd_ranks({0: _at(5), 1: _at(5, "nccl:broadcast"), 2: _at(5)}, [0, 1, 2])
    assert ranks == [1] and "rank 1 called nccl:broadcast" in message and "a mismatched call" in message
    ranks, message = odd_ranks({0: _at(5), 1: _at(5, sizes=((2048,),)), 2: _at(5)}, [0, 1, 2])
    assert ranks == [1] and "sizes [[2048]]" in message and "sizes [[1024]]" in message


def test_the_training_group_is_read_before_a_side_group_and_silent_ranks_are_said():
    records = {0: {**_at(5), **_at(3, "gloo:all_reduce", group="1")},
               1: {**_at(4), **_at(2, "gloo:all_reduce", group="1")}}
    ranks, message = odd_ranks({**records, 2: _at(5)}, [0, 1, 2, 3])
    assert ranks == [1] and "on default_pg" in message and "on 1" not in message
    assert message.endswith("rank(s) 3 gave no flight record (stopped or gone: see their stacks).")
    assert odd_ranks({0: _at(5)}, [0, 1]) == ([], "flight recorder: rank(s) 1 gave no flight record (stopped or "
                                                   "gone: see their stacks).")
