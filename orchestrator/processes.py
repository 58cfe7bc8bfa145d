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
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def session_pids(session_dir: str) -> list[int]:
    """Live processes of one Ray session, found by what they hold, never by a broad name match.

    Ray's agents overwrite their command line ("ray::DashboardAgent"), so a process belongs to
    the session when its command line names the session directory or one of its open files lies
    inside it (every Ray process keeps its log files there open).
    """
    session_dir = os.path.realpath(session_dir.rstrip("/"))
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not is_alive(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            if session_dir in cmdline or any(
                os.readlink(f"/proc/{entry}/fd/{fd}").startswith(session_dir + "/")
                for fd in os.listdir(f"/proc/{entry}/fd")
            ):
                pids.append(int(entry))
        except OSError:
            continue  # the process ended, or is not ours to inspect
    return pids


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` in the process tree (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        children.setdefault(parent, []).append(int(entry))
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
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip() or None
    except OSError:
        boot_id = None
    try:
        pid_ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pid_ns = None
    return boot_id, pid_ns


def pid_started(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_means_here(host: str | None, boot_id: str | None, pid_ns: str | None) -> bool:
    """Whether a pid recorded with this host, boot id and pid namespace names a process of this
    host's pid table; False when any of them is unknown (a record that does not say)."""
    here = (socket.gethostname(), *kernel_and_pid_namespace())
    theirs = (host, boot_id, pid_ns)
    return None not in here and here == theirs
