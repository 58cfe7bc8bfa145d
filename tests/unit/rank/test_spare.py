"""A spare's priority (rank/spare.py), on real spares under the bootstrap as an agent starts them:
humble while it imports, as a session too, and its rank's priority back the moment it is handed
an attempt, even mid-import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.agent.children import BOOTSTRAP
from orchestrator.rank.spare import SPARE_NICENESS

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="this kernel has no scheduler autogroups"),
    # A spare lowers its priority only where it may take it back; this process stands for the agent.
    pytest.mark.skipif(os.geteuid() != 0 or os.getpriority(os.PRIO_PROCESS, 0) != 0,
                       reason="needs the privilege to take niceness 0 back (root), from niceness 0"),
]


def _session(pid: int) -> int:
    with open(f"/proc/{pid}/autogroup") as f:  # "/autogroup-123 nice 19"
        return int(f.read().split()[-1])


def _threads(pid: int) -> set[int]:
    """The niceness of each of the process's threads (Linux's niceness is per thread)."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                found.add(int(f.read().rsplit(")", 1)[1].split()[16]))
        except (OSError, IndexError):
            pass  # a thread that just ended
    return found


def _until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.fixture
def spare(tmp_path, request):
    """A spare whose one module blocks its import until the test lets it go (tmp_path / "go"),
    and whose script writes its niceness and its session's once handed its attempt; a next
    attempt's (--spare), or, parametrized so, a local run's first rank (--first)."""
    flag = getattr(request, "param", "--spare")
    (tmp_path / "held_import.py").write_text(
        "import os, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a thread of the import's own\n"
        f"while not os.path.exists({str(tmp_path / 'go')!r}):\n"
        "    time.sleep(0.02)\n")
    (tmp_path / "script.py").write_text(
        "import json, os\n"
        "session = int(open('/proc/self/autogroup').read().split()[-1])\n"
        f"json.dump([os.getpriority(os.PRIO_PROCESS, 0), session], open({str(tmp_path / 'ran')!r}, 'w'))\n")
    process = subprocess.Popen([sys.executable, BOOTSTRAP, flag, "held_import", str(tmp_path / "script.py")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True, cwd=tmp_path,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stdin.close()


def _hand_over(process, tmp_path) -> None:
    process.stdin.write(json.dumps({**os.environ, "PYTHONPATH": str(tmp_path)}) + "\n")
    process.stdin.flush()


def test_a_spare_imports_at_the_lowest_priority_as_a_session_too(spare, tmp_path):
    # Its session's share counts first where autogroups are on: at 0 it would take a full one.
    assert _until(lambda: _session(spare.pid) == SPARE_NICENESS and SPARE_NICENESS in _threads(spare.pid))
    (tmp_path / "go").touch()
    _hand_over(spare, tmp_path)
    assert spare.wait(timeout=60) == 0, spare.stdout.read()
    assert json.loads((tmp_path / "ran").read_text()) == [0, 0]


def test_a_spare_handed_its_attempt_mid_import_takes_its_priority_back_at_once(spare, tmp_path):
    assert _until(lambda: _session(spare.pid) == SPARE_NICENESS and SPARE_NICENESS in _threads(spare.pid))
    _hand_over(spare, tmp_path)
    # While its import still blocks: every thread and its session at the rank's niceness, so a rank
    # started from a spare never begins at 19 (under load it would beat too late for the watchdog).
    assert _until(lambda: _session(spare.pid) == 0 and _threads(spare.pid) == {0}), \
        (_session(spare.pid), _threads(spare.pid))
    assert spare.poll() is None and not (tmp_path / "ran").exists()
    (tmp_path / "go").touch()
    assert spare.wait(timeout=60) == 0, spare.stdout.read()
    assert json.loads((tmp_path / "ran").read_text()) == [0, 0]


def test_a_spare_not_needed_ends_at_once_even_mid_import(spare, tmp_path):
    assert _until(lambda: SPARE_NICENESS in _threads(spare.pid))
    spare.stdin.close()  # the agent's end of its pipe: no attempt for it
    assert spare.wait(timeout=30) == 0, spare.stdout.read()  # its import still blocked: it did not wait for it
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("spare", ["--first"], indirect=True)
def test_a_local_runs_first_rank_started_ahead_yields_as_a_process_but_keeps_its_sessions_share(spare, tmp_path):
    # Its imports are as much the way to the first step as the command's own start beside it.
    assert _until(lambda: SPARE_NICENESS in _threads(spare.pid))
    assert _session(spare.pid) == 0
    _hand_over(spare, tmp_path)
    assert _until(lambda: _threads(spare.pid) == {0}), _threads(spare.pid)
    (tmp_path / "go").touch()
    assert spare.wait(timeout=60) == 0, spare.stdout.read()
    assert json.loads((tmp_path / "ran").read_text()) == [0, 0]
