"""WorkerConfig: what the driver hands every node's agent, and each agent its rank children, as one
typed, frozen record instead of a loose dict (the agent's copy reaches the ranks in their config file).
On Ray it is the agents' train_loop_config, which is how the spec's `env:` reaches them: not in Ray's
runtime environment, which Ray logs and shows (cluster/connection.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.spec import JobSpec

if TYPE_CHECKING:
    from ray.actor import ActorHandle

# The key of the record in Ray Train's train_loop_config (which must be a dict).
CONFIG_KEY = "orchestrator"


@dataclass(frozen=True)
class LinkAddress:
    """Where a child finds its agent (WorkerConfig.monitor, in a rank child's config)."""

    path: str
    authkey: bytes


@dataclass(frozen=True)
class LeaseFence:
    """The driver's writer lease on the run (checkpoint/lease.py): every commit and deletion first
    checks that it is still current, so an orphaned group of a replaced driver changes nothing."""

    generation: int
    # The nonce it took that generation with (two drivers racing for one generation on an object
    # store are told apart by it).
    nonce: str


@dataclass(frozen=True)
class ScriptContext:
    """A torchrun script's run: what of the user's shell its ranks get, as under torchrun."""

    # The driver's directory: the ranks start there when this node has it (a shared checkout).
    cwd: str
    # The shell's NCCL_*, TORCH_*, GLOO_* and OMP_NUM_THREADS.
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerConfig:
    spec: JobSpec
    run_uri: str
    # The driver's resume choice (None: a fresh run); a restarted group resumes from newer ones.
    resume_uri: str | None
    # The RunMonitor actor (monitor/actor.py): events, heartbeats, resume points across restarts.
    # In a rank child's copy, where its agent listens for it (agent_link.py): it has no Ray.
    monitor: ActorHandle | LinkAddress
    # Where each rank's log goes (local and shared filesystems only).
    log_dir: str | None
    # None: the run's storage has no lease (a test's store).
    fence: LeaseFence | None
    # The nonce of the storage marker the driver wrote: each worker must read it back.
    storage_nonce: str | None
    script_context: ScriptContext | None = None
    # The driver's niceness, which every rank takes (Ray starts its workers, the agents, at 15).
    niceness: int = 0

    def __repr__(self) -> str:
        # Ray Train shows train_loop_config as text (its state API, the dashboard's Train runs),
        # and the spec's `env:` values are secrets (WANDB_API_KEY): its names only, no value.
        return (f"WorkerConfig(run={self.spec.name!r}, kind={self.spec.kind!r}, run_uri={self.run_uri!r}, "
                f"resume_uri={self.resume_uri!r}, env={sorted(self.spec.env)})")

    def to_config(self) -> dict[str, Any]:
        return {CONFIG_KEY: self}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WorkerConfig:
        return config[CONFIG_KEY]
