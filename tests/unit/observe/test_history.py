"""A run's history: one file a driver, read back oldest first, whatever else lies there
(observe/history.py)."""

from __future__ import annotations

import json

from orchestrator import storage
from orchestrator.observe import history
from orchestrator.protocol import CheckpointCommitted, Progress, RankStarted


def _entry(started: float, pid: int) -> dict:
    events = [RankStarted(rank=0, world_size=2, attempt=1, time=started + 1),
              Progress(attempt=1, step=5, time=started + 2),
              CheckpointCommitted(uri="file:///r/checkpoints/step-5", step=5, time=started + 3)]
    return history.record(started=started, ended=started + 10, host="vm", pid=pid, status="finished", error=None,
                          goodput={"productive_s": 4.0}, events=events, step_series={"0": [[started + 2, 1, 5]]})


def test_each_driver_keeps_a_file_of_its_own_and_they_read_back_oldest_first(tmp_path):
    run = storage.resolve(str(tmp_path / "run"))
    history.write(run, _entry(2_000_000_000.0, 7))
    history.write(run, _entry(1_900_000_000.0, 9))
    history.write(run, _entry(2_000_000_000.0, 7))  # the same driver again (a stop, then its end): one file
    entries, unreadable = history.load(run)
    assert unreadable == []
    assert [e["driver"]["pid"] for e in entries] == [9, 7]
    assert len(list((tmp_path / "run" / "history").iterdir())) == 2
    # Rank 0's progress reports are summary.json's: the time line needs the rest.
    assert [e["kind"] for e in entries[0]["events"]] == ["rank_started", "checkpoint"]


def test_a_damaged_or_foreign_file_is_named_and_the_others_still_read(tmp_path):
    run = storage.resolve(str(tmp_path / "run"))
    history.write(run, _entry(2_000_000_000.0, 7))
    folder = tmp_path / "run" / "history"
    (folder / "20300101T000000-vm-1.json").write_text("{not json")
    (folder / "20300101T000001-vm-2.json").write_text(json.dumps({"version": 99}))
    (folder / "notes.txt").write_text("mine")
    entries, unreadable = history.load(run)
    assert [e["driver"]["pid"] for e in entries] == [7]
    assert len(unreadable) == 2 and unreadable[0].startswith("20300101T000000-vm-1.json: ")
    assert "version 99, this orchestrator reads 1" in unreadable[1]


def test_a_run_without_history_reads_as_none(tmp_path):
    assert history.load(storage.resolve(str(tmp_path / "never"))) == ([], [])
