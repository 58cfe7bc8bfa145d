"""Processes found by their own ids (never by a broad name match), and how they are ended: a Ray
session's (the driver), a lease holder's (checkpoint/lease.py), a scratch folder's owner (rank/scratch.py).

A pid written down names the same process later only on the same host, kernel (boot id) and pid
namespace, and while the process with that pid has the start time written beside it: a lease
holder (checkpoint/lease.py) and a warm cluster's keeper (cluster/warm.py) are checked so.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from functools import cache

from orchestrator import procfs

# Seconds a SIGKILLed process is given to be gone: the kernel frees a large process's memory
# before it ends, which takes a moment, and a caller that returns meanwhile leaves it behind.
KILLED_GONE_WITHIN_S = 5.0


def end_processes(pids: list[int], grace_s: float) -> None:
    """SIGTERM the processes and give them `grace_s` to end, then SIGKILL what is left
    (`grace_s` 0: SIGKILL at once); returns once they are gone (or KILLED_GONE_WITHIN_S passed)."""
    terminate(pids, grace_s)
    _signal([p for p in pids if is_alive(p)], signal.SIGKILL)
    _wait_gone(pids, KILLED_GONE_WITHIN_S)


def terminate(pids: list[int], grace_s: float) -> None:
    """SIGTERM the processes and wait up to `grace_s` for them to end (nothing when 0)."""
    if grace_s <= 0:
        return
    _signal(pids, signal.SIGTERM)
    _wait_gone(pids, grace_s)


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.05)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def is_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; it only waits for its parent to reap it.
    stat = procfs.stat(pid)
    return stat is None or not stat.zombie


def session_pids(session_dir: str) -> list[int]:
    """Live processes of one Ray session, found by what they hold, never by a broad name match.

    Ray's agents overwrite their command line ("ray::DashboardAgent"), so a process belongs to
    the session when its command line names the session directory or one of its open files lies
    inside it (every Ray process keeps its log files there open).
    """
    session_dir = os.path.realpath(session_dir.rstrip("/"))
    pids = []
    for pid in procfs.pids():
        if pid == os.getpid() or not is_alive(pid):
            continue
        cmdline = procfs.cmdline(pid)
        if cmdline is None:
            continue  # the process ended, or is not ours to inspect
        if session_dir in cmdline or any(path.startswith(session_dir + "/") for path in procfs.open_files(pid)):
            pids.append(pid)
    return pids


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` in the process tree (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in procfs.pids():
        stat = procfs.stat(entry)
        if stat is not None:  # (else it ended meanwhile)
            children.setdefault(stat.ppid, []).append(entry)
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(below)
    return [p for p in found if is_alive(p)]


@cache
def kernel_and_pid_namespace() -> tuple[str | None, str | None]:
    """This kernel's boot id and this process's pid namespace (the inode of /proc/self/ns/pid);
    None for what cannot be read (off Linux)."""
    return procfs.boot_id(), procfs.pid_namespace()


def pid_started(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None where unavailable."""
    stat = procfs.stat(pid)
    return stat.started if stat is not None else None


def pid_means_here(host: str | None, boot_id: str | None, pid_ns: str | None) -> bool:
    """Whether a pid recorded with this host, boot id and pid namespace names a process of this
    host's pid table; False when any of them is unknown (a record that does not say)."""
    here = (socket.gethostname(), *kernel_and_pid_namespace())
    theirs = (host, boot_id, pid_ns)
    return None not in here and here == theirs
