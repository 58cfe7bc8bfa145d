"""A training loader over an IterableDataset on the Lightning path, on a real 2-process gloo world:
every sample is trained exactly once. A stream that is the same on every rank is cut one sample in
two; one that already splits itself by rank (by torch.distributed.get_rank(), by a rank it keeps,
as datasets' split_dataset_by_node leaves it) is kept as written, never cut a second time.

Both ranks run tests/helpers/stream_split_rank.py once, for all the streams."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, free_port

HELPER = os.path.join(REPO, "tests", "helpers", "stream_split_rank.py")
SAMPLES = 20  # the helper's streams' length


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [subprocess.Popen([sys.executable, HELPER, str(rank), port], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    answers = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)  # a rank left waiting in a collective ends here
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert proc.returncode == 0 and lines, out + err
            answers.append(json.loads(lines[-1]))
    finally:
        for proc in procs:
            proc.kill()  # by its own pid; a no-op once it has exited
            proc.wait()
    return answers


def trained(ranks: list[dict], stream: str) -> list[int]:
    return sorted(i for answer in ranks for i in answer[stream]["ids"])


@pytest.mark.timeout(300)
def test_a_stream_that_splits_itself_with_get_rank_is_kept_as_written_and_every_sample_is_read_once(ranks):
    assert trained(ranks, "get_rank") == list(range(SAMPLES))
    for answer in ranks:
        assert answer["get_rank"]["as_written"], answer["get_rank"]
        note = answer["get_rank"]["note"]
        assert "IterableDataset (SplitByGetRank) that is already split by rank" in note, note
        assert "its first sample differs between ranks" in note, note


@pytest.mark.timeout(300)
def test_a_stream_split_by_a_rank_it_keeps_is_kept_as_written_with_loader_workers_too(ranks):
    # Two loader workers per rank, each taking its part of the rank's part: the look at the first
    # sample is in the rank's own process, and the training still reads every sample.
    assert trained(ranks, "stored_rank") == list(range(SAMPLES))
    assert all(answer["stored_rank"]["as_written"] for answer in ranks)
    assert all(answer["stored_rank"]["probe_iterations"] == 1 for answer in ranks), "read once, in the rank"


@pytest.mark.timeout(300)
def test_a_stream_that_split_dataset_by_node_made_is_kept_as_written_without_being_read_first(ranks):
    assert trained(ranks, "split_by_node") == list(range(SAMPLES))
    for answer in ranks:
        outcome = answer["split_by_node"]
        assert outcome["as_written"] and outcome["probe_iterations"] == 0, outcome
        assert "(SplitByNode) that is already split by rank (split_dataset_by_node split it over 2 ranks)" in (
            outcome["note"]), outcome


@pytest.mark.timeout(300)
def test_a_stream_that_is_the_same_on_every_rank_is_cut_one_in_two_and_its_random_draws_are_untouched(ranks):
    # 20 samples, the same (random draws included) on both ranks: each keeps one of every two.
    assert trained(ranks, "same") == list(range(SAMPLES))
    assert [i % 2 for i in ranks[0]["same"]["ids"]] == [0] * (SAMPLES // 2)
    for answer in ranks:
        outcome = answer["same"]
        assert not outcome["as_written"] and outcome["next_draw_is_unchanged"], outcome
        assert "IterableDataset (SameEverywhere), the same stream on every rank" in outcome["note"], outcome


@pytest.mark.timeout(300)
def test_a_rank_whose_stream_is_empty_or_fails_leaves_no_rank_waiting(ranks):
    # Rank 1's part of a one-sample stream is empty: a stream split by rank, kept as written.
    assert trained(ranks, "empty_on_one") == [0]
    assert all(answer["empty_on_one"]["as_written"] for answer in ranks)
    # Rank 1's stream raises: both ranks got past the comparison, and say the same.
    notes = {answer["fails_on_one"]["note"] for answer in ranks}
    assert len(notes) == 1, notes
    assert "could not be compared between the ranks (reading it raised RuntimeError: shard list unreachable)" in (
        notes.pop())


@pytest.mark.timeout(300)
def test_at_a_world_of_one_the_users_stream_is_kept_as_written(ranks):
    outcome = ranks[0]["world_of_one"]
    assert outcome["ids"] == list(range(SAMPLES))
    assert outcome["as_written"] and outcome["probe_iterations"] == 0, outcome
