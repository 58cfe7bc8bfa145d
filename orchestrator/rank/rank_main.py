"""A rank of a ctx or Lightning job as its node's agent runs it: a child process with torchrun's
environment, no Ray.

    python .../rank/script/bootstrap.py -m orchestrator.rank.rank_main

The agent (agent/supervisor.py) starts it through the same bootstrap as a torchrun script's rank,
which gives it what every rank has: it dies with its agent, its optimizer steps and Python stack
are watched, its stacks are dumped on a hang verdict, and an uncaught exception is classified and
written for the agent. Here the rank joins the process group the agent's environment describes
(env://), opens its worker session with the run monitor reached through the agent
(agent_link.py), and runs the training: the ctx loop, or Lightning's Trainer. A crashed, hung
or failed rank is restarted by its agent in place; only a lost agent goes through Ray Train's
group restart.
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from orchestrator.rank.identity import rank_device
from orchestrator.worker_config import WorkerConfig

# The agent's file for this attempt's ranks (RankConfig, pickled), in its private scratch folder.
CONFIG_VAR = "ORCHESTRATOR_RANK_CONFIG"

log = logging.getLogger("orchestrator.worker")


@dataclass(frozen=True)
class RankConfig:
    """What an agent hands its rank children: the run's WorkerConfig (its monitor an
    agent_link.LinkAddress), and whether this attempt restarts the ranks in place."""

    worker: WorkerConfig
    in_place: bool


def write_config(path: str, config: RankConfig) -> None:
    # Written by the agent into its own scratch folder (mode 0700) and read by its children alone:
    # a config of this user's own processes, not data from outside.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(config, f)


def read_config(path: str) -> RankConfig:
    with open(path, "rb") as f:
        return pickle.load(f)


def _join_process_group(device: torch.device, timeout_s: float | None) -> None:
    """The rank's process group, as Ray Train's torch backend makes it for a worker."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
    dist.init_process_group(backend=backend, init_method="env://", timeout=timeout,
                            device_id=device if device.type == "cuda" else None)


def _log_to_stderr() -> None:
    """The orchestrator's lines on stderr: the agent copies them into this rank's log."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("orchestrator")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def main() -> None:
    config = read_config(os.environ[CONFIG_VAR])
    _log_to_stderr()
    from orchestrator.rank.session import WorkerSession

    if config.worker.spec.kind == "lightning":
        from orchestrator.rank.lightning.fit import train_lightning as harness
    else:
        from orchestrator.rank.torch.loop import train_torch as harness

    _join_process_group(rank_device(), config.worker.spec.failure.collective_timeout_s)
    session = WorkerSession(config.worker, in_place=config.in_place)
    ended_well = False
    try:
        harness(session)
        ended_well = True
    except BaseException as exc:
        session.abandon(exc)  # notes the step it was raised at
        raise  # printed and classified by the bootstrap, for the agent
    finally:
        # After a failure a peer may be gone: destroying the group could wait on it.
        if ended_well and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
