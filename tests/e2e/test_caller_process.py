"""A local run from Python shares its caller's process (docs/python-api.md, "Your own process in
local mode"): it ends what its ranks started, wherever that went, and nothing of the caller's. One
caller (tests/helpers/caller_process.py) holds a child of its own across two local runs of a
torchrun script at once (two threads), orphans a grandchild of its own while they train, and each
run's rank starts a daemon outside its session (setsid)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

CALLER = os.path.join(REPO, "tests", "helpers", "caller_process.py")


def _kill_left(folder) -> None:
    """What the runs' ranks started, by the pids they wrote, if a failed check left them."""
    for name in ("first.daemon", "second.daemon", "first.rank", "second.rank"):
        try:
            os.kill(int((folder / name).read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.mark.timeout(300)
def test_a_local_run_from_python_ends_its_ranks_daemons_and_leaves_the_callers_children_orphans_and_other_run(
        tmp_path):
    try:
        done = subprocess.run([sys.executable, CALLER, str(tmp_path), "--beside"], capture_output=True, text=True,
                              cwd=REPO, timeout=240, env={**os.environ, "PYTHONPATH": REPO})
    finally:
        _kill_left(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["first_line"].startswith("local mode:"), seen
    for run in ("first", "second"):
        assert (seen[run]["status"], seen[run]["restarts"]) == ("finished", 0), seen
        # Its rank's daemon left the rank's session, and still did not outlive the run.
        assert not seen[run]["daemon_alive"], seen
    # The caller's own child ran on through the run, and its status is its own: SIGTERM's, not a
    # 0 made up because the run had already waited for it.
    assert seen["own_alive"] and seen["own_wait"] == -signal.SIGTERM, seen
    # The grandchild the caller orphaned during the run was neither adopted nor ended by it.
    assert seen["orphan_alive"], seen
    # The first run's end ended nothing of the second's, which was still training beside it.
    assert seen["second_while_first_ended"] == {"rank": True, "daemon": True}, seen
