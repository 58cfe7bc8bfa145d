"""summary.json's failures (observe/result.py), from the run monitor's events: a rank restarted in
place and a failure of the whole group list each rank by the same keys as ever, from the one
failure type (failures.FailureRecord), whatever the agent noted for the run monitor beside them."""

from __future__ import annotations

import json

from orchestrator import storage
from orchestrator.driver.resume import ResumeChoice
from orchestrator.failures import HANG, INFRASTRUCTURE, FailureRecord
from orchestrator.observe.result import RunResult, write_summary
from orchestrator.protocol import Failure, RankStarted, RestartInPlace
from orchestrator.spec import validate

# The keys summary.json lists for each failure and for each rank of it (tests and users read them).
ENTRY_KEYS = {"time", "classification", "ranks", "hang", "exhausted", "in_place"}
RANK_KEYS = {"rank", "kind", "error", "where", "node_id", "pid", "hostname", "step", "signature", "fault",
             "repeated", "note"}


def _summary(tmp_path, events) -> dict:
    job = validate({"name": "wire", "torch": {"train_loop": "classify_jobs:train_loop", "max_epochs": 1}})
    run_dir = storage.resolve(str(tmp_path / "wire"))
    result = RunResult.from_events(job, run_dir, events, ResumeChoice(None, None, "fresh run"), wall_seconds=1.0,
                                   error=None)
    write_summary(run_dir, result)
    return json.loads(storage.read_bytes(run_dir.join("summary.json")))


def test_each_failure_lists_its_ranks_by_the_usual_keys_in_place_or_of_the_whole_group(tmp_path):
    killed = FailureRecord(1, INFRASTRUCTURE, "the process was killed by SIGKILL", node_id="n", pid=9, hostname="h",
                           log="/runs/wire/logs/rank-1.log", decisive=True, last_lines=["step 3"])
    hang = {"kind": "hang", "attempt": 2, "ranks": [0], "message": "rank 0 stopped answering"}
    hung = FailureRecord(0, HANG, "rank 0 stopped answering", decisive=True, hang=hang)
    lost = FailureRecord(0, INFRASTRUCTURE, "RuntimeError: Connection closed by peer", node_id="n", pid=8)
    events = [RankStarted(rank=0, world_size=2, attempt=1, time=1.0),
              RestartInPlace(attempt=2, restarts=1, max_restarts=3, failure=killed, time=2.0),
              RestartInPlace(attempt=3, restarts=2, max_restarts=3, failure=hung, time=3.0),
              Failure(classification=INFRASTRUCTURE, ranks=[lost], time=4.0)]
    failures = _summary(tmp_path, events)["failures"]
    assert [set(f) for f in failures] == [ENTRY_KEYS] * 3
    assert [(f["classification"], f["in_place"]) for f in failures] == [
        ("infrastructure", True), ("hang", True), ("infrastructure", False)]
    # A rank's log where its agent knew it; never what the agent noted for the run monitor.
    assert [set(f["ranks"][0]) for f in failures] == [RANK_KEYS | {"log"}, RANK_KEYS, RANK_KEYS]
    assert failures[0]["ranks"][0]["log"] == "/runs/wire/logs/rank-1.log"
    assert failures[0]["ranks"][0]["hostname"] == "h" and failures[0]["ranks"][0]["pid"] == 9
    # A hang's verdict is the entry's.
    assert failures[1]["hang"] == hang and failures[0]["hang"] is None
