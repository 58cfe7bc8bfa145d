"""How a rank reaches the run monitor (driver/monitor.py), in the typed messages of protocol.py.

The one place a rank's code talks to the monitor: events are sent in order without waiting (one
caller's calls reach an actor in the order made), the last one (Finished) waited for, heartbeats
answered. A rank in a Ray Train worker holds the monitor's actor handle; a rank child of a node
agent reaches it through its agent (agent_link.py), behind these same methods.
"""

from __future__ import annotations

from typing import Any

from orchestrator.protocol import AttemptBegun, Beat, BeatReply, Event

# Seconds a call that waits for the monitor may take before it counts as failed.
CALL_TIMEOUT_S = 60.0


def connect_monitor(target: Any):
    """The client for WorkerConfig.monitor: the actor's handle, or a rank child's way to its agent."""
    from orchestrator.runtime.agent_link import AgentLink, LinkAddress

    return AgentLink(target) if isinstance(target, LinkAddress) else MonitorClient(target)


class MonitorClient:
    def __init__(self, handle: Any):
        self._handle = handle

    def send(self, event: Event) -> None:
        self._handle.push.remote(event)

    def send_and_wait(self, event: Event, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """For the last event of a worker: it may be torn down as soon as this returns, and a call
        still queued in it would be lost (the events sent before this one arrive first)."""
        import ray

        ray.get(self._handle.push.remote(event), timeout=timeout_s)

    def begin_attempt(self, world_size: int) -> AttemptBegun:
        import ray

        return ray.get(self._handle.begin_group.remote(world_size), timeout=CALL_TIMEOUT_S)

    def beat(self, attempt: int, beat: Beat, timeout_s: float) -> BeatReply:
        import ray

        return ray.get(self._handle.beat.remote(attempt, beat), timeout=timeout_s)
