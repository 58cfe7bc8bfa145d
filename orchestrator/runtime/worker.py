"""The function every Ray Train worker runs: pick the harness the spec asks for."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from orchestrator.failures import WorkerFailure
from orchestrator.runtime.handoff import WorkerConfig
from orchestrator.runtime.session import WorkerSession

log = logging.getLogger("orchestrator.worker")


def train_worker(config: dict[str, Any]) -> None:
    handoff = WorkerConfig.from_config(config)
    if handoff.spec.kind != "lightning":  # the node's agent: its ranks are child processes (runtime/script/)
        from orchestrator.runtime.script.supervisor import train_script

        train_script(handoff)
        return
    session = WorkerSession(handoff)
    if session.spec.kind == "lightning":
        from orchestrator.runtime.lightning.fit import train_lightning as harness
    else:
        from orchestrator.runtime.torch.loop import train_torch as harness
    try:
        harness(session)
    except Exception as exc:  # noqa: BLE001 - every error is classified and raised again
        # The whole traceback goes to this rank's log; the driver gets the classified summary.
        log.error("training failed on rank %d:\n%s", session.rank, "".join(traceback.format_exception(exc)))
        session.abandon()
        # The global step it was raised at: the last one completed (or resumed from); None before
        # the group trained. By it the driver tells an error a restart brought back (faults.py).
        step = max(session.heartbeat.step, session.last_save_step, 0) if session.heartbeat else None
        raise WorkerFailure.from_exception(exc, session.rank, step=step) from None
    except BaseException:
        session.abandon()
        raise
