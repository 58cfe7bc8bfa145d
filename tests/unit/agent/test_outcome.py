"""What a rank child's end says (agent/outcome.py), from a real rank under the bootstrap: the exception
a rank wrote before it ended is its failure, even when its process then died by a signal in the
interpreter's teardown, as torch 2.13's gloo at times aborts there, or was ended by its agent while
on its way out with that exception."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import wait_for

from orchestrator.agent.children import BOOTSTRAP, Child, LocalRanks, Placement
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
    assert "OSError" in failure.error and "the storage does not answer" in failure.error, failure
    assert failure.rank == 1 and failure.kind == "infrastructure"


def test_a_rank_killed_by_a_signal_without_an_exception_says_so(tmp_path):
    child = _ended(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    failure = failure_of(child, "node", "host")
    assert failure.error.startswith("the process was killed by SIGKILL") and failure.decisive


# A rank whose training raised, said so (as a ctx or Lightning rank's session does), and then spends
# sys.argv[1] seconds in the exception's handlers (a Lightning callback's on_exception, a teardown).
FAILING = """import sys, time
from orchestrator.rank.script.bootstrap import mark_failing
try:
    {}["no such feature"]
except KeyError as exc:
    mark_failing(exc)
    time.sleep(float(sys.argv[1]))
    raise
"""


def _failing_rank(tmp_path, handler_s: float) -> LocalRanks:
    script = tmp_path / "train.py"
    script.write_text(FAILING)
    placement = Placement(group_rank=0, group_world_size=1, local_world_size=1, master_addr="127.0.0.1",
                          master_port=29500, attempt=1, max_restarts=0, run_id="failing")
    return LocalRanks([str(script), str(handler_s)], cwd=str(tmp_path), base_env=dict(os.environ),
                      placement=placement, scratch=str(tmp_path / "scratch"), log_dir=str(tmp_path / "logs"))


def test_a_rank_on_its_way_out_that_never_ends_is_ended_after_the_grace_and_its_own_error_reported(tmp_path):
    ranks = _failing_rank(tmp_path, handler_s=600)
    child = ranks.children[0]
    try:
        wait_for(lambda: child.failing_for() is not None, timeout=60)
        wait_for(lambda: ranks.end_failing(grace_s=1.0) or child.process.poll() is not None, timeout=30)
        assert child.process.returncode == -signal.SIGKILL
        failure = failure_of(child, "node", "host")
        assert failure.error == "KeyError: 'no such feature'" and failure.kind == "user", failure
        assert "train.py:4" in failure.where and failure.decisive, failure
        assert "had not ended within failure.hang_timeout_s of this error" in failure.note, failure
    finally:
        ranks.stop()


def test_a_rank_on_its_way_out_that_ends_within_the_grace_is_left_to_end(tmp_path):
    ranks = _failing_rank(tmp_path, handler_s=0.5)
    child = ranks.children[0]
    try:
        wait_for(lambda: ranks.end_failing(grace_s=30.0) or child.process.poll() is not None, timeout=60)
        assert child.process.returncode == 1  # its own exit, not the agent's SIGKILL
        failure = failure_of(child, "node", "host")
        assert failure.error == "KeyError: 'no such feature'" and not failure.note, failure
    finally:
        ranks.stop()
