"""What Linux's /proc says of a process, read in one place: its stat line, environment, command
line, open files, directory and threads; this process's scheduler autogroup and capabilities; the
kernel's boot id, the pid namespace and the CPU's model.

Every reader answers None (or nothing) for a process that is gone, another user's, or off Linux:
a process can end between a listing of /proc and the read of its files, and callers take that as
"not there". Standard library only, and importing nothing of the package: a rank's spare
(rank/spare.py) and the agent's sweeper (agent/sessions.py) load this file by its path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Clock ticks a second, the unit of stat's CPU times and start time.
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The bit of CAP_SYS_NICE in a capability set (capabilities(7)).
CAP_SYS_NICE = 23


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat (proc(5)) the orchestrator reads."""

    state: str  # R, S, D, T (stopped), t (traced), Z (zombie), ...
    ppid: int
    pgrp: int
    session: int
    cpu_ticks: int  # user + system time
    started: str  # start time in clock ticks since boot, as written: a pid's reuse tells apart by it

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_ticks / TICK

    @property
    def zombie(self) -> bool:
        return self.state == "Z"

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP) or a debugger: it runs nothing until continued."""
        return self.state in ("T", "t")


def parse_stat(line: str) -> Stat | None:
    """One /proc/<pid>/stat line; None for one cut short. The command name, in parentheses, may
    hold spaces and parentheses itself: the fields are those after its last ')'."""
    try:
        fields = line.rsplit(")", 1)[1].split()
        # After the command: state(3), ppid(4), pgrp(5), session(6), ..., utime(14), stime(15), ..., starttime(22).
        return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[11]) + int(fields[12]),
                    fields[19])
    except (IndexError, ValueError):
        return None


def stat(pid: int | str) -> Stat | None:
    """/proc/<pid>/stat, parsed; None for a process that is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat(f.read())
    except OSError:
        return None


def pids() -> list[int]:
    """Every process id /proc lists now."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def environ(pid: int) -> list[bytes] | None:
    """The `NAME=value` entries a process was started with (a fork's are its parent's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def cmdline(pid: int) -> str | None:
    """The process's command line, its arguments joined by NUL, as the process last wrote it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def open_files(pid: int) -> list[str]:
    """Where each of the process's open file descriptors points."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    found = []
    for fd in fds:
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
    return found


def cwd(pid: int | str) -> str | None:
    """The process's working directory."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def threads(pid: int | str = "self") -> list[int]:
    """The ids of the process's threads (the main thread's is its pid)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if tid.isdigit()]
    except OSError:
        return []


def autogroup_niceness() -> int | None:
    """This process's session's niceness (its scheduler autogroup's), or None without autogroups."""
    try:
        with open("/proc/self/autogroup") as f:  # "/autogroup-123 nice 0"
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_niceness(niceness: int) -> bool:
    """The niceness of this process's session (its scheduler autogroup); False where it cannot be set."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(niceness))
        return True
    except OSError:
        return False


def effective_capabilities() -> int | None:
    """This process's effective capability set (/proc/self/status CapEff), as a bit mask."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("CapEff:")), 16)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def boot_id() -> str | None:
    """This kernel's boot id: a pid written down names the same process only under the same one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's pid namespace: the inode of /proc/self/ns/pid."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo's first)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration, IndexError):
        return None
