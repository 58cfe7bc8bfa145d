"""A node's agent: the Ray Train worker that runs the node's K ranks (torchelastic's model:
agents survive, workers restart). It starts its ranks as child processes (children.py) through
the launcher of their kind, and speaks for them to the run monitor through its liveness
(launcher.py: a script's, rank_start.py and script_liveness.py; a ctx or Lightning job's, whose
ranks run the worker session themselves, session_ranks.py); it never asks which kind it runs:
- a child that dies or fails is reported to the run monitor, which decides for every node
  (monitor/attempts.py): restart every rank in place (the same Ray Train workers, no new placement),
  fail the run (a user error, or the restarts used up), or finish (every rank exited 0);
- every second each running child's beat (its liveness's) goes to the run monitor, and a child
  that exited 0 is reported finished. A stopped child (SIGSTOP) sends none. On a hang verdict
  every rank's stacks go into its log, and it ends;
- rank 0's output is sent to the driver's console (best effort: a backlog past echo.BACKLOG
  lines is dropped with a note, the log keeps everything); every rank's goes to
  <run>/logs/rank-N.log, on every storage (on an object store, copied there at each attempt's end);
- nothing the ranks start outlives them, nor is anything else ended: each rank's session goes with
  it, what left its session (a daemon that called setsid) by the mark the ranks' processes inherit,
  and a sweeper process ends both if this one is killed (children.py, sessions.py); one sequence
  ends an attempt's ranks (`_end_ranks`), whatever ends them.

The training runs in processes with no Ray in them (a ctx or Lightning job's next ones started
ahead: spares.py). Only a lost worker or node goes through Ray Train's group restart.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from orchestrator import handles
from orchestrator.agent import sessions
from orchestrator.agent.children import LocalRanks, Placement, Sweeper, copy_logs, free_port
from orchestrator.agent.echo import Echo
from orchestrator.agent.group import AgentEnded, AgentGroup
from orchestrator.agent.kinds import for_job
from orchestrator.agent.launcher import Launcher, Liveness, RankSetting
from orchestrator.agent.outcome import failure_of, signal_name
from orchestrator.failures import HANG, INFRASTRUCTURE, TAKEN_OVER, USER, FailureRecord, WorkerFailure
from orchestrator.protocol import (
    FINISH,
    RESTART,
    WAIT,
    Action,
    Beat,
    RunWarning,
    Stacks,
    Verdict,
    cause_order,
)
from orchestrator.rank.collectives import broadcast_object
from orchestrator.rank.heartbeat import FINISHED, HANG_EXIT_CODE
from orchestrator.rank.scratch import make_scratch
from orchestrator.run_dir import RunDir
from orchestrator.worker_config import WorkerConfig

log = logging.getLogger("orchestrator.worker")

# Seconds between looks at the children, and at the attempt's verdict once this node reported.
POLL_S = 0.1
# This node's scratch folder (the ranks' step counters, failure records, error files): <tmp>/<prefix><pid>-*.
SCRATCH_PREFIX = "orchestrator-script-"
# Seconds between asks for the attempt's verdict while this node's ranks run (a peer node's failure).
VERDICT_S = 0.25
# The same for a run of one node: only a hang verdict arrives this way (its own failures are
# decided at once), so three actor calls a second fewer while training, on the ranks' cores.
LONE_VERDICT_S = 1.0
# Seconds between heartbeats (one per child).
BEAT_S = 1.0
# Seconds between batches of rank 0's output sent to the driver's console.
ECHO_S = 0.3


def train_script(config: WorkerConfig) -> None:
    Supervisor(config, AgentGroup.of_ray_train(config.spec.ranks_per_worker)).run()


class Supervisor:
    """A node's agent (the module's docstring) for any kind of rank: `kind` makes its launcher and
    liveness (kinds.py `for_job`; a test passes fakes of its own)."""

    def __init__(self, config: WorkerConfig, group: AgentGroup,
                 kind: Callable[[RankSetting], tuple[Launcher, Liveness]] = for_job):
        self.config, self.spec, self.monitor = config, config.spec, config.monitor
        self.k = group.ranks
        self.group = group
        self.worker, self.workers, self.node_id = group.worker, group.workers, group.node_id
        self.hostname = socket.gethostname()
        self.run_dir = RunDir.at(config.run_uri)
        self.scratch = make_scratch(SCRATCH_PREFIX)
        # Each rank's log: in the run's logs/, or on an object store this scratch's, copied there.
        self.log_dir = config.log_dir or os.path.join(self.scratch, "logs")
        if group.owns_process:  # on Ray, the ranks' helpers' orphans are adopted here, and reaped
            sessions.prctl(sessions.PR_SET_CHILD_SUBREAPER, 1)
        sessions.take_niceness(config.niceness)  # Ray's workers run at 15; the ranks at the driver's
        self.sweeper = Sweeper(self.scratch)
        self.ranks: LocalRanks | None = None
        self.placement: Placement | None = None
        self.attempt = 0
        # Set by the heartbeat thread from the monitor's replies (abort: why the ranks are ended).
        self.abort, self.stop_requested = None, False
        self._closing, self._last_beat = False, 0.0
        self._teardown_warned: set[int] = set()
        self.echo = Echo(lambda output: self.monitor.push.remote(output))  # rank 0's output, to the console
        self.launcher, self.liveness = kind(RankSetting(config, group, self.scratch, self.log_dir, self.echo,
                                                        self.hostname))

    # --- the attempts -----------------------------------------------------------------------------

    def run(self) -> None:
        begun = broadcast_object(self._begin(self.k) if self.worker == 0 else None)
        self._beats = threading.Thread(target=self._beat_loop, name="orchestrator-script-beats", daemon=True)
        self._beats.start()
        try:
            while True:
                state = broadcast_object(self._attempt_state() if self.worker == 0 else None)
                placement = Placement(self.worker, self.workers, self.k, begun["master_addr"], state["port"],
                                      state["attempt"], state["max_restarts"], self.spec.name)
                self._start_attempt(placement, state["attempt"] > begun["attempt"], state["latest_uri"])
                verdict = self._watch(state["attempt"])
                action = verdict.action
                if action == RESTART:
                    self._end_attempt(verdict)
                    continue
                if action == FINISH:
                    self._finish(stopped=False)
                    return
                if action == Action.STOP:
                    self._finish(stopped=True)
                    return
                self.ranks.stop()
                self._fail(verdict)
                return
        finally:
            self._closing = True
            self._end_ranks(last=True)
            shutil.rmtree(self.scratch, ignore_errors=True)
            self._done()

    def _begin(self, k: int) -> dict[str, Any]:
        begun = handles.get(self.monitor.begin_group.remote(self.workers * k, self.workers), timeout=60)
        return {"attempt": begun.attempt, "master_addr": self.group.master_addr}

    def _attempt_state(self) -> dict[str, Any]:
        state = handles.get(self.monitor.attempt_state.remote(), timeout=60)
        return {**asdict(state), "port": free_port()}

    def _start_attempt(self, placement: Placement, in_place: bool, latest_uri: str | None) -> None:
        self.attempt = placement.attempt
        self.placement = placement
        self.ranks = self.launcher.start(placement, in_place, latest_uri)
        self.sweeper.track(self.ranks.sessions)
        self.liveness.new_attempt()
        for event in self.liveness.started(self.ranks, placement, in_place):
            self.monitor.push.remote(event)

    def _watch(self, attempt: int) -> Verdict:
        reported = False
        last_asked = 0.0
        stop_sent = False
        while True:
            time.sleep(POLL_S)
            if self.abort:
                log.error("ending this node's ranks: %s", self.abort)
                self._end_ranks(last=True)
                if self.group.local:  # the agent is the command's own process: it goes on, the run ends
                    raise AgentEnded(self.abort)
                os._exit(HANG_EXIT_CODE)
            if self.liveness.told_to_end(self.ranks):
                self.abort = "the run monitor ended the ranks"
                continue
            beside = self.launcher.look(self.ranks, attempt)
            if beside is not None:
                self.sweeper.track(self.ranks.sessions | beside)
            if self.stop_requested and not stop_sent:
                stop_sent = self.launcher.pass_on_stop(self.ranks)
            if stop_sent and len(self.ranks.exited()) == len(self.ranks.children):
                return Verdict(Action.STOP)
            if not reported and not stop_sent:
                known, failure = self._outcome()
                if known and failure is None:
                    # Every rank exited 0: its whole log copied before the report (the driver may leave).
                    self.ranks.stop()
                    self._copy_logs()
                if known:
                    self.monitor.attempt_report.remote(attempt, self.worker, failure)
                    reported = True
            if stop_sent:
                continue
            # A failure here is decided at once; one on another node reaches this one within VERDICT_S.
            now = time.monotonic()
            if not reported and now - last_asked < (VERDICT_S if self.workers > 1 else LONE_VERDICT_S):
                continue
            last_asked = now
            verdict = handles.get(self.monitor.attempt_verdict.remote(attempt), timeout=60)
            if verdict.action != WAIT:
                return verdict

    def _outcome(self) -> tuple[bool, FailureRecord | None]:
        """This node's part of the attempt, once known (True): a failed child's record, or None
        when every child exited 0."""
        exited = self.ranks.exited()
        failed = [failure_of(c, self.node_id, self.hostname)
                  for c, code in exited if code != 0 and not self._crashed_after_end(c, code)]
        if failed:
            # Two ranks of this node may have ended by the time it looks (a SIGKILLed rank, then its
            # peer's lost connection): the cause is chosen as across nodes (attempts.py).
            return True, min(failed, key=cause_order)
        return len(exited) == len(self.ranks.children), None

    def _crashed_after_end(self, child, code: int) -> bool:
        """A signal death after the script returned: a library's teardown at exit (torch 2.13's gloo
        at times aborts there). The training is done; restarting it would only repeat the crash."""
        if code >= 0 or not child.returned():
            return False
        if child.rank not in self._teardown_warned:
            self._teardown_warned.add(child.rank)
            self.monitor.push.remote(RunWarning(message=(
                f"rank {child.rank}'s script ran to its end, then its process died by {signal_name(-code)} in the "
                "interpreter's teardown (a library's exit handler); counted as finished")))
        return True

    def _end_attempt(self, verdict: Verdict) -> None:
        failure = verdict.failure
        if failure.kind == HANG:
            records = self.ranks.flight_records()  # before the stacks, whose dump ends each rank
            stacks = self.ranks.dump_stacks()
            for rank, where in sorted(stacks.items()):
                log.error("rank %d was at %s when the hang was detected (its stacks are in its log)", rank, where)
            self.monitor.push.remote(Stacks(ranks={str(r): w for r, w in stacks.items()}, attempt=verdict.attempt - 1,
                                            collectives={str(r): c for r, c in records.items()}))
        self._end_ranks(last=False)

    def _end_ranks(self, last: bool) -> None:
        """End this attempt's ranks with everything they started, then send rank 0's last output
        and copy the logs; `last`: no attempt follows on this agent (what the launcher holds and
        the sweeper go too). Again at the agent's end, whatever ended the ranks before."""
        if self.ranks is not None:
            self.ranks.stop()
        if last:
            self.launcher.close()
        self._end_orphans()
        if last:
            self.sweeper.close()
        self.echo.flush()
        self._copy_logs()

    def _finish(self, stopped: bool) -> None:
        self.echo.flush()
        if self.worker != 0:
            return
        finished = self.liveness.finished(self.ranks, self.placement.attempt, stopped)
        if finished is not None:  # (None: rank 0 reported its own end)
            # Waited for: the worker may be torn down as soon as this returns (session.py's finish).
            handles.get(self.monitor.push.remote(finished), timeout=60)

    def _done(self) -> None:
        self._beats.join(timeout=BEAT_S + 10)  # a local run's process goes on: none of its threads stays
        try:  # waited for: a driver that sees every agent done may end the cluster at once
            handles.get(self.monitor.agent_done.remote(self.worker), timeout=10)
        except Exception:  # noqa: BLE001 - then the driver waits for Ray Train's end of the workers
            pass

    def _end_orphans(self) -> None:
        keep = {c.process.pid for c in self.ranks.children} if self.ranks else set()
        keep |= {self.sweeper.process.pid} | self.launcher.kept  # sessions kept
        sessions.end_marked(sessions.mark(self.scratch), keep, reap=self.group.owns_process)

    def _copy_logs(self) -> None:
        """On an object store, every rank's log of this node to <run>/logs/ (whole, each time)."""
        if self.config.log_dir is None:
            copy_logs(self.log_dir, self.run_dir.location.join("logs"))

    def _fail(self, verdict: Verdict) -> None:
        failure = verdict.failure or FailureRecord(0, INFRASTRUCTURE, verdict.reason)
        if failure.rank // self.k != self.worker and failure.kind != HANG:
            return  # the node of the failed rank reports it; this one only ends its ranks
        if failure.kind == HANG and self.worker != 0:
            return
        kind = failure.kind if failure.kind in (USER, TAKEN_OVER) else INFRASTRUCTURE
        lines = failure.last_lines if kind != USER else []
        note = failure.note or (f"its last lines: {' | '.join(lines)}" if lines else "")
        record = failure.for_group(kind, note)
        where = f" (raised at {record.where})" if record.where else ""
        raise WorkerFailure(f"rank {record.rank}: {record.error}{where}", record)

    # --- heartbeats, progress and rank 0's output --------------------------------------------------

    def _beat_loop(self) -> None:
        last_echo = 0.0
        while not self._closing:
            time.sleep(ECHO_S)
            now = time.monotonic()
            if now - last_echo >= ECHO_S:
                last_echo = now
                self.echo.flush()
            if now - self._last_beat < BEAT_S or self.ranks is None:
                continue
            self._last_beat = now
            try:
                self._beat()
                if self.worker == 0:
                    progress = self.liveness.progress(self.ranks, self.placement.attempt, now)
                    if progress is not None:
                        self.monitor.push.remote(progress)
            except Exception:  # noqa: BLE001 - a missed beat is the watchdog's to judge
                continue

    def _beat(self) -> None:
        ranks, attempt = self.ranks, self.attempt
        now = time.monotonic()
        self.liveness.look(ranks)
        replies = []
        for child in ranks.children:
            progress = child.progress()
            code = child.process.poll()
            # A child whose script returned is finished, though its interpreter's teardown (a
            # loaded machine, a library's exit handler) may take a while: its last beat, from
            # training, is not vouched for, or the watchdog would call the wait a hang.
            if code is not None or child.returned():
                if code is None or code == 0 or self._crashed_after_end(child, code):
                    replies.append(self.monitor.beat.remote(attempt, Beat(
                        rank=child.rank, step=self.liveness.finished_step(child, progress), phase=FINISHED,
                        idle_s=0.0, node_id=self.node_id, pid=child.process.pid)))
                continue  # a failed child is reported as the attempt's outcome
            if child.stopped():
                continue  # a stopped process answers nothing: its silence is what the watchdog sees
            beat = self.liveness.beat(child, progress, now)
            if beat is not None:
                replies.append(self.monitor.beat.remote(attempt, beat))
        for reply in handles.get(replies, timeout=10):
            self.stop_requested = self.stop_requested or reply.stop
            if reply.abort:
                self.abort = reply.abort
