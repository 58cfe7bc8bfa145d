"""A rank held by torch's extension build lock that a killed build left behind is named to the run
once, with the lock and the fix; a build that holds the lock (its ninja working in the folder)
is waited for in silence. The rank waits in torch's own FileBaton, as DeepSpeed's op builds do."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from torch.utils.file_baton import FileBaton

from orchestrator.protocol import BeatReply, RunWarning
from orchestrator.rank import build_lock
from orchestrator.rank.heartbeat import Heartbeat

STALE_AFTER_S = 1.5


class Monitor:
    """What a rank's heartbeat talks to (rank/agent_link.py's AgentLink), keeping what it heard."""

    def __init__(self):
        self.beats, self.warnings = [], []

    def beat(self, attempt, beat, timeout_s):
        self.beats.append((time.monotonic(), beat))
        return BeatReply()

    def send(self, event):
        if isinstance(event, RunWarning):
            self.warnings.append((time.monotonic(), event.message))


def _rank_waiting_on(lock: str, monitor: Monitor) -> threading.Thread:
    """A training thread, with its heartbeat, that waits on `lock` the way torch's op builds do."""
    def train():
        heartbeat = Heartbeat(monitor, 1, 0, node_id="a1b2c3d4e5f6a7b8", interval_s=0.2,
                              stale_lock_after_s=STALE_AFTER_S).start()
        try:
            FileBaton(lock).wait()
        finally:
            heartbeat.close()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    return thread


def _until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_lock_no_build_holds_is_named_once_with_its_path_and_the_fix(tmp_path):
    folder = tmp_path / "fused_adam"
    folder.mkdir()
    (folder / "fused_adam.so").write_bytes(b"")
    lock = folder / "lock"
    lock.touch()
    monitor = Monitor()
    thread = _rank_waiting_on(str(lock), monitor)
    try:
        _until(lambda: monitor.warnings)
        waiting = [b for _, b in monitor.beats if f"waiting for torch's build lock {lock}" in b.frame]
        assert waiting, "the beats say where the rank waits, for the hang verdict"
        time.sleep(5 * 0.2)
        assert len(monitor.warnings) == 1, monitor.warnings
        message = monitor.warnings[0][1]
        assert str(lock) in message and "node a1b2c3d4e5f6" in message and "for more than 2 s" in message
        assert "the op is built (fused_adam.so): delete the file" in message
    finally:
        lock.unlink()
        thread.join(timeout=10)
    assert not thread.is_alive(), "the rank goes on once the file is gone"


def test_a_build_working_in_the_folder_is_waited_for_and_its_lock_named_once_it_is_gone(tmp_path):
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    lock = folder / "lock"
    lock.touch()
    builder = subprocess.Popen(["sleep", "60"], cwd=folder)  # as torch runs ninja: in the build folder
    monitor = Monitor()
    thread = _rank_waiting_on(str(lock), monitor)
    try:
        # Watched for three times the limit while the build works: not a word.
        _until(lambda: any("build lock" in b.frame for _, b in monitor.beats))
        first = next(t for t, b in monitor.beats if "build lock" in b.frame)
        _until(lambda: monitor.beats[-1][0] - first > 3 * STALE_AFTER_S)
        assert monitor.warnings == []
        builder.kill()
        builder.wait()
        ended = time.monotonic()
        _until(lambda: monitor.warnings)
        assert monitor.warnings[0][0] - ended >= STALE_AFTER_S - 0.3
        assert f"the op was never built: stop the run, delete the folder {folder}" in monitor.warnings[0][1]
    finally:
        builder.kill()
        builder.wait()
        lock.unlink()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_thread_not_in_torchs_wait_is_on_no_lock():
    assert build_lock.waited_on(None) is None
    assert build_lock.waited_on(sys._getframe()) is None
    assert build_lock.building_in(os.getcwd())  # this process works there
