"""The processes a run started, found by the test itself: every process whose environment holds
one of the run's own marks (a variable the test gave the run a value of its own for, such as its
TMPDIR), seen by a scan of /proc while the run is live. What the product does to end its processes
(its sessions, its sweeper, its own mark) plays no part: a process it forgot is still found here.

A pid is kept with its start time (/proc/PID/stat, field 22), so a pid the kernel has given to
another process since is not taken for the run's.
"""

from __future__ import annotations

import os
import threading
import time

# Seconds between two scans: the run's processes live for seconds at least (a rank, a spare).
SCAN_S = 1.0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def _environ(pid: int) -> set[str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return set(f.read().decode(errors="replace").split("\0"))
    except OSError:
        return None


class ProcessesOfRun:
    """While in its `with` block, every process whose environment holds one of `marks` (name ->
    value): `seen` (pid -> (start time, command line)), and `alive()` afterwards."""

    def __init__(self, **marks: str):
        self.entries = {f"{name}={value}" for name, value in marks.items()}
        self.seen: dict[int, tuple[int, str]] = {}
        self._other: dict[tuple[int, int], int] = {}  # (pid, start) -> scans seen without a mark
        self._done = threading.Event()
        self._lock = threading.Lock()  # the watch's thread and a test's own scan() share the tables
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ProcessesOfRun:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=30)
        self.scan()  # what is there at the end of the block too

    def _watch(self) -> None:
        while not self._done.is_set():
            self.scan()
            self._done.wait(SCAN_S)

    def scan(self) -> None:
        with self._lock:
            self._scan()

    def _scan(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            stat = _stat(pid)
            if stat is None or pid in self.seen or self._other.get((pid, stat[1]), 0) >= 2:
                continue  # gone, known, or seen twice without a mark (not between a fork and its exec)
            environ = _environ(pid)
            if environ is not None and environ & self.entries:
                self.seen[pid] = (stat[1], _command_line(pid))
            elif environ is not None:
                self._other[(pid, stat[1])] = self._other.get((pid, stat[1]), 0) + 1

    def alive(self) -> dict[int, str]:
        """The processes seen that still run (the same start time, not a zombie): pid -> command line."""
        left = {}
        with self._lock:
            seen = dict(self.seen)
        for pid, (start, command) in seen.items():
            stat = _stat(pid)
            if stat is not None and stat[1] == start and stat[0] not in ("Z", "X"):
                left[pid] = f"{command} (state {stat[0]})"
        return left

    def assert_all_gone(self, within_s: float = 3.0) -> None:
        """Every process seen has ended, give or take `within_s` for the kernel to free a SIGKILLed
        one's memory; and some were seen at all, or the check could not have failed."""
        assert self.seen, f"no process carrying {sorted(self.entries)} was ever seen: the watch saw nothing"
        deadline = time.monotonic() + within_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.alive()
        assert not left, f"processes of the run still alive after it ended: {left}"


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return "?"
