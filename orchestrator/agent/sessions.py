"""A rank's processes, found by its session: what it forked is ended with it, and counted with it.

Each rank starts in a session of its own (its pid is the session id), so every process it starts
(a `subprocess`, a `multiprocessing.Pool`, DataLoader workers) is in that session unless it
starts one of its own. What a rank leaves is found by that id, wherever the kernel reparented it:
its helpers outlive it with PPID 1 otherwise (torchelastic closes its workers with `os.killpg`
for the same reason).

- `members(sid)` and `cpu_seconds(sids)` read /proc: the agent times each rank's liveness by the
  CPU its whole session uses (a rank waiting on its DataLoader workers is alive while they work);
- `end_sessions(sids)` ends every member: SIGTERM (SIGCONT for a stopped one), SIGKILL after a grace;
- `end_marked(mark(scratch), keep)` ends what left its rank's session (a daemon that called
  setsid): every process whose environment holds its agent's mark, which each rank is started
  with (children.py) and everything it starts inherits, wherever the kernel reparented it. Only
  what carries the mark is ended, and only a subreaper's own adopted zombies are waited for: in
  local mode the agent runs in its caller's process, whose other children are the caller's;
- `python sessions.py --sweep AGENT_PID FILE [MARK]` is the sweeper: a process the agent starts in
  a session of its own that outlives it. When the agent dies (SIGKILL, a lost Ray worker), it ends
  every session listed in FILE (the agent rewrites it at each start of its ranks) and every
  process carrying MARK, then exits.

Standard library only: the sweeper runs by path, with nothing of the orchestrator or Ray imported
(it loads the /proc reader, procfs.py, by its path too).
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _load_procfs():
    """orchestrator/procfs.py by its path, for the sweeper (run by path: the package is not imported)."""
    import importlib.util

    if "orchestrator_procfs" in sys.modules:
        return sys.modules["orchestrator_procfs"]
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "procfs.py")
    found = importlib.util.spec_from_file_location("orchestrator_procfs", path)
    module = sys.modules["orchestrator_procfs"] = importlib.util.module_from_spec(found)  # (its dataclass asks)
    found.loader.exec_module(module)
    return module


if __package__:
    from orchestrator import procfs
else:
    procfs = _load_procfs()

# prctl(2) options.
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# The variable each rank's environment holds its agent's mark in (`mark`).
MARK_VAR = "ORCHESTRATOR_AGENT_SCRATCH"
# Seconds between the sweeper's looks at its agent.
SWEEP_POLL_S = 0.5


def members(sids: set[int]) -> dict[int, int]:
    """Every live process in one of the sessions `sids`: pid -> its session id (zombies left out)."""
    found = {}
    for pid in procfs.pids():
        stat = procfs.stat(pid)
        if stat and not stat.zombie and stat.session in sids:
            found[pid] = stat.session
    return found


def cpu_seconds(sids: set[int]) -> dict[int, float]:
    """CPU seconds (user + system) each session's live processes have used: sid -> seconds."""
    used = dict.fromkeys(sids, 0.0)
    for pid in procfs.pids():
        stat = procfs.stat(pid)
        if stat and stat.session in used:
            used[stat.session] += stat.cpu_seconds
    return used


