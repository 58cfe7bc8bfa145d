"""Classification through real runs: a damaged Parquet row group fails the run after one retry as
the user's data, naming the file and the row group; a run taken over by a newer driver stops as
taken over, not as a bug in the training code."""

from __future__ import annotations

import json
import os
import socket

import pytest
from classify_jobs import damage_row_group, write_rows
from cli_runs import failure_of, run_command

pytestmark = pytest.mark.slow


def _spec(name, tmp_path, data, **config):
    return {"name": name, "storage": str(tmp_path / "runs"), "seed": 0,
            "torch": {"train_loop": "classify_jobs:train_loop", "max_epochs": 1, "config": config},
            "data": {"train": {"path": data, "columns": {"id": {}, "x": {"dtype": "float32"}}, "batch_size": 8,
                               "shuffle": False}},
            "scaling": {"num_workers": 1}, "checkpoint": {"every_n_steps": 10}}


@pytest.mark.timeout(300)
def test_a_damaged_row_group_fails_the_run_after_one_retry_as_the_users_data_naming_the_file_and_row_group(
        tmp_path):
    # 400 rows in row groups of 50, read in order 8 a step: row group 5 (rows 250-299) is first
    # needed by step 32. Checkpoints every 10 steps: the retry resumes at step 30 and replays it.
    data = write_rows(tmp_path / "ids.parquet", 400, row_group=50)
    damage_row_group(data, 5)
    spec = _spec("damaged", tmp_path, data)
    spec["failure"] = {"max_failures": 2}
    message = failure_of(run_command(spec, str(tmp_path)))

    summary = json.loads((tmp_path / "runs" / "damaged" / "summary.json").read_text())
    # The first failure may be a storage hiccup: retried once. The same one at the same step is not.
    assert [f["classification"] for f in summary["failures"]] == ["infrastructure", "user"]
    assert [s["restored_step"] for s in summary["starts"]] == [None, 30]
    first, again = (f["ranks"][0] for f in summary["failures"])
    assert first["step"] == again["step"] == 31 and first["signature"] == again["signature"]
    assert again["repeated"] and not first["repeated"]
    for text in (again["error"], message):
        assert "row group 5 of" in text and data in text and "Couldn't deserialize thrift" in text
    assert "failed on attempt 2" in message and "the same step (31)" in message and "data" in message
    assert "error in the training code" not in message


@pytest.mark.timeout(300)
def test_a_run_taken_over_by_a_newer_driver_stops_as_taken_over_naming_the_newer_holder(tmp_path):
    # At step 12 a newer driver (generation 2: this test's pid) takes the run over; the workers'
    # next commit (step 20) finds lease.json no longer theirs.
    data = write_rows(tmp_path / "ids.parquet", 400, row_group=50)
    spec = _spec("taken-over", tmp_path, data, take_over_at=12, newer_pid=os.getpid(),
                 run_dir=str(tmp_path / "runs" / "taken-over"))
    spec["failure"] = {"max_failures": 2}
    done = run_command(spec, str(tmp_path))
    message, lines = failure_of(done), done.stdout.splitlines()
    assert message.startswith("run 'taken-over' stopped on this driver: another driver took the run over")
    assert f"generation 2 now holds it (host {socket.gethostname()}, pid {os.getpid()})" in message
    assert "error in the training code" not in message
    # Not retried: one worker group, and its failure said why.
    assert sum("workers up" in line for line in lines) == 1, lines
    assert any(line.startswith("failure (taken_over): ") for line in lines), lines
    # The run directory is the newer driver's now: this one leaves its summary.json alone.
    assert not (tmp_path / "runs" / "taken-over" / "summary.json").exists()
