"""The gloo side group beside NCCL (rank/collectives.py) on a real 2-process torch world.

It is formed before any heartbeat, so nothing but its own timeout ends a group that never forms
(a host name that resolves to 127.0.1.1 without GLOO_SOCKET_IFNAME): that timeout is the spec's
failure.hang_timeout_s, and the error says what to set. Once formed, its collectives keep the
long timeout of the training process group: a rank that reaches one late is not an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, free_port

from orchestrator.failures import INFRASTRUCTURE

HELPER = os.path.join(REPO, "tests", "helpers", "jobdriver_gloo_rank.py")
HANG_TIMEOUT_S = 3.0


def _two_ranks(mode: str) -> dict:
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": REPO}
    other = subprocess.Popen([sys.executable, HELPER, "1", port, mode, str(HANG_TIMEOUT_S)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rank0 = subprocess.run([sys.executable, HELPER, "0", port, mode, str(HANG_TIMEOUT_S)], env=env,
                               capture_output=True, text=True, timeout=120)
    finally:
        other.kill()  # rank 1 of `absent` is still waiting; ended by its own pid
        other.wait()
    lines = [line for line in rank0.stdout.splitlines() if line.startswith("{")]
    assert rank0.returncode == 0 and lines, rank0.stdout + rank0.stderr
    return json.loads(lines[-1])


@pytest.mark.timeout(150)
def test_a_side_group_that_never_forms_fails_after_hang_timeout_s_and_says_what_to_set():
    answer = _two_ranks("absent")
    # torch's default would have waited 1800 s; forming the group twice costs nothing here.
    assert HANG_TIMEOUT_S - 0.5 < answer["seconds"] < HANG_TIMEOUT_S + 10, answer
    assert answer["error_type"] == "GlooGroupError", answer
    message = answer["error"]
    assert f"did not form within {HANG_TIMEOUT_S:g} s (failure.hang_timeout_s)" in message
    for words in ("GLOO_SOCKET_IFNAME", "`hostname -i`", "127.0.1.1", "Fix:"):
        assert words in message, message
    # torch's own error is kept as the cause, so the failure is retried like a lost connection.
    assert answer["cause_type"].startswith("Dist") and answer["kind"] == INFRASTRUCTURE, answer


@pytest.mark.timeout(150)
def test_a_formed_side_group_waits_for_a_late_rank_longer_than_hang_timeout_s():
    answer = _two_ranks("late")
    assert "error" not in answer, answer
    assert answer["value"] == {"from": "rank 0"}
    assert answer["seconds"] > 2 * HANG_TIMEOUT_S - 0.5, answer  # it did wait that long
