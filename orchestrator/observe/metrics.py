"""The run's metrics for Prometheus, Grafana and Ray's dashboard, through `ray.util.metrics`.

Ray exports every process's metrics at its node's Prometheus endpoint, prefixed `ray_`, with
`_total` added to counters, about every 10 s (`metrics_report_interval_ms`). Every series is
labelled with the run's name (`run`); the workers' own add the rank.

- The driver (`RunMetrics`) sees every event of the run monitor, through the run watcher: the
  step, epoch, throughput, step time, loss and the user's scalar metrics, the world size,
  restarts by cause, checkpoints committed, the checkpoint stall, the age of the newest committed
  checkpoint and the goodput so far. It sets every gauge again at each poll: Ray drops a series
  it has not seen for a while, and the checkpoint's age and the goodput change by themselves.
- The run monitor (`RankMetrics`) reports each rank's step time and its own work a step, from
  the ranks' heartbeats, on every path (a torchrun script's ranks too): a straggler stands out
  by its work (monitor/stragglers.py), since every rank of a DDP group takes the same time a step.

Nothing is a histogram: Ray computes a histogram's `_sum` from its bucket midpoints, so any
average taken from it would be wrong.
"""

from __future__ import annotations

import math
import time

from orchestrator.failures import HANG, INFRASTRUCTURE
from orchestrator.observe.goodput import compute as compute_goodput
from orchestrator.protocol import CheckpointCommitted, Event, Failure, Finished, Progress, RankStarted, RestartInPlace

PREFIX = "orchestrator_"

# The driver's gauges, labelled by run: name -> description.
RUN_GAUGES = {
    "global_step": "Optimizer steps done (the newest step rank 0 reported).",
    "epoch": "Epochs completed.",
    "samples_per_second": "Training samples per second over all workers, since the previous report.",
    "step_time_seconds": "Seconds per optimizer step, since the previous report (rank 0).",
    "loss": "The training loss of the newest step rank 0 reported (the `loss` metric).",
    "world_size": "Workers in the current worker group.",
    "checkpoint_step": "The step of the newest checkpoint committed during this run.",
    "checkpoint_age_seconds": "Seconds since the newest checkpoint of this run was committed.",
    "checkpoint_stall_seconds": "Seconds the training loop was blocked by checkpointing, summed over the run.",
    "goodput": "Share of the run's wall time so far spent on steps whose work is kept (0 to 1).",
}
USER_METRIC = ("metric", "The user's scalar metrics (ctx.step / ctx.report / self.log), by name.")
RESTARTS = ("restarts", "Worker-group restarts, by cause (infrastructure, hang, preemption, resize).")
CHECKPOINTS = ("checkpoints_committed", "Checkpoints committed during this run.")
WORKER_STEP_TIME = ("worker_step_time_seconds", "Seconds per optimizer step on one rank, since its previous "
                    "report.")
WORKER_STEP_WORK = ("worker_step_work_seconds", "Median seconds of one rank's own work in a step (the batch, the "
                    "forward, the loss): its peers wait for the slowest in the next collective.")

# A local run's endpoint (observe/local_metrics.py) while one runs in this process; else Ray's metrics.
_local = None


def serve_locally():
    """From now on, this process's metrics go to an endpoint of its own (a local run: no Ray node
    exports them); the endpoint, whose `url` is scraped and whose `close()` ends it."""
    global _local
    from orchestrator.observe.local_metrics import Endpoint

    _local = Endpoint()
    return _local


def stop_serving_locally() -> None:
    global _local
    if _local is not None:
        _local.close()
        _local = None


def _gauge(name: str, description: str, tag_keys: tuple[str, ...]):
    """Ray's Gauge, or its stand-in on a local run's endpoint."""
    if _local is not None:
        return _local.gauge(name, description, tag_keys)
    from ray.util.metrics import Gauge as RayGauge

    return RayGauge(name, description=description, tag_keys=tag_keys)


def _counter(name: str, description: str, tag_keys: tuple[str, ...]):
    """Ray's Counter, or its stand-in on a local run's endpoint."""
    if _local is not None:
        return _local.counter(name, description, tag_keys)
    from ray.util.metrics import Counter as RayCounter

    return RayCounter(name, description=description, tag_keys=tag_keys)


# Seconds between recomputations of the live goodput (Ray exports about every 10 s anyway).
GOODPUT_EVERY_S = 5.0
# What a worker group's start is counted as when no failure preceded it (an elastic resize).
RESIZE = "resize"