def _signal_all(pids, signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def end_sessions(sids: set[int], grace_s: float = 2.0) -> int:
    """End every process of the sessions `sids`: SIGTERM and SIGCONT, then SIGKILL to what is left
    after `grace_s`. Returns how many processes it found."""
    if not sids:
        return 0
    found = members(sids)
    if not found:
        return 0
    _signal_all(found, signal.SIGTERM)
    _signal_all(found, signal.SIGCONT)  # a stopped process acts on the SIGTERM only once continued
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not members(sids):
            return len(found)
        time.sleep(0.05)
    _signal_all(members(sids), signal.SIGKILL)
    return len(found)


def prctl(option: int, value: int) -> bool:
    """prctl(2) on this process; False where the OS has none (not Linux)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def mark(scratch: str) -> str:
    """The `NAME=value` entry every process of an agent's ranks carries in its environment: the
    agent's scratch folder, made anew for each agent (rank/scratch.py), so no other agent's, and
    no process the ranks did not start, has it."""
    return f"{MARK_VAR}={scratch}"


def _live(pid: int) -> bool:
    stat = procfs.stat(pid)
    return stat is not None and not stat.zombie


def carrying(entry: str) -> list[int]:
    """Every live process but this one whose environment holds `entry` (`NAME=value`).

    /proc/PID/environ is the environment a process was started with (a fork's is its parent's),
    so a process keeps its mark through setsid and a move to another parent; one started with an
    environment of its own choosing drops it. Another user's processes cannot be read, and are
    none of the agent's."""
    wanted, me = entry.encode(), os.getpid()
    found = []
    for pid in procfs.pids():
        if pid == me:
            continue
        held = procfs.environ(pid)
        if held is not None and wanted in held and _live(pid):  # a zombie's reads empty anyway
            found.append(pid)
    return found


def reap_adopted(keep: set[int]) -> list[int]:
    """For a subreaper: wait for this process's exited children that are not in `keep` (the
    ranks, the spares, the sweeper, whose statuses subprocess reads): orphans it adopted. Returns
    their pids. Never in a caller's process (local mode): its exited children are its own to wait for."""
    me = os.getpid()
    reaped = []
    for pid in procfs.pids():
        if pid in keep:
            continue
        stat = procfs.stat(pid)
        if stat and stat.zombie and stat.ppid == me:
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped


def end_marked(entry: str, keep: set[int], reap: bool = False, wait_s: float = 2.0) -> list[int]:
    """SIGKILL every process carrying `entry` (its agent's mark) but those of the sessions `keep`
    (live ranks, the next attempt's spares, the sweeper: each its own session's leader), until none
    is left or `wait_s` passed: what the ranks started outside their sessions. With `reap` (the
    agent's own process, a subreaper: the Ray path) the zombies it adopted are waited for too, all
    but `keep`'s; without it no process is waited for here (the ended ones are their parent's,
    init's or a caller's own subreaper's). Returns the pids it signalled."""
    ended: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        kept = members(keep)
        left = [pid for pid in carrying(entry) if pid not in keep and pid not in kept]
        _signal_all(left, signal.SIGKILL)  # again each look: one may have forked before it died
        ended += [pid for pid in left if pid not in ended]
        if reap:
            reap_adopted(keep)
        if not left or time.monotonic() > deadline:
            return ended
        time.sleep(0.05)


def take_niceness(niceness: int) -> None:
    """Every thread of this process at `niceness` where it is lower than its own and that is
    allowed (CAP_SYS_NICE, RLIMIT_NICE); Linux keeps a niceness per thread, and new threads
    take their creator's. An agent runs at its ranks' priority, as torchrun's agent does:
    below them, on a busy node, it would hear of their ends late."""
    for tid in procfs.threads():
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:
            pass


def write_sessions(path: str, sids: set[int]) -> None:
    """The sweeper's list of sessions to end, replaced atomically."""
    with open(path + ".partial", "w") as f:
        f.write("\n".join(str(s) for s in sorted(sids)))
    os.replace(path + ".partial", path)


def _read_sessions(path: str) -> set[int]:
    try:
        with open(path) as f:
            return {int(line) for line in f.read().split() if line.isdigit()}
    except OSError:
        return set()


def sweep(agent_pid: int, path: str, entry: str | None = None) -> int:
    """The sweeper's loop: once `agent_pid` is gone, end every session listed in `path`, and every
    process carrying `entry`, its agent's mark (what the ranks started outside their sessions)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only its agent's end ends it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        if not _live(agent_pid) or not os.path.exists(path):
            break
        time.sleep(SWEEP_POLL_S)
    # The file is gone when the agent ended its ranks itself (a finished or failed run).
    orphaned = os.path.exists(path)
    end_sessions(_read_sessions(path))
    if orphaned and entry:
        end_marked(entry, set())
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] != "--sweep":
        print("usage: sessions.py --sweep AGENT_PID FILE [MARK]", file=sys.stderr)
        sys.exit(2)
    sys.exit(sweep(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else None))
