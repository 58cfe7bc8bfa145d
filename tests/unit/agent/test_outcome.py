"""What a rank child's end says (agent/outcome.py), from a real rank under the bootstrap: the exception
a rank wrote before it ended is its failure, even when its process then died by a signal in the
interpreter's teardown, as torch 2.13's gloo at times aborts there."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.agent.children import BOOTSTRAP, Child
from orchestrator.agent.outcome import failure_of


def _ended(tmp_path, body: str) -> Child:
    script = tmp_path / "train.py"
    script.write_text(body)
    failure_file = str(tmp_path / "failure.json")
    process = subprocess.Popen([sys.executable, BOOTSTRAP, str(script)], stderr=subprocess.DEVNULL,
                               env={**os.environ, "ORCHESTRATOR_FAILURE_FILE": failure_file})
    process.wait(timeout=120)
    return Child(0, 1, process, str(tmp_path / "beat"), failure_file, str(tmp_path / "rank-1.log"))


def test_an_exception_then_an_abort_in_teardown_is_the_exception(tmp_path):
    child = _ended(tmp_path, "import atexit, os\natexit.register(os.abort)\nraise OSError(5, 'the storage does not answer')\n")
    assert child.process.returncode < 0  # it did die by SIGABRT
    failure = failure_of(child, "node", "host")
    assert "OSError" in failure["error"] and "the storage does not answer" in failure["error"], failure
    assert failure["rank"] == 1 and failure["kind"] == "infrastructure"


def test_a_rank_killed_by_a_signal_without_an_exception_says_so(tmp_path):
    child = _ended(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    failure = failure_of(child, "node", "host")
    assert failure["error"].startswith("the process was killed by SIGKILL") and failure["decisive"]
