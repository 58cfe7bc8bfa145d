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
