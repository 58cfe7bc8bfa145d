"""A rank waiting on torch's extension build lock that no build holds.

torch builds a C++/CUDA op (DeepSpeed's ops, a custom kernel) once per build folder: the first
process creates `<folder>/lock` (torch/utils/file_baton.py), runs ninja in that folder and removes
the lock; every other process polls until the file is gone, even when the op is built already. A
build killed midway (a rank SIGKILLed, a node lost, Ctrl-C twice) leaves the file, and every later
run on that machine waits for it for ever, saying nothing; the run's startup limit (30 minutes by
default) ends it at last with a stack that only says `file_baton.py in wait`.

The heartbeat thread (heartbeat.py) asks `waited_on` where the training thread stands; a
`StaleLockWatch` says when the wait has gone on for STALE_AFTER_S with no build seen in the
folder, and the rank tells the run once (`warning`).
"""

from __future__ import annotations

import os
import socket
from types import FrameType

from orchestrator import procfs

# torch's file lock's module and its waiting loop.
BATON_FILE = os.path.join("torch", "utils", "file_baton.py")
# Seconds of waiting with no build process seen before the lock counts as left behind: a build
# shows its ninja (and compilers) in the folder the whole time, bar a moment before ninja starts.
STALE_AFTER_S = 30.0


def waited_on(frame: FrameType | None) -> str | None:
    """The lock file a thread waits for, if `frame` (its innermost) is torch's FileBaton.wait."""
    if frame is None or frame.f_code.co_name != "wait" or not frame.f_code.co_filename.endswith(BATON_FILE):
        return None
    path = getattr(frame.f_locals.get("self"), "lock_file_path", None)
    return path if isinstance(path, str) else None


def building_in(folder: str) -> bool:
    """Whether a process of this machine works in `folder`: torch runs ninja, and ninja its
    compilers, there (cpp_extension's _run_ninja_build). Processes this user may not see count
    as not building."""
    folder = os.path.realpath(folder)
    for pid in procfs.pids():
        cwd = procfs.cwd(pid)  # None: gone, or another user's
        if cwd is not None and (cwd == folder or cwd.startswith(folder + os.sep)):
            return True
    return False


class StaleLockWatch:
    """Follows one thread's waits on build locks; says each left-behind lock once."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S):
        self.stale_after_s = stale_after_s
        self._lock: str | None = None
        self._clear_since = 0.0
        self._said: set[str] = set()

    def observe(self, lock: str | None, now: float) -> str | None:
        """Take where the thread waits now (None: on no lock); the lock, the moment its wait has
        gone on `stale_after_s` with no build seen in its folder (else None)."""
        if lock != self._lock:
            self._lock, self._clear_since = lock, now
        if lock is None or lock in self._said:
            return None
        if building_in(os.path.dirname(lock)):
            self._clear_since = now
            return None
        if now - self._clear_since < self.stale_after_s:
            return None
        self._said.add(lock)
        return lock


def warning(lock: str, node_id: str, waited_s: float = STALE_AFTER_S) -> str:
    """The run's one-paragraph warning (the same from every rank of a node: said once), with the
    fix that fits what the killed build left: the op built already, or not."""
    folder = os.path.dirname(lock)
    try:
        built = sorted(name for name in os.listdir(folder) if name.endswith(".so"))
    except OSError:
        built = []
    fix = (f"the op is built ({built[0]}): delete the file, and the waiting ranks go on at once" if built else
           f"the op was never built: stop the run, delete the folder {folder} and run again, which builds it afresh")
    return (f"torch's build lock {lock} has held the ranks on node {node_id[:12] or '?'} (host "
            f"{socket.gethostname()}) for more than {waited_s:.0f} s, and no process there is building in its "
            "folder. torch builds a C++/CUDA op (DeepSpeed's, a custom kernel) under this lock; a build killed "
            "midway (a rank ended by SIGKILL, a lost node) leaves the file behind, and every later run there "
            f"waits for it for ever. Fix, unless another machine builds in that folder (a shared home): {fix}.")
