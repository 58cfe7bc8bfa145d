"""The function every Ray Train worker runs: pick the harness the spec asks for."""

from __future__ import annotations

from typing import Any

from orchestrator.runtime.session import WorkerSession


def train_worker(config: dict[str, Any]) -> None:
    session = WorkerSession(config)
    if session.spec.kind == "lightning":
        from orchestrator.runtime.lightning_fit import train_lightning as harness
    else:
        from orchestrator.runtime.torch_loop import train_torch as harness
    try:
        harness(session)
    except BaseException:
        session.abandon()
        raise
