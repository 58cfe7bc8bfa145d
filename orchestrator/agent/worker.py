"""The function every Ray Train worker runs: it is its node's agent, and the ranks are its children."""

from __future__ import annotations

from typing import Any

from orchestrator.worker_config import WorkerConfig


def train_worker(config: dict[str, Any]) -> None:
    from orchestrator.agent.supervisor import train_script

    train_script(WorkerConfig.from_config(config))
