"""Where a node's agent stands in its group of agents: its index, the group's size, its node, the
address its ranks meet at, and its devices. On Ray, Ray Train's worker context says; in local
mode (driver/local.py) there is one agent, in the command's own process, on this machine."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from orchestrator.errors import OrchestratorError

# A local run's node id: this prefix and the host's name.
LOCAL_NODE_PREFIX = "local-"


class AgentEnded(OrchestratorError):
    """A local agent told to end its ranks now (a stop's grace ran out, the run taken over): on Ray
    the agent's process exits instead, which would end the command itself here."""


@dataclass(frozen=True)
class AgentGroup:
    worker: int
    workers: int
    node_id: str
    master_addr: str
    # Rank children of this agent: the spec's per worker on Ray; every rank of the run in local mode.
    ranks: int
    local: bool = False

    @classmethod
    def of_ray_train(cls, ranks: int) -> AgentGroup:
        import ray
        import ray.train

        context = ray.train.get_context()
        return cls(context.get_world_rank(), context.get_world_size(), ray.get_runtime_context().get_node_id(),
                   ray.util.get_node_ip_address(), ranks)

    @classmethod
    def on_this_machine(cls, ranks: int) -> AgentGroup:
        """The one agent of a local run, with all `ranks`: they meet on loopback, as torchrun's
        --standalone's do."""
        return cls(0, 1, local_node_id(), "127.0.0.1", ranks, local=True)

    @property
    def owns_process(self) -> bool:
        """Whether the agent's process is the orchestrator's own (a Ray Train worker), which may
        adopt and reap its ranks' orphans (a child subreaper). In local mode it is the caller's (a
        shell's command, a notebook's kernel, a test runner): its children, its orphans' parent and
        their exit statuses stay the caller's, and only what carries the ranks' mark is ended
        (sessions.py `end_marked`)."""
        return not self.local

    def devices(self, k: int, use_gpu: bool) -> str:
        """The devices of this agent's ranks, comma-separated (rank child i trains on the i-th)."""
        if not self.local:
            import ray.train.torch

            return ",".join(str(device) for device in ray.train.torch.get_devices())
        if not use_gpu:
            return "cpu"
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        count = len(visible) if visible else k
        return ",".join(f"cuda:{i}" for i in range(min(k, count)))


def local_node_id() -> str:
    """The node id a local run's events name: its host's, so that two machines' runs differ."""
    return f"{LOCAL_NODE_PREFIX}{socket.gethostname()}"
