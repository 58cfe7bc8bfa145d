"""Who this rank is, read from torchrun's environment variables.

Every rank is a child process of its node's agent, on every path, and gets them from the agent
(agent/children.py) as torchrun gives them, so nothing that asks who a rank is needs Ray. The
node is the agent's Ray node id (ORCHESTRATOR_NODE_ID).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.errors import UserError

NODE_ID_VAR = "ORCHESTRATOR_NODE_ID"
# The torch devices Ray Train gave a node agent, comma-separated ("cpu", "cuda:0,cuda:1"): its rank
# child LOCAL_RANK trains on the LOCAL_RANK-th.
DEVICE_VAR = "ORCHESTRATOR_DEVICE"


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_id: str

    @classmethod
    def from_env(cls) -> RankIdentity:
        env = os.environ
        missing = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if name not in env]
        if missing:
            raise UserError(f"{', '.join(missing)} not set: a rank runs under torchrun's environment, which "
                            "its node's agent sets. Fix: start the job with `orchestrator run SPEC` (or "
                            "`orchestrator torchrun ...`), not by importing its harness.")
        return cls(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), local_rank=int(env["LOCAL_RANK"]),
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")), node_id=env.get(NODE_ID_VAR, ""))


def agent_devices() -> list[str]:
    """The devices this rank's agent was given (one a rank), else the CPU."""
    return (os.environ.get(DEVICE_VAR) or "cpu").split(",")


def rank_device():
    """This rank's torch device: its own of its agent's devices, else the CPU."""
    import torch

    devices = agent_devices()
    return torch.device(devices[int(os.environ.get("LOCAL_RANK", "0")) % len(devices)])
