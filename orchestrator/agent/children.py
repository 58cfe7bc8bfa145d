"""One node's K ranks of a torchrun script: their environment, their processes, their logs.

`LocalRanks` starts the K children of one attempt (bootstrap.py running the script), copies each
child's output into its log (and rank 0's to the driver's console, through the agent), reads
their optimizer-step counters and liveness, dumps their stacks, and stops them with everything
they started (sessions.py). `Sweeper` ends what the ranks started if the agent itself is killed.
Each rank's environment holds its agent's mark (sessions.mark), inherited by all it starts: what
leaves its session is ended by it, and nothing without it is (a local run's process is its caller's).
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator import procfs, storage
from orchestrator.agent import flight_records, sessions
from orchestrator.failures import is_user_file
# What each rank's environment and files hold (the bootstrap reads and writes them).
from orchestrator.rank.agent_contract import AGENT_PID_VAR, BEAT_FILE_VAR, BEAT_LAYOUT, FAILING_SUFFIX, FAILURE_FILE_VAR
from orchestrator.rank.agent_contract import RETURNED_SUFFIX, STACK_SIGNAL_VAR

log = logging.getLogger("orchestrator.worker")

# What each rank child runs, by its file's path: its folder (not this one) is the child's first
# sys.path entry, and it holds nothing that shadows torch or lightning (rank/script/__init__.py).
BOOTSTRAP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "script", "bootstrap.py")
SESSIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sessions.py")
STACK_SIGNAL = signal.SIGUSR2
# Seconds a child has to end after SIGTERM before it is SIGKILLed (torchrun gives 30; a rank that is
# being replaced has nothing left to save, and every second here is a second of the restart).
TERM_GRACE_S = 2.0
# Lines of each rank's output kept in memory: the end of a failure's output, a stack dump.
TAIL_LINES = 80
# Of those, the lines a failure message quotes.
QUOTED_LINES = 8
# Variables Ray Train sets in its worker for its own process group: the script gets torchrun's.
RAY_TRAIN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "ACCELERATE_TORCH_DEVICE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
_LIBC = ctypes.CDLL(None, use_errno=True)
_STACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclass(frozen=True)
class Placement:
    """Where this node's ranks sit in the world of one attempt."""

    group_rank: int  # this node's (Ray Train worker's) rank
    group_world_size: int  # nodes
    local_world_size: int  # K
    master_addr: str
    master_port: int
    # protocol.py's attempt: 1 for the first start of the ranks, one more for every restart.
    attempt: int
    max_restarts: int
    run_id: str

    @property
    def restart_count(self) -> int:
        """torchrun's TORCHELASTIC_RESTART_COUNT: the restarts before this attempt."""
        return self.attempt - 1

    @property
    def world_size(self) -> int:
        return self.group_world_size * self.local_world_size

    def rank(self, local_rank: int) -> int:
        return self.group_rank * self.local_world_size + local_rank

    def torchrun_env(self, local_rank: int) -> dict[str, str]:
        """The variables torchrun's agent gives each worker (torch.distributed.elastic's
        LocalElasticAgent._start_workers), with this attempt's values; and ORCHESTRATOR_ATTEMPT,
        as every rank of every path has it."""
        rank = str(self.rank(local_rank))
        return {
            "RANK": rank, "LOCAL_RANK": str(local_rank), "GROUP_RANK": str(self.group_rank),
            "ROLE_RANK": rank, "ROLE_NAME": "default",
            "LOCAL_WORLD_SIZE": str(self.local_world_size), "WORLD_SIZE": str(self.world_size),
            "GROUP_WORLD_SIZE": str(self.group_world_size), "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts), "TORCHELASTIC_RUN_ID": self.run_id,
            # The script makes its own store at MASTER_ADDR:MASTER_PORT (env:// init), as under
            # torchrun without the agent's store.
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "ORCHESTRATOR_ATTEMPT": str(self.attempt),
        }


@dataclass(frozen=True)
class RankProgress:
    """What a rank's beat file says, on the agent's clock."""

    steps: int
    idle_s: float  # since the last optimizer step, or since the start
    step_time_s: float  # median seconds between consecutive steps; 0 before the second
    stack_idle_s: float  # since the main thread's Python stack last moved
    work_s: float = 0.0  # median seconds of the rank's own work in a step (rank/script/bootstrap.py); 0: unknown


