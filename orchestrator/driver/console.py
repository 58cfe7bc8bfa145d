"""What the driver prints while a run goes on, and what it says when the run fails.

The watcher polls the run monitor once a second and prints one line per progress event, per
committed checkpoint, per worker-group start, per failure (with its classification) and per hang
verdict. While no worker group is up it also watches the cluster's capacity: after
FIRST_CAPACITY_REPORT_S it says, and then every CAPACITY_REPORT_INTERVAL_S, which resources the
run waits for and what the cluster has free, so a run never sits silently in PENDING (runs of a
sweep on one cluster take turns); and it records how long it waited for capacity (for goodput).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator import handles
from orchestrator.cluster.capacity import fmt, worker_resources, workers_that_fit
from orchestrator.failures import FailureRecord
from orchestrator.monitor.controller_errors import RestartsExhausted, RunTakenOver, UserCodeFailed
from orchestrator.observe.metrics import RunMetrics
from orchestrator.protocol import (
    CheckpointCommitted,
    Event,
    Failure,
    HangCollectives,
    Preemption,
    Progress,
    RankStarted,
    RestartInPlace,
    ResumeFallback,
    RunWarning,
    Stacks,
    Straggler,
)
from orchestrator.run_dir import RunDir
from orchestrator.spec import JobSpec

Console = Callable[[str], None]

# Seconds between the driver's polls of the run monitor.
POLL_INTERVAL_S = 1.0
# Seconds between the driver's reports of what a run without a worker group waits for.
CAPACITY_REPORT_INTERVAL_S = 30.0
# Seconds of waiting before the first such report: soon, so that a run queued behind others says why.
FIRST_CAPACITY_REPORT_S = 5.0
# Seconds between looks at the placement of the run's workers while no worker group is up.
CAPACITY_CHECK_INTERVAL_S = 1.0


def _placement_pending(job: JobSpec) -> bool:
    """Whether Ray Train's placement group for this run's workers waits for resources."""
    import ray
    bundle = worker_resources(job)
    for group in ray.util.placement_group_table().values():
        bundles = list(group.get("bundles", {}).values())
        if (group.get("state") in ("PENDING", "RESCHEDULING") and len(bundles) == job.scaling.num_workers
                and all({k: float(v) for k, v in b.items()} == bundle for b in bundles)):
            return True
    return False


def capacity_shortfall(job: JobSpec) -> str | None:
    """What the cluster lacks to place the run's workers now, in one sentence; None if it has it."""
    import ray

    per_worker, workers = worker_resources(job), job.scaling.num_workers
    need = {k: v * workers for k, v in per_worker.items()}
    available = ray.available_resources()
    free = {k: available.get(k, 0.0) for k in need}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    room = workers_that_fit(per_worker, (n["Resources"] for n in nodes), workers)
    if all(free[k] >= v for k, v in need.items()) and room >= workers:
        return None
    short = {k: v - free[k] for k, v in need.items() if free[k] < v}
    text = (f"it needs {workers} worker(s) x {fmt(per_worker)} = {fmt(need)}, and the cluster has {fmt(free)} "
            f"free" + (f" (short by {fmt(short)})" if short else ""))
    if room < workers:
        text += (f"; its {len(nodes)} alive node(s) can hold at most {room} such worker(s) even when idle, "
                 "so it must grow (or the spec ask for less)")
    return text


