"""A ctx or Lightning job's ranks under their node's agent: how they start, how they reach the run monitor.

The agent (supervisor.py) runs these ranks as it runs a torchrun script's: child processes with
torchrun's environment, restarted in place. What differs is what runs in them and what the agent
does for them:
- a child runs rank/rank_main.py (the worker session, then the ctx loop or Lightning), started through
  the same bootstrap as a script, with a config file the agent writes for each attempt;
- the child sends its own events and heartbeats (with its phases: checkpoint, validation...)
  through the agent (`Answers`, over agent_link.py); until its first heartbeat, the agent beats
  "starting" for it, so that its imports and the process group's formation are not silence;
- a child whose own heartbeat is overdue while its process runs (a C call that holds the GIL,
  a loaded machine) is vouched for by the agent: its last beat again, its idle time grown, so that
  a rank that makes no progress is still caught, while silence is left to a process that is
  stopped (SIGSTOP, a frozen node), which the agent sees and does not vouch for;
- the child's step time is measured here, from the heartbeats passed on (Ray's metrics are
  exported by a Ray process), afresh for each attempt.

`SessionLauncher` and `SessionLiveness` are this kind's launcher and liveness (launcher.py),
sharing the agent's `Answers` to its ranks' calls.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import types
from collections.abc import Mapping
from typing import Any

from orchestrator import handles
from orchestrator.agent import rank_env
from orchestrator.agent.children import Child, LocalRanks, Placement, RankProgress
from orchestrator.agent.launcher import Launcher, Liveness, RankSetting
from orchestrator.agent.rank_signals import RankSignals
from orchestrator.agent.spares import Spares
from orchestrator.protocol import AttemptBegun, Beat, BeatReply, PreemptionNotice
from orchestrator.rank.agent_link import BEAT, BEGIN, PREEMPTION, SEND, SEND_AND_WAIT, LinkServer
from orchestrator.rank.heartbeat import FINISHING, HANG_EXIT_CODE, STARTING
from orchestrator.rank.identity import DEVICE_VAR, NODE_ID_VAR
from orchestrator.ray_private import preemption_notice
from orchestrator.spec import JobSpec

# Seconds the monitor's answer to a passed-on heartbeat may take (heartbeat.REPLY_TIMEOUT_S).
BEAT_REPLY_S = 10.0
# Seconds for an event the child waits for (its last, Finished).
WAIT_S = 60.0
# Seconds a running child's own heartbeat may be late before the agent vouches for it (it beats
# every second; the watchdog calls a rank silent after watchdog.SILENT_AFTER_S = 4).
VOUCH_AFTER_S = 2.5
# A ctx or Lightning rank's command (after the bootstrap): the worker session's own module.
COMMAND = ["-m", "orchestrator.rank.rank_main"]


def session_kind(setting: RankSetting, first_spares: Spares | None = None) -> tuple[SessionLauncher, SessionLiveness]:
    """A ctx or Lightning job's launcher and liveness, sharing the agent's answers to its ranks."""
    answers = Answers(setting.config.monitor, on_ray_train=not setting.group.local)
    return SessionLauncher(setting, answers, first_spares), SessionLiveness(setting, answers)


def session_env(job: JobSpec, environ: Mapping[str, str], local_world_size: int,
                niceness: int | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A ctx or Lightning rank's environment, whatever its attempt (rank_env.py): the agent's
    `environ` without Ray's variables, the job's env, and its share of the agent's threads. The
    agent's, and a local run's first ranks' (driver/local.py), which start before their attempt."""
    return rank_env.rank_env(rank_env.SESSION, environ, job.env, local_world_size, niceness=niceness, extra=extra)


def cwd() -> str:
    return os.getcwd()  # the Ray worker's: the job's code is importable from here, as in the worker