class RunMetrics:
    """The driver's metrics of one run: fed the run monitor's events, refreshed at each poll."""

    def __init__(self, run: str, started: float):
        self.run, self.started = run, started
        self._tags = {"run": run}
        self._gauges = {name: _gauge(PREFIX + name, description=text, tag_keys=("run",))
                        for name, text in RUN_GAUGES.items()}
        self._user = _gauge(PREFIX + USER_METRIC[0], description=USER_METRIC[1], tag_keys=("run", "name"))
        self._restarts = _counter(PREFIX + RESTARTS[0], description=RESTARTS[1], tag_keys=("run", "cause"))
        self._checkpoints = _counter(PREFIX + CHECKPOINTS[0], description=CHECKPOINTS[1], tag_keys=("run",))
        self.values: dict[str, float] = {}
        self.user: dict[str, float] = {}
        self.restarts: dict[str, int] = {}
        self._goodput_events: list[Event] = []
        self._attempts = 0
        self._pending_cause: str | None = None
        self._last_progress: tuple[int, int, float] | None = None  # (attempt, step, time)
        self._stall_by_attempt: dict[int, float] = {}
        self._newest_checkpoint_time: float | None = None
        self._goodput_at = float("-inf")

    def observe(self, event: Event) -> None:
        """One event of the run monitor (see monitor/actor.py), in the order they were pushed."""
        if isinstance(event, (RankStarted, Progress, Finished)):
            self._goodput_events.append(event)
        match event:
            case RankStarted(rank=0):
                self._attempt_started(event)
            case Failure():
                self._pending_cause = event.classification
            case RestartInPlace():  # the ranks restart in their agents, for a rank's failure
                self._pending_cause = HANG if event.failure.kind == HANG else INFRASTRUCTURE
            case Progress() | Finished():
                self._progress(event)
            case CheckpointCommitted():
                self._checkpoints.inc(1, tags=self._tags)
                self._newest_checkpoint_time = event.time
                self.values["checkpoint_step"] = float(event.step)
                # Progress comes every few seconds; a committed step is done, whatever it said last.
                self.values["global_step"] = max(self.values.get("global_step", 0.0), float(event.step))

    def _attempt_started(self, event: RankStarted) -> None:
        self._attempts += 1
        self.values["world_size"] = float(event.world_size)
        self.values["global_step"] = float(event.restored_step or 0)
        if self._attempts > 1:
            cause = str(self._pending_cause or RESIZE)  # a plain str for Ray's tags
            self.restarts[cause] = self.restarts.get(cause, 0) + 1
            self._restarts.inc(1, tags={**self._tags, "cause": cause})
        self._pending_cause = None

    def _progress(self, event: Progress | Finished) -> None:
        attempt, step, when = event.attempt, int(event.step), event.time
        previous = self._last_progress
        if previous and previous[0] == attempt and step > previous[1]:
            self.values["step_time_seconds"] = (when - previous[2]) / (step - previous[1])
        if not previous or previous[0] != attempt or step > previous[1]:
            self._last_progress = (attempt, step, when)
        self.values["global_step"] = max(self.values.get("global_step", 0.0), float(step))
        self.values["epoch"] = float(event.epoch)
        if isinstance(event, Progress) and event.samples_per_s:
            self.values["samples_per_second"] = float(event.samples_per_s)
        self._stall_by_attempt[attempt] = float(event.stall_s if isinstance(event, Progress)
                                                else event.checkpoint_stall_s)
        self.values["checkpoint_stall_seconds"] = sum(self._stall_by_attempt.values())
        for name, value in event.metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                if name == "loss":
                    self.values["loss"] = float(value)
                else:
                    self.user[name] = float(value)

    def refresh(self, now: float | None = None) -> None:
        """Set every gauge to its current value (the time-dependent ones computed now)."""
        now = time.time() if now is None else now
        if self._newest_checkpoint_time is not None:
            self.values["checkpoint_age_seconds"] = max(0.0, now - self._newest_checkpoint_time)
        # Goodput reads every event so far: recomputed every GOODPUT_EVERY_S, not at each poll.
        if now - self._goodput_at >= GOODPUT_EVERY_S and any(isinstance(e, Progress) for e in self._goodput_events):
            self._goodput_at = now
            goodput = compute_goodput(self._goodput_events, started=self.started, ended=now)
            # Until some group has a step time, its steps are worth nothing in the sum: a 0 would
            # be a false alarm, so the gauge waits (a dashboard shows no value yet).
            if goodput["goodput"] is not None:
                self.values["goodput"] = goodput["goodput"]
        for name, value in self.values.items():
            self._gauges[name].set(value, tags=self._tags)
        for name, value in self.user.items():
            self._user.set(value, tags={**self._tags, "name": name})


class RankMetrics:
    """Each rank's step time and own work a step, from its heartbeats (at most every `interval_s`)."""

    def __init__(self, run: str, interval_s: float):
        self._time = _gauge(PREFIX + WORKER_STEP_TIME[0], description=WORKER_STEP_TIME[1], tag_keys=("run", "rank"))
        self._work = _gauge(PREFIX + WORKER_STEP_WORK[0], description=WORKER_STEP_WORK[1], tag_keys=("run", "rank"))
        self._run, self._interval_s = run, interval_s
        self._since: dict[int, tuple[int, float]] = {}

    def new_attempt(self) -> None:
        self._since.clear()  # a group's first step: start-up is not step time

    def seen(self, rank: int, step: int, work_s: float | None) -> None:
        """A training rank's beat: its newest optimizer step, and its own work a step (None: unknown)."""
        now = time.monotonic()
        since = self._since.get(rank)
        if since is None or step < since[0]:
            self._since[rank] = (step, now)
            return
        if now - since[1] < self._interval_s or step == since[0]:
            return
        tags = {"run": self._run, "rank": str(rank)}
        self._time.set((now - since[1]) / (step - since[0]), tags=tags)
        if work_s:
            self._work.set(work_s, tags=tags)
        self._since[rank] = (step, now)


def endpoint() -> str | None:
    """This node's Prometheus endpoint, where the run's metrics are scraped (None if unknown)."""
    if _local is not None:
        return _local.url
    import ray

    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here and node.get("MetricsExportPort"):
            return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    return None