class RunWatcher:
    def __init__(self, monitor, job: JobSpec, say: Console, metrics: RunMetrics | None = None,
                 on_ray: bool = True):
        self.monitor, self.job, self.say = monitor, job, say
        self.on_ray = on_ray  # a local run waits for no placement: nothing to watch the capacity of
        self.metrics = metrics
        self._stop = threading.Event()
        self._seen = 0
        self._thread = threading.Thread(target=self._loop, name="run-watcher", daemon=True)
        self._starts = 0
        self._size = 0
        self._warned: set[str] = set()
        max_epochs = (job.lightning.trainer.get("max_epochs") if job.lightning else
                      job.torch.max_epochs if job.torch else None)
        self._epochs = f"/{max_epochs}" if max_epochs else ""
        # Capacity: whether a worker group is up, and the waits for placement measured.
        self._up = False
        self._last_report = 0.0
        self._last_check = 0.0
        self._waits: list[list[float]] = []
        self.last_shortfall: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain()
        self._close_wait(time.time())

    def capacity_waits(self) -> list[tuple[float, float]]:
        return [(a, b if b else time.time()) for a, b in self._waits]

    def _loop(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            self._drain()
            try:
                self._watch_capacity()
            except Exception:  # noqa: BLE001 - capacity reports are best effort
                pass

    def _drain(self) -> None:
        try:
            events = handles.get(self.monitor.events_since.remote(self._seen), timeout=10)
        except Exception:  # noqa: BLE001 - progress is best effort; the run's outcome comes from fit()
            return
        self._seen += len(events)
        for event in events:
            line = self._format(event)
            if line:
                self.say(line)
        self._export(events)
        if self.job.script is not None:
            self._show_output()

    def _show_output(self) -> None:
        """A script's rank-0 output, as torchrun shows it; taken from the monitor, never kept here."""
        try:
            lines, dropped = handles.get(self.monitor.take_output.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the output is also in the rank's log
            return
        if dropped:
            self.say(f"[orchestrator: {dropped} line(s) of rank 0's output not shown here (the console fell "
                     "behind); they are in its log, rank-0.log]")
        if lines:
            self.say("\n".join(lines))

    def _export(self, events: list[Event]) -> None:
        if self.metrics is None:
            return
        try:
            for event in events:
                self.metrics.observe(event)
            self.metrics.refresh()
        except Exception:  # noqa: BLE001 - metrics must never cost the run
            pass

    # --- capacity -------------------------------------------------------------------------------

    def _watch_capacity(self) -> None:
        now = time.time()
        if not self.on_ray or self._up or now - self._last_check < CAPACITY_CHECK_INTERVAL_S:
            return
        self._last_check = now
        if not _placement_pending(self.job):
            self._close_wait(now)
            return
        if not (self._waits and self._waits[-1][1] == 0):
            self._waits.append([now, 0])
        waited = now - self._waits[-1][0]
        # At least once before the run gives up, however short its capacity timeout.
        every = min(CAPACITY_REPORT_INTERVAL_S, self.job.failure.capacity_timeout_s / 2)
        first = self._last_report < self._waits[-1][0]  # nothing said yet in this wait
        if (waited >= FIRST_CAPACITY_REPORT_S and first) or (waited >= every and now - self._last_report >= every):
            self.last_shortfall = capacity_shortfall(self.job)
            self._last_report = now
            why = self.last_shortfall or "the cluster has not placed them yet"
            self.say(f"waiting for capacity for {waited:.0f} s (giving up after failure.capacity_timeout_s = "
                     f"{self.job.failure.capacity_timeout_s:g} s): {why}")

    def _close_wait(self, now: float) -> None:
        if self._waits and self._waits[-1][1] == 0:
            self._waits[-1][1] = now

    def _group_up(self, when: float) -> None:
        self._up = True
        self._close_wait(when)

    def _group_down(self) -> None:
        self._up = False

    # --- event lines ----------------------------------------------------------------------------

    def _format(self, event: Event) -> str | None:
        if isinstance(event, RankStarted) and event.rank == 0:
            self._group_up(event.time)
            self._starts += 1
            where = f"resuming from step {event.restored_step}" if event.restored_from else "starting fresh"
            size, before = event.world_size, self._size
            self._size = size
            if before and size != before:
                return f"resized: {before} -> {size} workers, {where}{_batch_note(self.job, size)}"
            prefix = "restarted: " if self._starts > 1 else ""
            per_node = self.job.ranks_per_worker
            if self.job.script is not None:
                return f"{prefix}{size} ranks up ({size // per_node} node(s) x {per_node})"
            if per_node > 1:
                return f"{prefix}{size} ranks up ({size // per_node} node(s) x {per_node}), {where}"
            return f"{prefix}{size} workers up, {where}"
        if isinstance(event, Progress) and event.script:
            return f"step {event.step:>6}"
        if isinstance(event, RestartInPlace):
            failure = event.failure
            budget = "unlimited" if event.max_restarts < 0 else f"{event.max_restarts}"
            where = f" at {failure.where}" if failure.where else ""
            return (f"rank {failure.rank} failed ({failure.kind}): {failure.error}{where}; restarting every "
                    f"rank in place (attempt {event.attempt}: restart {event.restarts} of {budget}, "
                    f"TORCHELASTIC_RESTART_COUNT={event.restarts})")
        if isinstance(event, HangCollectives):
            return event.message
        if isinstance(event, Stacks):
            if not event.ranks:
                return None
            ranks = sorted(event.ranks.items(), key=lambda item: int(item[0]))
            return "stacks of the hung ranks are in their logs: " + "; ".join(
                f"rank {rank} was at {where}" for rank, where in ranks)
        if isinstance(event, Progress):
            metrics = "  ".join(f"{k} {v:.4g}" for k, v in sorted(event.metrics.items()))
            # Mid-epoch events carry the epoch in progress (0-based); boundary events the epochs done.
            at_boundary = event.batch_in_epoch == 0
            epoch = f"epoch {event.epoch if at_boundary else event.epoch + 1}{self._epochs}"
            epoch += " done" if at_boundary else ""
            rate = f"  {event.samples_per_s:,.0f} samples/s" if event.samples_per_s else ""
            return f"{epoch:<14} step {event.step:>6}  {metrics}{rate}"
        if isinstance(event, CheckpointCommitted):
            return f"checkpoint committed: step {event.step} ({event.reason}) -> {event.uri}"
        if isinstance(event, Preemption):
            return (f"preemption notice: node(s) {', '.join(n[:12] for n in event.nodes)} go away in "
                    f"{event.seconds_left}; checkpointing at step {event.step}")
        if isinstance(event, Failure):
            self._group_down()
            ranks = "; ".join(_record_line(r) for r in event.ranks) or "no rank reported an error"
            user = ("not retried: it came back at the same step after a restart" if _repeated(event.ranks)
                    else "not retried: it is an error in the training code")
            then = {"user": user, "stopped": "not restarted: the run is stopping",
                    "taken_over": "not restarted: another driver took the run over, and this one stops"}.get(
                event.classification, "restarting from the newest committed checkpoint")
            if event.exhausted:
                then = "not restarted: the restarts failure.max_failures allows are used up"
            return f"failure ({event.classification}): {ranks}; {then}"
        if isinstance(event, RunWarning):
            if event.message in self._warned:  # each group restart repeats it: said once
                return None
            self._warned.add(event.message)
            return f"warning: {event.message}"
        if isinstance(event, Straggler):
            return f"warning: {event.message}"
        if isinstance(event, ResumeFallback):
            return (f"warning: checkpoint {event.wanted} could not be read ({event.cause}); "
                    f"the group resumes from {event.uri}")
        return None


def _batch_note(job: JobSpec, size: int) -> str:
    global_batch = job.scaling.global_batch_size
    if not global_batch:
        return " (the global batch follows the world size: set scaling.global_batch_size to hold it)"
    return f" (global batch {global_batch}: {global_batch // size} per worker)"


def _record_line(record: FailureRecord) -> str:
    where = f" at {record.where}" if record.where else ""
    host = f", host {record.hostname}" if record.hostname else ""
    place = f" (node {record.node_id[:12]}{host}, pid {record.pid})" if record.node_id else ""
    # A repeat's note is the paragraph's to tell (describe_failure); a GPU fault's says which node to drain.
    note = f" ({record.note})" if record.note and not record.repeated else ""
    return f"rank {record.rank}{place}: {record.error}{where}{note}"


def _repeated(records: list[FailureRecord]) -> FailureRecord | None:
    return next((r for r in records if r.repeated), None)


def describe_failure(job: JobSpec, error: BaseException, run_dir, result, watcher: RunWatcher | None) -> str:
    """One paragraph for a run that failed: what failed, how it was classified, what to do."""
    logs = RunDir(run_dir).logs
    kept = ("The newest committed checkpoint is kept; fix the cause and run the same command again to resume "
            "from it.")
    if job.script is not None:
        kept = ("The script's own checkpoints are untouched; fix the cause and run the same command again (a script "
                "that resumes from its latest checkpoint goes on from there).")
    root = getattr(error, "controller_failure", None) or error  # ray.train.ControllerError's cause
    if isinstance(root, RunTakenOver):
        return taken_over_message(job.name, root.records[0].error if root.records else root.message)
    if isinstance(root, UserCodeFailed):
        first = root.records[0].rank if root.records else 0
        log_file = f"{logs}/rank-{first}.log" if logs else "Ray's worker logs (ray logs)"
        attempt = "its first attempt" if not result.restarts else f"attempt {result.restarts + 1}"
        repeated = _repeated(root.records)
        why = ("This is an error in the training code, so it was not retried (failure.max_failures applies to "
               "lost workers, nodes and hangs).") if not repeated else (
            f"The first time, it was retried as a possible storage hiccup; it came back at the same step "
            f"({repeated.step}) after the restart from the newest checkpoint, which replays the same batch, so it "
            "is deterministic (the data at that step, the code, or access to storage), not the infrastructure, and "
            "it was not retried again.")
        return f"run '{job.name}' failed on {attempt}: {root.message}. {why} Full traceback: {log_file}. {kept}"
    if isinstance(root, RestartsExhausted):
        return f"run '{job.name}' failed: {root.message}. Logs: {logs or 'ray logs'}. {kept}"
    if type(root).__name__ == "WorkerGroupStartupTimeoutError":
        why = capacity_shortfall(job) or (watcher.last_shortfall if watcher else None) or \
            "the cluster did not place the workers in time"
        return (f"run '{job.name}' gave up waiting for capacity after failure.capacity_timeout_s = "
                f"{job.failure.capacity_timeout_s:g} s: {why}. Fix: add nodes, lower scaling.num_workers or "
                f"scaling.resources_per_worker, or raise failure.capacity_timeout_s. {kept}")
    if type(root).__name__ == "PreemptionError":  # ray.train's: the preemptions' own budget is used up
        allowed = job.failure.max_preemptions
        return (f"run '{job.name}' failed: a node of it was preempted (drained with a deadline, as a spot instance "
                f"is reclaimed), and the restarts after a preemption that failure.max_preemptions ({allowed}) allows "
                "are used up (they are counted apart from failure.max_failures). Fix: run the "
                "same command again to resume from the checkpoint taken on the notice, or raise "
                f"failure.max_preemptions (-1: unlimited). Worker logs: {logs or 'ray logs'}. {kept}")
    if type(error).__name__ == "WorkerGroupError" and result.failures:  # ray.train's
        last = result.failures[-1]
        ranks = "; ".join(_record_line(FailureRecord.from_dict(r)) for r in last["ranks"])
        return (f"run '{job.name}' failed after {result.restarts} restart(s), the most failure.max_failures "
                f"({job.failure.max_failures}) allows; the last failure ({last['classification']}): {ranks}. "
                f"Worker logs: {logs or 'ray logs'}. {kept}")
    text = [line for line in str(root).strip().splitlines() if line.strip()]
    tail = text[-1] if text else type(root).__name__
    return f"run '{job.name}' failed: {tail}. Worker logs: {logs or 'ray logs'}. {kept}"


def taken_over_message(name: str, lost: str) -> str:
    """Why a run stopped on this driver when another took it over; `lost` is LeaseLost's text, which
    says who holds the run now (its advice is given here)."""
    taken = lost.removeprefix("LeaseLost: ").split(" This writer stops")[0].rstrip(".")
    return (f"run '{name}' stopped on this driver: another driver took the run over ({taken}). This driver's "
            "workers stopped without a retry, and it leaves the run directory, summary.json included, to the newer "
            "driver, which continues the run from the newest committed checkpoint. Fix: nothing if that driver is "
            "meant to run it; otherwise stop it and run the same command here again.")