class SessionLauncher(Launcher):
    """Starts a ctx or Lightning job's rank children (each from a spare where one waits), and holds
    what they reach the agent by (the link) and the next attempt's spares (spares.py)."""

    def __init__(self, setting: RankSetting, answers: Answers, first_spares: Spares | None = None):
        self.setting, self.answers = setting, answers
        self.link = LinkServer(setting.scratch, answers)
        self.rank_signals = RankSignals(setting.config.monitor)  # a rank's SIGTERM: the run's stop
        # The next attempt's ranks, started ahead; a local run's command may have started the
        # first attempt's already (driver/local.py).
        self.spares = first_spares or Spares(setting.config.spec.kind, COMMAND, cwd())

    def start(self, placement: Placement, in_place: bool, latest_uri: str | None) -> LocalRanks:
        setting = self.setting
        self.answers.new_attempt(placement.attempt, latest_uri or setting.config.resume_uri)
        env = self.env(placement, in_place)
        # A ctx job's output stays in its logs: its rank 0 sends its own progress.
        return LocalRanks(COMMAND, cwd(), env, placement, setting.scratch, setting.log_dir, echo=None,
                          spares=self.spares.take())

    def env(self, placement: Placement, in_place: bool) -> dict[str, str]:
        # (It imports torch: the agent's process does, a local run's command at its first ranks does not.)
        from orchestrator.rank.rank_main import CONFIG_VAR, RankConfig, write_config

        setting, config = self.setting, self.setting.config
        path = os.path.join(setting.scratch, f"rank-config-{placement.attempt}.pkl")
        # The child's session: the monitor through this agent; its output reaches its log through
        # this agent's copy of its pipe, so it writes no log of its own.
        worker = dataclasses.replace(config, monitor=self.link.address, log_dir=None, script_context=None)
        write_config(path, RankConfig(worker=worker, in_place=in_place))
        devices = setting.group.devices(setting.group.ranks, config.spec.scaling.use_gpu)  # child i: the i-th
        return session_env(config.spec, os.environ, placement.local_world_size, niceness=config.niceness,
                           extra={CONFIG_VAR: path, DEVICE_VAR: devices, NODE_ID_VAR: setting.group.node_id})

    def look(self, ranks: LocalRanks, attempt: int) -> set[int] | None:
        self.rank_signals.pass_on(attempt, ranks.children)
        if self.spares.start_when_settled(ranks, attempt, self.answers.beats_itself):
            return self.spares.pids
        return None

    def pass_on_stop(self, ranks: LocalRanks) -> bool:
        return False  # each rank hears of the stop in its own heartbeat's reply, and saves and ends

    @property
    def kept(self) -> set[int]:
        return self.spares.pids

    def close(self) -> None:
        self.spares.close()
        self.link.close()


class SessionLiveness(Liveness):
    """A session child beats itself once its session starts; until then, or while its own beat is
    overdue though it runs, or once its training raised, the agent beats for it (module docstring)."""

    def __init__(self, setting: RankSetting, answers: Answers):
        self.answers, self.node_id = answers, setting.group.node_id
        # How long a rank whose training raised may take to end before it is ended (children.py).
        failure = setting.config.spec.failure
        self.failing_grace_s = min(failure.hang_timeout_s, failure.finish_timeout_s)

    def look(self, ranks: LocalRanks) -> None:
        ranks.end_failing(self.failing_grace_s)  # its exit brings its error

    def beat(self, child: Child, progress: RankProgress, now: float) -> Beat | None:
        failing_s = child.failing_for()
        if failing_s is not None:  # past its grace it is being ended (`look`)
            return (self.answers.failing_beat(child.rank, failing_s, self.node_id, child.process.pid)
                    if failing_s <= self.failing_grace_s else None)
        if self.answers.beats_itself(child.rank):
            return self.answers.vouched(child.rank, now, progress.steps, progress.idle_s)
        return self.answers.starting_beat(child.rank, now - child.started, self.node_id, child.process.pid)

    def finished_step(self, child: Child, progress: RankProgress) -> int:
        return self.answers.last_step(child.rank)

    def told_to_end(self, ranks: LocalRanks) -> bool:
        # A child's heartbeat was told to end (a stop's grace ran out, the run taken over).
        return any(code == HANG_EXIT_CODE for _, code in ranks.exited())


