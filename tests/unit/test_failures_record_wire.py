"""One failure type end to end (failures.FailureRecord): the rank writes it as JSON, its agent reads it
back and completes it, the run monitor weighs it, Ray Train's controller gets it, summary.json lists
it. Its JSON comes back as the same record, and its kinds read as their plain strings everywhere."""

from __future__ import annotations

import json
import pickle

from orchestrator.failures import EXIT, GPU, HANG, INFRASTRUCTURE, USER, FailureKind, FailureRecord, Fault

# The keys summary.json has always listed for a rank of a failure (tests and users read them).
SUMMARY_KEYS = {"rank", "kind", "error", "where", "node_id", "pid", "hostname", "step", "signature", "fault",
                "repeated", "note"}


def _agents_record() -> FailureRecord:
    """A record as a rank's agent completes it (agent/outcome.py): the rank's own part, where it ran,
    its log, and how the run monitor is to weigh it."""
    return FailureRecord(rank=3, kind=INFRASTRUCTURE, error="OSError: [Errno 5] Input/output error",
                         where="train.py:12 in main", node_id="node-a", pid=4242, hostname="host-a", step=31,
                         signature="0123456789abcdef", fault=GPU, note="drain it", log="/runs/x/logs/rank-3.log",
                         decisive=True, last_lines=["Traceback", "OSError"], hang=None)


def test_a_record_comes_back_from_its_json_as_the_same_record_with_typed_kinds():
    record = _agents_record()
    again = FailureRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record
    assert type(again.kind) is FailureKind and type(again.fault) is Fault
    # Across Ray it travels as itself.
    assert pickle.loads(pickle.dumps(record)) == record


def test_a_written_record_missing_fields_or_with_unknown_ones_still_reads():
    """What a script's bootstrap writes without the package (its own sys.exit) has only some fields;
    the agent's place completes it."""
    written = {"kind": "exit", "error": "the script exited with status 3 (sys.exit)", "where": "", "signature": "",
               "written_by": "a newer bootstrap"}
    record = FailureRecord.from_dict({**written, "rank": 2, "pid": 77})
    assert (record.rank, record.kind, record.pid, record.step, record.fault) == (2, EXIT, 77, None, Fault.NONE)


def test_summary_lists_a_rank_by_its_usual_keys_and_its_log_only_where_an_agent_knew_it():
    record = _agents_record()
    assert set(record.to_dict(summary=True)) == SUMMARY_KEYS | {"log"}
    assert set(FailureRecord(0, USER, "ValueError: x").to_dict(summary=True)) == SUMMARY_KEYS
    # The full form carries the agent's notes for the monitor too.
    assert {"decisive", "last_lines", "hang"} <= set(record.to_dict())


def test_the_record_an_agent_raises_for_its_group_keeps_the_ranks_part_and_drops_the_agents_notes():
    record = _agents_record()
    group = record.for_group(USER, "its last lines: Traceback | OSError")
    expected = {**record.to_dict(summary=True), "kind": "user", "note": "its last lines: Traceback | OSError"}
    del expected["log"]
    assert group.to_dict(summary=True) == expected  # rank, error, place, step, signature, fault: all kept
    assert (group.log, group.decisive, group.last_lines, group.hang) == ("", False, [], None)
    assert record.decisive and record.log  # the agent's own record is left as it was


def test_kinds_read_as_their_plain_strings_in_json_logs_and_comparisons():
    assert json.dumps({"kind": HANG, "fault": GPU}) == '{"kind": "hang", "fault": "gpu"}'
    assert f"{USER} / {FailureKind.TAKEN_OVER}" == "user / taken_over" and str(Fault.NONE) == ""
    assert HANG == "hang" and {"hang": 1}[HANG] == 1
