"""A node's agent: the Ray Train worker that runs the node's K ranks (torchelastic's model:
agents survive, workers restart; a ctx or Lightning rank runs the worker session itself:
session_ranks.py). It starts its ranks as child processes (children.py), with torchrun's
environment, and watches them:
- a child that dies or fails is reported to the run monitor, which decides for every node
  (monitor/attempts.py): restart every rank in place (the same Ray Train workers, no new placement),
  fail the run (a user error, or the restarts used up), or finish (every rank exited 0);
- every second the children's optimizer-step counters and liveness (when each one's Python stack
  last moved, when its session last used CPU) go to the run monitor as heartbeats, and a child
  that exited 0 is reported finished: the hang watchdog judges an unmodified script by what it
  does, not by whether it steps an optimizer (monitor/watchdog.py). A stopped child (SIGSTOP)
  sends none. On a hang verdict every rank's stacks go into its log, and it ends;
- rank 0's output is sent to the driver's console (best effort: a backlog past echo.BACKLOG
  lines is dropped with a note, the log keeps everything); every rank's goes to
  <run>/logs/rank-N.log, on every storage (on an object store, copied there at each attempt's end);
- nothing the ranks start outlives them, nor is anything else ended: each rank's session goes with
  it, what left its session (a daemon that called setsid) by the mark the ranks' processes inherit,
  and a sweeper process ends both if this one is killed (children.py, sessions.py).

The training runs in processes with no Ray in them (a ctx or Lightning job's next ones started
ahead: spares.py). Only a lost worker or node goes through Ray Train's group restart.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

from orchestrator import handles
from orchestrator.agent import sessions
from orchestrator.agent.children import LocalRanks, Placement, Sweeper, copy_logs, free_port
from orchestrator.agent.echo import Echo
from orchestrator.agent.group import AgentEnded, AgentGroup
from orchestrator.agent.outcome import failure_of, signal_name
from orchestrator.agent.rank_signals import RankSignals
from orchestrator.agent.rank_start import RankStart
from orchestrator.agent.session_ranks import Answers, SessionStart
from orchestrator.agent.spares import Spares
from orchestrator.failures import HANG, INFRASTRUCTURE, TAKEN_OVER, USER, FailureRecord, WorkerFailure
from orchestrator.protocol import (
    FINISH,
    RESTART,
    WAIT,
    Action,
    Beat,
    Finished,
    RankStarted,
    RunWarning,
    Stacks,
    Verdict,
    cause_order,
)
from orchestrator.protocol import Progress as ProgressEvent
from orchestrator.rank.agent_link import LinkServer
from orchestrator.rank.collectives import broadcast_object
from orchestrator.rank.heartbeat import FINISHED, HANG_EXIT_CODE, TRAINING, WORKING
from orchestrator.rank.scratch import make_scratch
from orchestrator.run_dir import RunDir
from orchestrator.worker_config import ScriptContext, WorkerConfig

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
# Seconds between heartbeats (one per child) and between progress events to the driver.
BEAT_S = 1.0
PROGRESS_S = 2.0
# Seconds between batches of rank 0's output sent to the driver's console.
ECHO_S = 0.3
# CPU seconds a rank's session must use within one heartbeat to count as alive by its CPU: more
# than the clock ticks the bootstrap's own look at the stack can add (1 tick = 10 ms).
CPU_ALIVE_S = 0.02


def train_script(config: WorkerConfig) -> None:
    Supervisor(config, AgentGroup.of_ray_train(config.spec.ranks_per_worker)).run()


class Supervisor:
    def __init__(self, config: WorkerConfig, group: AgentGroup, spares: Spares | None = None):
        self.config, self.spec, self.monitor = config, config.spec, config.monitor
        # A ctx or Lightning rank runs the worker session in the child (session_ranks.py).
        self.sessions = self.spec.kind != "script"
        # How long a rank whose training raised may take to end before it is ended (children.py).
        self.failing_grace_s = min(self.spec.failure.hang_timeout_s, self.spec.failure.finish_timeout_s)
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
        # Per rank: its session's CPU seconds at the last beat, and when they last grew.
        self._cpu: dict[int, tuple[float, float]] = {}
        self.ranks: LocalRanks | None = None
        self.placement: Placement | None = None
        self.attempt = 0
        # Set by the heartbeat thread from the monitor's replies (abort: why the ranks are ended).
        self.abort, self.stop_requested = None, False
        self._closing, self._last_beat, self._first_step_seen, self._last_progress_step = False, 0.0, False, 0
        self._teardown_warned: set[int] = set()
        self.echo = Echo(lambda output: self.monitor.push.remote(output))  # rank 0's output, to the console
        self.answers = Answers(self.monitor, on_ray_train=not group.local) if self.sessions else None
        self.link = LinkServer(self.scratch, self.answers) if self.sessions else None
        self.rank_signals = RankSignals(self.monitor)  # a ctx or Lightning rank's SIGTERM: the run's stop
        # The next attempt's ranks, started ahead (a ctx or Lightning job's: spares.py); a local
        # run's command may have started the first attempt's already (driver/local.py).
        self.spares = (spares or Spares(self.spec.kind, SessionStart.command(), SessionStart.cwd())
                       if self.sessions else None)

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
            if self.ranks is not None:
                self.ranks.stop()
            if self.spares is not None:
                self.spares.close()
            self._end_orphans()
            self.sweeper.close()
            self.echo.flush()
            self._copy_logs()
            if self.link is not None:
                self.link.close()
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
        if self.sessions:
            self.answers.new_attempt(placement.attempt, latest_uri or self.config.resume_uri)
            start = SessionStart(self.config, self.link.address, self.scratch, self.node_id,
                                 self.group.devices(self.k, self.spec.scaling.use_gpu))
            env, echo = start.env(placement, in_place), None  # a ctx job's output stays in its logs
        else:
            start = RankStart(self.spec, self.config.script_context or ScriptContext(os.getcwd()), self.run_dir)
            env, echo = start.env(placement), self.echo
        self.ranks = LocalRanks(start.command(), start.cwd(), env, placement, self.scratch, self.log_dir, echo=echo,
                                spares=self.spares.take() if self.spares is not None else None)
        self.sweeper.track(self.ranks.sessions)
        self._cpu.clear()
        if self.sessions:
            return  # each child announces itself, with the checkpoint it resumed from
        # One event per rank: the driver's "N workers up" line, summary.json's workers, failure places.
        for child in self.ranks.children:
            self.monitor.push.remote(RankStarted(
                rank=child.rank, world_size=placement.world_size, attempt=placement.attempt, node_id=self.node_id,
                hostname=self.hostname, pid=child.process.pid, in_place=in_place))
        self._first_step_seen, self._last_progress_step = False, 0

    def _watch(self, attempt: int) -> Verdict:
        reported = False
        last_asked = 0.0
        stop_sent = False
        while True:
            time.sleep(POLL_S)
            if self.abort:
                log.error("ending this node's ranks: %s", self.abort)
                self.ranks.stop()
                self._end_orphans()
                self.sweeper.close()
                self.echo.flush()
                self._copy_logs()
                if self.group.local:  # the agent is the command's own process: it goes on, the run ends
                    raise AgentEnded(self.abort)
                os._exit(HANG_EXIT_CODE)
            if self.sessions and any(code == HANG_EXIT_CODE for _, code in self.ranks.exited()):
                # A child's heartbeat was told to end (a stop's grace ran out, the run taken over).
                self.abort = "the run monitor ended the ranks"
                continue
            if self.sessions:
                self.rank_signals.pass_on(attempt, self.ranks.children)
            if self.spares and self.spares.start_when_settled(self.ranks, attempt, self.answers.beats_itself):
                self.sweeper.track(self.ranks.sessions | self.spares.pids)
            if self.stop_requested and not stop_sent and not self.sessions:
                # As torchrun does with the signal it gets: every rank is sent SIGTERM (a script that
                # handles it saves and exits); the driver ends the workers when its grace runs out.
                self.ranks.forward(signal.SIGTERM)
                stop_sent = True
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
        self.ranks.stop()
        self._end_orphans()
        self.echo.flush()
        self._copy_logs()

    def _finish(self, stopped: bool) -> None:
        self.echo.flush()
        if self.worker != 0 or self.sessions:  # a ctx job's rank 0 reported its own end
            return
        progress = self.ranks.children[0].progress()
        # Waited for: the worker may be torn down as soon as this returns (session.py's finish).
        handles.get(self.monitor.push.remote(Finished(
            attempt=self.placement.attempt, stopped=stopped, step=progress.steps,
            step_time_s=progress.step_time_s or None)), timeout=60)

    def _done(self) -> None:
        self._beats.join(timeout=BEAT_S + 10)  # a local run's process goes on: none of its threads stays
        try:  # waited for: a driver that sees every agent done may end the cluster at once
            handles.get(self.monitor.agent_done.remote(self.worker), timeout=10)
        except Exception:  # noqa: BLE001 - then the driver waits for Ray Train's end of the workers
            pass

    def _end_orphans(self) -> None:
        keep = {c.process.pid for c in self.ranks.children} if self.ranks else set()
        keep |= {self.sweeper.process.pid} | (self.spares.pids if self.spares else set())  # sessions kept
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
        last_progress, last_echo = 0.0, 0.0
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
                if self.worker == 0 and (now - last_progress >= PROGRESS_S or not self._first_step_seen):
                    last_progress = now
                    self._progress()
            except Exception:  # noqa: BLE001 - a missed beat is the watchdog's to judge
                continue

    def _beat(self) -> None:
        ranks, attempt = self.ranks, self.attempt
        now = time.monotonic()
        cpu = sessions.cpu_seconds(ranks.sessions)
        if self.sessions:  # a rank on its way out past its grace is ended: its exit brings its error
            ranks.end_failing(self.failing_grace_s)
        replies = []
        for child in ranks.children:
            progress = child.progress()
            code = child.process.poll()
            # A child whose script returned is finished, though its interpreter's teardown (a
            # loaded machine, a library's exit handler) may take a while: its last beat, from
            # training, is not vouched for, or the watchdog would call the wait a hang.
            if code is not None or child.returned():
                if code is None or code == 0 or self._crashed_after_end(child, code):
                    step = self.answers.last_step(child.rank) if self.sessions else progress.steps
                    replies.append(self.monitor.beat.remote(attempt, Beat(
                        rank=child.rank, step=step, phase=FINISHED, idle_s=0.0, node_id=self.node_id,
                        pid=child.process.pid)))
                continue  # a failed child is reported as the attempt's outcome
            if child.stopped():
                continue  # a stopped process answers nothing: its silence is what the watchdog sees
            if self.sessions:
                # A session child beats itself once its session starts; until then, or while its
                # own beat is overdue though it runs, or once its training raised, the agent beats
                # for it (session_ranks.py).
                failing_s = child.failing_for()
                if failing_s is not None:  # past its grace it is being ended (above)
                    beat = (self.answers.failing_beat(child.rank, failing_s, self.node_id, child.process.pid)
                            if failing_s <= self.failing_grace_s else None)
                elif self.answers.beats_itself(child.rank):
                    beat = self.answers.vouched(child.rank, now, progress.steps, progress.idle_s)
                else:
                    beat = self.answers.starting_beat(child.rank, now - child.started, self.node_id,
                                                      child.process.pid)
                if beat is not None:
                    replies.append(self.monitor.beat.remote(attempt, beat))
                continue
            used = cpu.get(child.process.pid, 0.0)
            before, alive_at = self._cpu.get(child.rank, (used, now - progress.idle_s))
            if used - before >= CPU_ALIVE_S:
                alive_at = now
            self._cpu[child.rank] = (used, alive_at)
            active_idle = min(progress.idle_s, progress.stack_idle_s, now - alive_at)
            replies.append(self.monitor.beat.remote(attempt, Beat(
                rank=child.rank, step=progress.steps, phase=TRAINING if progress.steps else WORKING,
                idle_s=progress.idle_s, node_id=self.node_id, pid=child.process.pid,
                stack_idle_s=progress.stack_idle_s, active_idle_s=active_idle, work_s=progress.work_s or None)))
        for reply in handles.get(replies, timeout=10):
            self.stop_requested = self.stop_requested or reply.stop
            if reply.abort:
                self.abort = reply.abort

    def _progress(self) -> None:
        if self.sessions:
            return  # a ctx job's rank 0 reports its own progress
        progress = self.ranks.children[0].progress()
        steps = progress.steps
        if not steps or steps == self._last_progress_step:
            return
        self._last_progress_step = steps
        first = not self._first_step_seen
        self._first_step_seen = True
        # step_time_s: the median time between rank 0's consecutive optimizer steps, as the
        # bootstrap timed them (goodput counts the steps by it).
        self.monitor.push.remote(ProgressEvent(step=steps, batch_in_epoch=1, attempt=self.placement.attempt,
                                               first_step=first, script=True,
                                               step_time_s=progress.step_time_s or None))
