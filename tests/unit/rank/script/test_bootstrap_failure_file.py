"""The failure file a rank's bootstrap writes (rank/script/bootstrap.py) is a FailureRecord's JSON
(failures.py), which its agent reads back with FailureRecord.from_dict: one type from the rank's
process to summary.json, with no list of fields in between."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields

from orchestrator.agent.children import BOOTSTRAP
from orchestrator.failures import EXIT, INFRASTRUCTURE, FailureRecord
from orchestrator.rank.agent_contract import FAILURE_FILE_VAR


def _written(tmp_path, body: str) -> dict:
    script = tmp_path / "train.py"
    script.write_text(body)
    failure_file = tmp_path / "failure.json"
    done = subprocess.run([sys.executable, BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, FAILURE_FILE_VAR: str(failure_file), "RANK": "5"})
    assert done.returncode != 0, done.stderr
    return json.loads(failure_file.read_text())


def test_an_uncaught_exception_is_written_as_its_record_and_read_back_as_it(tmp_path):
    written = _written(tmp_path, "def load():\n    raise OSError(5, 'the storage does not answer')\nload()\n")
    assert set(written) == {f.name for f in fields(FailureRecord)}
    record = FailureRecord.from_dict(written)
    assert (record.rank, record.kind) == (5, INFRASTRUCTURE)
    assert record.error == "OSError: [Errno 5] the storage does not answer" and "train.py:2 in load" in record.where


def test_a_scripts_own_exit_status_is_written_without_the_package_and_reads_as_an_exit(tmp_path):
    written = _written(tmp_path, "import sys\nsys.exit(3)\n")
    record = FailureRecord.from_dict({**written, "rank": 5})  # the agent adds where the rank ran
    assert record.kind == EXIT and record.error == "the script exited with status 3 (sys.exit)"
