"""The run monitor: a small actor owned by the driver that workers tell what is happening.

Workers push events (worker started, progress, checkpoint committed, finished) with
fire-and-forget calls; the driver polls them to print live progress and to write summary.json.
The actor outlives worker-group restarts, so it also remembers the newest checkpoint committed
during this run, which restarted workers resume from.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def start_monitor() -> ray.actor.ActorHandle:
    """A RunMonitor on the driver's own node.

    It needs no CPU, so Ray could place it on any node; on a worker node it would die with that
    node, taking the run's record of committed checkpoints with it. The driver's node lives
    exactly as long as the run does.
    """
    here = ray.get_runtime_context().get_node_id()
    return RunMonitor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()


@ray.remote(num_cpus=0)
class RunMonitor:
    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._latest_checkpoint: dict[str, Any] | None = None

    def push(self, kind: str, **payload: Any) -> None:
        event = {"kind": kind, "time": time.time(), **payload}
        if kind == "checkpoint":
            self._latest_checkpoint = event
        self._events.append(event)

    def events_since(self, index: int) -> list[dict[str, Any]]:
        return self._events[index:]

    def latest_checkpoint(self) -> dict[str, Any] | None:
        return self._latest_checkpoint