class Answers:
    """The agent's answers to its rank children's calls (agent_link.LinkServer's handler)."""

    def __init__(self, monitor, on_ray_train: bool = True):
        self.monitor = monitor
        # Only a Ray Train worker can be told of a preemption; a local run's agent is none, and
        # asking would import Ray Train into the command's process (half a second of a core).
        self.on_ray_train = on_ray_train
        self.attempt = 0
        self.latest_uri: str | None = None
        self._lock = threading.Lock()
        # Per rank: its newest beat and when it arrived (time.monotonic()).
        self._last: dict[int, tuple[Beat, float]] = {}
        # Per rank vouched for: the time of the own beat vouched for, and its process's steps then.
        self._vouch_from: dict[int, tuple[float, int]] = {}

    def new_attempt(self, attempt: int, latest_uri: str | None) -> None:
        with self._lock:
            self.attempt, self.latest_uri = attempt, latest_uri
            self._last.clear()
            self._vouch_from.clear()

    def beats_itself(self, rank: int) -> bool:
        return rank in self._last

    def last_step(self, rank: int) -> int:
        """The newest step the child's own beats said (its global step; 0 before its first beat)."""
        with self._lock:
            last = self._last.get(rank)
        return last[0].step if last else 0

    def starting_beat(self, rank: int, idle_s: float, node_id: str, pid: int) -> Beat:
        """The agent's beat for a child that has not beaten yet (imports, the process group)."""
        return Beat(rank=rank, step=0, phase=STARTING, idle_s=idle_s, node_id=node_id, pid=pid)

    def failing_beat(self, rank: int, failing_s: float, node_id: str, pid: int) -> Beat:
        """The agent's beat for a child whose training raised and whose process is ending
        (bootstrap.mark_failing): `finishing`, whatever its own last beat said, until the exit
        brings its failure (its heartbeat thread is closed by then, or held); its agent ends it
        after a grace (supervisor.py)."""
        return Beat(rank=rank, step=self.last_step(rank), phase=FINISHING, idle_s=failing_s, node_id=node_id,
                    pid=pid)

    def vouched(self, rank: int, now: float, steps: int, idle_s: float) -> Beat | None:
        """The running child's last beat, aged by the time since, once its own is overdue (else None).

        `steps` and `idle_s` are the child's optimizer steps in its process and the seconds since
        its last one (its beat file): steps it took since its own beat fell behind (a starved
        heartbeat thread on a loaded machine) are counted, so that a rank that trains is never
        judged by a stale step. Counted from the first vouch, they never say more than it did."""
        with self._lock:
            last = self._last.get(rank)
            if last is None or now - last[1] < VOUCH_AFTER_S:
                return None
            beat, at = last
            since = self._vouch_from.setdefault(rank, (at, steps))
            if since[0] != at:  # a newer beat of its own came in between: count from here
                since = self._vouch_from[rank] = (at, steps)
        taken = max(0, steps - since[1])
        return dataclasses.replace(beat, step=beat.step + taken,
                                   idle_s=min(beat.idle_s + (now - at), idle_s) if taken else beat.idle_s + (now - at),
                                   received=0.0)

    def __call__(self, op: str, payload: Any) -> Any:
        if op == SEND:
            self.monitor.push.remote(payload)
            return None
        if op == SEND_AND_WAIT:
            handles.get(self.monitor.push.remote(payload), timeout=WAIT_S)
            return None
        if op == BEGIN:
            return AttemptBegun(self.attempt, self.latest_uri)
        if op == BEAT:
            return self._beat(*payload)
        if op == PREEMPTION:
            notice = preemption_notice() if self.on_ray_train else None
            if notice is None:
                return None
            return PreemptionNotice(deadline_ms=getattr(notice, "deadline_ms", None),
                                    preempted_node_ids=list(getattr(notice, "preempted_node_ids", [])))
        raise ValueError(f"unknown call {op!r}")

    def _beat(self, attempt: int, beat: Beat) -> BeatReply:
        with self._lock:
            self._last[beat.rank] = (beat, time.monotonic())
        return handles.get(self.monitor.beat.remote(attempt, beat), timeout=BEAT_REPLY_S)
