"""The function every Ray Train worker runs: it is its node's agent, and the ranks are its children."""

from __future__ import annotations

from typing import Any

from orchestrator.worker_config import WorkerConfig


def train_worker(config: dict[str, Any]) -> None:
    from orchestrator.agent.rank_env import take_job_env
    from orchestrator.agent.supervisor import train_script

    worker_config = WorkerConfig.from_config(config)
    take_job_env(worker_config.spec.env)  # not given by Ray (cluster/connection.py runtime_env_vars)
    train_script(worker_config)