@dataclass
class Child:
    local_rank: int
    rank: int
    process: subprocess.Popen
    beat_file: str
    failure_file: str
    log_path: str
    env: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None
    # Ended by its agent while on its way out with an error (LocalRanks.end_failing).
    ended_failing: bool = False
    # The failing mark seen (its inode and mtime) and when first, on the monotonic clock (failing_for).
    failing_seen: tuple[tuple[int, int], float] | None = None

    def progress(self) -> RankProgress:
        try:
            with open(self.beat_file, "rb") as f:
                data = f.read(BEAT_LAYOUT.size)
        except OSError:
            data = b""
        now = time.monotonic()
        if len(data) < BEAT_LAYOUT.size:  # the bootstrap has not started yet
            return RankProgress(0, now - self.started, 0.0, now - self.started)
        steps, last, step_time, stack_moved, work = BEAT_LAYOUT.unpack(data)
        return RankProgress(steps, now - last, step_time, now - stack_moved, work)

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP, a debugger): it takes no step and answers nothing."""
        stat = procfs.stat(self.process.pid)
        return stat is not None and stat.stopped

    def last_lines(self) -> list[str]:
        return [line for line in self.tail if line.strip()][-QUOTED_LINES:]

    def returned(self) -> bool:
        """Whether the script ran to its end (bootstrap.py marks it before the interpreter's exit)."""
        return os.path.exists(self.failure_file + RETURNED_SUFFIX)

    def failing_for(self) -> float | None:
        """Seconds since this agent first saw the rank's mark that its training raised and its
        process is ending (bootstrap.mark_failing); None if there is none. On the monotonic clock
        from the first look (a beat's, at most a second late), not by the mark's mtime: a step of
        the wall clock moves that age by any amount, and a rank ended early could take the
        checkpoint its rank 0 still commits with it. A mark made again is timed afresh."""
        try:
            stat = os.stat(self.failure_file + FAILING_SUFFIX)
        except OSError:
            self.failing_seen = None
            return None
        mark, now = (stat.st_ino, stat.st_mtime_ns), time.monotonic()
        if self.failing_seen is None or self.failing_seen[0] != mark:
            self.failing_seen = (mark, now)
        return now - self.failing_seen[1]

    def failure(self) -> dict | None:
        """What the bootstrap wrote of an uncaught exception (None: it wrote nothing)."""
        try:
            with open(self.failure_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None


class LocalRanks:
    """The children of one attempt on this node."""

    def __init__(self, command: list[str], cwd: str, base_env: dict[str, str], placement: Placement, scratch: str,
                 log_dir: str | None, echo: Callable[[str], None] | None = None,
                 spares: dict[int, subprocess.Popen] | None = None):
        self.children: list[Child] = []
        self.log_dir = log_dir
        # torchrun's own layout: attempt_<TORCHELASTIC_RESTART_COUNT>/<local rank>/error.json.
        attempt = os.path.join(scratch, f"attempt_{placement.restart_count}")
        for local_rank in range(placement.local_world_size):
            rank = placement.rank(local_rank)
            where = os.path.join(attempt, str(local_rank))
            os.makedirs(where, exist_ok=True)
            env = {**base_env, **placement.torchrun_env(local_rank),
                   # torch's @record writes the script's error here, as under torchrun.
                   "TORCHELASTIC_ERROR_FILE": os.path.join(where, "error.json"),
                   BEAT_FILE_VAR: os.path.join(where, "beat"),
                   FAILURE_FILE_VAR: os.path.join(where, "failure.json"),
                   STACK_SIGNAL_VAR: str(int(STACK_SIGNAL)),
                   **flight_records.rank_env(base_env, where, log_dir),
                   AGENT_PID_VAR: str(os.getpid()),
                   sessions.MARK_VAR: scratch}  # inherited: how its orphans are told from others'
            log_path = os.path.join(log_dir, f"rank-{rank}.log") if log_dir else os.path.join(where, "output.log")
            process = _hand_over((spares or {}).get(local_rank), env) or subprocess.Popen(
                [sys.executable, BOOTSTRAP, *command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            child = Child(local_rank, rank, process, env[BEAT_FILE_VAR], env[FAILURE_FILE_VAR],
                          log_path, env)
            child.reader = threading.Thread(target=_copy_output, args=(child, echo if rank == 0 else None),
                                            name=f"rank-{rank}-output", daemon=True)
            child.reader.start()
            self.children.append(child)

    def exited(self) -> list[tuple[Child, int]]:
        return [(c, c.process.returncode) for c in self.children if c.process.poll() is not None]

    def end_failing(self, grace_s: float) -> None:
        """End each child whose training raised more than `grace_s` ago (bootstrap.mark_failing) and
        that still runs: an exception handler or a teardown that does not return (NCCL's after a
        peer's death is known for it). Its error, written as it raised, is its outcome (outcome.py)."""
        for child in self.children:
            failing_s = child.failing_for() if not child.ended_failing else None
            if failing_s is not None and failing_s > grace_s and child.process.poll() is None:
                log.warning("rank %d did not end within %.0f s of its error; ending it", child.rank, grace_s)
                child.ended_failing = True
                _signal(child, signal.SIGKILL)

    def flight_records(self) -> dict[int, dict]:
        """Each live, running child's last collectives, from torch's flight recorder (flight_records.py)."""
        return flight_records.collect(self.children, self.log_dir)

    def dump_stacks(self, wait_s: float = 2.0) -> dict[int, str]:
        """Every live child's Python stacks into its log, each child ending right after its dump
        (bootstrap.py: a stopped one is continued for it, and trains no further); where each
        one's own code stood (rank -> file:line)."""
        return _dump([c for c in self.children if c.process.poll() is None], wait_s)

    @property
    def sessions(self) -> set[int]:
        """Each child's session id (its pid): what it started is found, and ended, by it."""
        return {c.process.pid for c in self.children}

    def stop(self) -> None:
        """End every child and every process it started (its session), dead child or not:
        SIGTERM (SIGCONT for a stopped one), then SIGKILL to what is left after TERM_GRACE_S."""
        sessions.end_sessions(self.sessions, TERM_GRACE_S)
        for child in self.children:
            try:
                child.process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # not in its session any more (it called setsid)
                _signal(child, signal.SIGKILL)
                child.process.wait()
            if child.reader is not None:
                child.reader.join(timeout=5)

    def forward(self, signum: int) -> None:
        """`signum` to every live child's process group, as torchrun's agent sends it (os.killpg):
        its DataLoader workers and helpers get it too."""
        for child in self.children:
            if child.process.poll() is None:
                try:
                    os.killpg(child.process.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass


class Sweeper:
    """Ends the ranks' sessions, and what carries their mark, when this agent dies without ending
    them (SIGKILL, a lost Ray worker): a process of its own session, watching the agent
    (sessions.py --sweep). The agent lists the current sessions in a file; `close()` removes the
    file, and the sweeper exits."""

    def __init__(self, scratch: str):
        self.path = os.path.join(scratch, "sessions")
        sessions.write_sessions(self.path, set())
        self.process = subprocess.Popen(
            [sys.executable, SESSIONS, "--sweep", str(os.getpid()), self.path, sessions.mark(scratch)],
            stdin=subprocess.DEVNULL, start_new_session=True)

    def track(self, sids: set[int]) -> None:
        sessions.write_sessions(self.path, sids)

    def close(self) -> None:
        try:
            os.remove(self.path)
        except OSError:
            pass
        # Its watch is over (the agent ended the ranks itself, and with the file gone it has nothing
        # left to end): killed now rather than left to its next look (SWEEP_POLL_S), which a local
        # run's command would wait for before it returns. It ignores SIGTERM on purpose.
        self.process.kill()
        self.process.wait()


def _hand_over(spare: subprocess.Popen | None, env: dict[str, str]) -> subprocess.Popen | None:
    """A waiting spare (spares.py) made this attempt's rank: its environment on its stdin. None
    when there is no spare, or it is gone."""
    if spare is None:
        return None
    try:
        spare.stdin.write((json.dumps(env) + "\n").encode())
        spare.stdin.close()
        return spare
    except OSError:  # it died waiting (BrokenPipeError): the rank starts afresh
        sessions.end_sessions({spare.pid}, 0.0)
        spare.wait()
        spare.stdout.close()
        return None


def _signal(child: Child, signum: int) -> None:
    try:
        os.kill(child.process.pid, signum)
    except ProcessLookupError:
        pass


# Seconds a stopped child waits, at a hang, before it is continued to dump its stacks (_dump).
STOPPED_DUMP_DELAY_S = 2.0


def _dump(children: list[Child], wait_s: float) -> dict[int, str]:
    """faulthandler's dump of each child's stacks (bootstrap.py), read back from its output.

    The running children first, here and on every other node: a stopped one, once continued, dumps
    and ends, and a peer waiting for it in a collective would then raise (the connection closed)
    before its own dump came; so a stopped child is continued STOPPED_DUMP_DELAY_S later, time
    for every agent to have heard the verdict and signalled its running ranks."""
    stopped = [c for c in children if c.stopped()]
    for child in children:
        child.tail.clear()
        _signal_main_thread(child, STACK_SIGNAL)  # a stopped process handles it once continued
    if stopped:
        time.sleep(STOPPED_DUMP_DELAY_S)
    for child in stopped:
        _signal(child, signal.SIGCONT)
    deadline = time.monotonic() + wait_s
    where: dict[int, str] = {}
    while time.monotonic() < deadline and len(where) < len(children):
        time.sleep(0.1)
        for child in children:
            if child.rank not in where:
                place = _own_frame(list(child.tail))
                if place:
                    where[child.rank] = place
    return where


def _signal_main_thread(child: Child, signum: int) -> None:
    """`signum` to the child's main thread alone (its thread id is its pid). A signal sent to the
    process goes to whichever of its threads runs first: once a stopped process is continued, that
    is often not the main thread, which then runs on past the line it was stuck at before the dump
    reads its stack. A signal pending on the main thread is handled before it runs another
    instruction of its own."""
    tgkill = getattr(_LIBC, "tgkill", None)  # glibc >= 2.30
    if tgkill is None:
        _signal(child, signum)
    else:
        tgkill(child.process.pid, child.process.pid, signum)  # -1 (ESRCH) for a child that is gone


def _copy_output(child: Child, echo: Callable[[str], None] | None) -> None:
    """The child's output, line by line, into its log file (and to `echo`: rank 0's, live)."""
    try:
        os.makedirs(os.path.dirname(child.log_path), exist_ok=True)
        log = open(child.log_path, "a", buffering=1)
    except OSError:
        log = None  # a lost run directory costs the copy, never the child (its pipe keeps draining)
    for raw in iter(child.process.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        child.tail.append(line)
        if echo is not None:
            echo(line)
        if log is not None:
            try:
                log.write(line + "\n")
            except OSError:
                log = None
    if log is not None:
        log.close()


def _own_frame(lines: list[str]) -> str:
    """The innermost frame of the user's own code in the newest faulthandler dump (most recent call
    first; the thread that handled the signal, the main one, is listed first)."""
    starts = [i for i, line in enumerate(lines) if "most recent call first" in line]
    if not starts:
        return ""
    first_thread = next((i for i in starts if "Current thread" in lines[i]), starts[0])
    for line in lines[first_thread + 1:]:
        match = _STACK_FRAME.match(line)
        if match and is_user_file(match["file"]) and os.path.abspath(match["file"]) != BOOTSTRAP:
            return f"{os.path.basename(match['file'])}:{match['line']} in {match['func']}"
    return ""


def copy_logs(log_dir: str, target) -> None:
    """Every rank log in `log_dir` to `target` (a storage Location: <run>/logs/ on an object store), whole."""
    if not os.path.isdir(log_dir):
        return
    for name in sorted(os.listdir(log_dir)):
        try:
            with open(os.path.join(log_dir, name), "rb") as f:
                storage.write_atomic(target.join(name), f.read())
        except OSError as exc:  # a log lost costs the log, never the run's outcome
            log.warning("could not copy %s to %s: %s", name, target.uri, exc)


def free_port() -> int:
    """A TCP port free on this node now: the next attempt's MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
