"""What the driver hands every worker: one typed, frozen record instead of a loose dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.spec import JobSpec

# The key of the record in Ray Train's train_loop_config (which must be a dict).
CONFIG_KEY = "orchestrator"


@dataclass(frozen=True)
class WorkerConfig:
    spec: JobSpec
    run_uri: str
    # The driver's resume choice (None: a fresh run); a restarted group resumes from newer ones.
    resume_uri: str | None
    # The RunMonitor actor: events, heartbeats, resume points across restarts.
    monitor: Any
    # Where each rank's log goes (local and shared filesystems only).
    log_dir: str | None
    # The driver's writer lease on the run: every commit and deletion checks it is still current.
    lease_generation: int | None
    # ... and the nonce it took that generation with (two drivers racing for one generation on an
    # object store are told apart by it).
    lease_nonce: str | None
    # The nonce of the storage marker the driver wrote: each worker must read it back.
    storage_nonce: str | None
    # A torchrun script's run: the driver's directory ("cwd") and the variables of the user's shell
    # that reach every rank as they would under torchrun ("env": NCCL_*, TORCH_*, GLOO_*, OMP_NUM_THREADS).
    script_context: dict[str, Any] | None = None

    def to_config(self) -> dict[str, Any]:
        return {CONFIG_KEY: self}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WorkerConfig:
        return config[CONFIG_KEY]
