"""The typed job spec: what validation returns and the rest of the code trusts.

Each section is a frozen dataclass, and each field is the one home of its facts: its default, and
through `option` (facts.py) its bounds, its choices and its YAML key; the comment above it is its
documentation (the JSON Schema's descriptions come from it, spec/schema.py). Validation reads them
from here. Loading and validation live beside it: `load.py` (files, overrides), `validate.py` (the
rules), `fields.py` (typed field readers).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec.data import DataSpec
from orchestrator.spec.facts import option
from orchestrator.spec.fields import import_object

DEFAULT_STORAGE = "~/orchestrator-runs"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PLACEMENTS = ("spread", "pack")
# Strategies each path offers. FSDP on the Lightning path comes with its own issue.
LIGHTNING_STRATEGIES = ("ddp", "fsdp", "deepspeed")
# Strategies whose checkpoints hold one part per rank.
SHARDED_STRATEGIES = ("fsdp", "deepspeed")
TORCH_STRATEGIES = ("ddp", "fsdp")
# Trainer arguments the orchestrator sets itself: a user value would fight the placement Ray made.
OWNED_TRAINER_ARGS = {
    "devices": "the number of workers is scaling.num_workers",
    "num_nodes": "the number of workers is scaling.num_workers",
    "accelerator": "scaling.use_gpu chooses the accelerator",
    "plugins": "the orchestrator passes its own: TorchElasticEnvironment, which reads the torchrun variables "
               "the node's agent gives each rank, and the CheckpointIO that writes into the store",
    "enable_checkpointing": "checkpoints are configured under checkpoint:",
    "default_root_dir": "the run directory is <storage>/<name>",
    "callbacks": "list them under lightning.callbacks as {class_path, init_args}",
    "logger": "name loggers under lightning.logger as {class_path, init_args}; they write into the run directory",
}


# ---------------------------------------------------------------------------------------------
# Typed spec


@dataclass(frozen=True)
class ClassRef:
    """A class named by its import path, with the keyword arguments to build it."""

    # The class's import path: "package.module.Class" (or "package.module:Class").
    class_path: str = option(example="jobs.digits.DigitsClassifier")
    # Keyword arguments for its constructor.
    init_args: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        return import_object(self.class_path, "class_path")(**self.init_args)


@dataclass(frozen=True)
class LightningSpec:
    model: ClassRef
    # The LightningDataModule (optional with a data: section, which then provides the loaders).
    data: ClassRef | None = option(None, depends="required unless the spec has a data: section")
    # Keyword arguments for lightning.Trainer, checked against its signature.
    trainer: dict[str, Any] = field(default_factory=dict)
    # ddp: a full copy of the model per rank (Lightning's DDPStrategy). fsdp: parameters, gradients
    # and optimizer state sharded over the ranks with FSDP2 (fully_shard), on CPUs and GPUs; a
    # module without a configure_model of its own is sharded per submodule, and every rank
    # writes its own shard of each checkpoint (orchestrator/rank/lightning/fsdp.py).
    strategy: str = option("ddp", choices=LIGHTNING_STRATEGIES, derived="written as lightning.trainer.strategy")
    # deepspeed: the arguments of Lightning's DeepSpeedStrategy (stage, offload, config...),
    # translated from lightning.trainer.strategy (orchestrator/spec/deepspeed.py); every rank
    # writes its own DeepSpeed files of each checkpoint (orchestrator/rank/lightning/deepspeed.py).
    deepspeed: dict[str, Any] | None = option(None, derived="written as lightning.trainer.strategy")
    # Callbacks built in every worker, after the orchestrator's own (a ModelCheckpoint is
    # translated into the checkpoint: section instead: orchestrator/spec/lightning.py).
    callbacks: list[ClassRef] = field(default_factory=list)
    # Lightning loggers, built in every worker (they write from rank 0) into
    # <run>/logs/lightning/<kind>/ unless their init_args name a save_dir.
    logger: list[ClassRef] = field(default_factory=list)


@dataclass(frozen=True)
class TorchSpec:
    # "package.module:function" (or "package.module.function"); called as train_loop(ctx).
    train_loop: str = option(example="jobs.digits_torch:train_loop")
    # Free-form settings handed to the loop as ctx.config.
    config: dict[str, Any] = field(default_factory=dict)
    # Epochs to train; the loop iterates ctx.epochs(). At least one of max_epochs/max_steps.
    max_epochs: int | None = option(None, minimum=1)
    # Optimizer steps to train in total; training stops after this many ctx.step() calls.
    max_steps: int | None = option(None, minimum=1)
    # ddp: ctx.prepare_model wraps the model in DistributedDataParallel (a full copy per rank).
    # fsdp: it shards parameters, gradients and optimizer state over the ranks (fully_shard), and
    # every rank writes its own shard of each checkpoint.
    strategy: str = option("ddp", choices=TORCH_STRATEGIES)


@dataclass(frozen=True)
class ScriptSpec:
    # The training script, run unchanged as __main__ (torchrun's SCRIPT), relative to the directory
    # the driver runs in. Exactly one of path and module.
    path: str | None = None
    # Or a module run as `python -m` runs it (torchrun's -m MODULE).
    module: str | None = None
    # The script's own arguments, passed untouched; {run_dir}, {name} and {storage} are replaced
    # (e.g. --work_dir {run_dir}/work puts its own checkpoints in the run directory).
    args: list[str] = field(default_factory=list)
    # Ranks per node (torchrun's --nproc_per_node): child processes of the node's one Ray Train
    # worker, which holds their resources. scaling.num_workers counts nodes (torchrun's --nnodes).
    nproc_per_node: int = option(1, minimum=1)

    # The script does its own parallelism: there is no strategy of the orchestrator's to choose.
    strategy = "script"


@dataclass(frozen=True)
class ScalingSpec:
    # Number of training workers (DDP ranks), >= 1. Written [min, max] in a spec: elastic, and
    # this is the max (the size the run grows back to when the cluster has room).
    num_workers: int = option(2, minimum=1)
    # Elastic runs: the fewest workers the run trains with (equal to num_workers: a fixed size).
    min_workers: int = option(2, minimum=1, derived="written as scaling.num_workers: [min, max]")
    # Elastic runs: seconds between checks for room to grow back toward num_workers. A growth
    # restarts the workers from the newest checkpoint, so a shorter interval grows sooner.
    resize_interval_s: float = option(30.0, minimum=1.0)
    # Samples per optimizer step over all workers, the same at every world size (None: each
    # worker's batch is its loader's batch_size, so the global batch follows the world size).
    # The orchestrator splits it into per-worker micro-batches and gradient accumulation.
    global_batch_size: int | None = option(None, minimum=1)
    # Give each rank one GPU and use NCCL; false trains on CPU with gloo.
    use_gpu: bool = False
    # Ray resources each worker asks for, e.g. {CPU: 1}; by default a CPU (and with use_gpu a GPU)
    # for each of its nproc_per_node ranks.
    resources_per_worker: dict[str, float] = option(factory=lambda: {"CPU": 1.0}, minimum=0,
                                                    depends="a CPU (with use_gpu a GPU) per rank of the worker")
    # spread: one worker per node where possible; pack: fill a node before using the next.
    placement: str = option("spread", choices=PLACEMENTS)
    # Ranks per worker (torchrun's --nproc_per_node) on the torch and Lightning paths: each worker
    # is a node's agent and runs this many rank children, restarted in place; the world is
    # num_workers x nproc_per_node ranks. A script's is script.nproc_per_node.
    nproc_per_node: int = option(1, minimum=1)

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.num_workers


@dataclass(frozen=True)
class KeepBestSpec:
    # Keep the K checkpoints with the best value of `monitor` (a metric in their manifests).
    k: int = option(1, minimum=1)
    # The metric to rank by, e.g. val_loss: a metric the training reports (Lightning's logged
    # metrics, or ctx.report / ctx.step on the torch path).
    monitor: str = option(example="val_loss", kw_only=True)
    # min: lower is better (losses) | max: higher is better (accuracies)
    mode: str = option("min", choices=("min", "max"))


@dataclass(frozen=True)
class CheckpointSpec:
    # Save every N optimizer steps (None: only at epoch ends and at the end of the run).
    every_n_steps: int | None = option(None, minimum=1)
    # Save when at least this many seconds passed since the last save (None: off).
    every_n_seconds: float | None = option(None, above=0)
    # Also save at the end of every epoch.
    at_epoch_end: bool = True
    # Keep the newest K committed checkpoints (None: keep all). The newest is never deleted.
    keep_last: int | None = option(3, minimum=1)
    # Also keep the best K by a metric; kept on top of keep_last (None: off).
    keep_best: KeepBestSpec | None = None
    # Write checkpoints in the background; the training loop only waits for an in-memory copy.
    async_save: bool = option(True, key="async")
    # Save as soon as Ray announces that a node of the run will be preempted (a node drain with
    # a deadline, e.g. a spot instance reclaimed), so the restart loses almost nothing.
    on_preemption: bool = True


# Seconds: the process groups' timeout is never shorter (FailureSpec.collective_timeout_s).
MIN_COLLECTIVE_TIMEOUT_S = 600


@dataclass(frozen=True)
class FailureSpec:
    # Worker-group restarts allowed after infrastructure failures (a lost node or worker, a hang,
    # a lost connection) before the run fails (-1: unlimited, 0: none). An exception raised by the
    # user's code is never retried: the run fails at once.
    max_failures: int = option(3, minimum=-1)
    # Restarts after a node preemption, counted apart from max_failures (-1: unlimited).
    max_preemptions: int = option(-1, minimum=-1)
    # Seconds without progress after which a worker counts as hung and the group restarts from
    # the newest checkpoint: a rank that stops answering (SIGSTOP, a frozen node) or ranks that
    # stop taking optimizer steps while training (a deadlock, a stuck collective). The first
    # step, checkpoints and validation are not timed by it (the first step and checkpoints have
    # limits of their own, below). Must exceed the longest optimizer step.
    hang_timeout_s: float = option(60.0, minimum=5.0)
    # Seconds a rank may spend starting: from its group's start to its first optimizer step
    # (restoring the checkpoint, building the model, a compiled or autotuned first step).
    startup_timeout_s: float = option(1800.0, minimum=5.0)
    # Seconds a rank may spend in one save: gathering and copying the state, and waiting for the
    # previous background write (its upload, read-back and retention) to end. A storage stall
    # (a hard NFS mount) past it restarts the group.
    checkpoint_timeout_s: float = option(1800.0, minimum=5.0)
    # Seconds a rank may spend finishing: after the last step, the end save and its write.
    finish_timeout_s: float = option(1800.0, minimum=5.0)

    @property
    def collective_timeout_s(self) -> int:
        """The process groups' timeout: a backstop behind the hang watchdog, which knows phases
        (a rank's long solo work is no hang), so never shorter than 10 minutes."""
        return int(max(MIN_COLLECTIVE_TIMEOUT_S, 10 * self.hang_timeout_s))

    @property
    def phase_limits(self) -> dict[str, float]:
        """The hang watchdog's limit for each phase that has one of its own (watchdog.py)."""
        return {"starting": self.startup_timeout_s, "checkpoint": self.checkpoint_timeout_s,
                "finishing": self.finish_timeout_s}
    # Seconds a run waits for the cluster to have room for its workers, at the start or after a
    # loss, before it gives up (exit 1, checkpoints kept). It says what it waits for every 30 s.
    capacity_timeout_s: float = option(600.0, minimum=10.0)
    # A rank whose own work a step (the batch, the forward, the loss) stays at this many times its
    # peers' median for straggler_after_s is named in a warning: its rank, node and host. Under
    # DDP the whole group waits for it every step. The run goes on (warn only).
    straggler_ratio: float = option(1.3, above=1.0)
    # Seconds a rank must stay at straggler_ratio or above before it is named.
    straggler_after_s: float = option(20.0, minimum=1.0)


@dataclass(frozen=True)
class JobSpec:
    # Run identity: <storage>/<name>/ holds its checkpoints and summary.json.
    name: str = option(example="digits-ddp")
    # Local directory, shared mount, or a pyarrow.fs URI (s3://...).
    storage: str = DEFAULT_STORAGE
    # latest | none | <checkpoint URI>
    resume_from: str = "latest"
    # Seeds python, numpy and torch on every rank (each rank offsets by its rank).
    seed: int = option(0, minimum=0)
    # A LightningModule and LightningDataModule to train (exactly one of lightning / torch / script).
    lightning: LightningSpec | None = None
    # A plain PyTorch loop, train_loop(ctx), to train (exactly one of lightning / torch / script).
    torch: TorchSpec | None = None
    # An unmodified torchrun-style script, supervised in child processes (exactly one of the three).
    script: ScriptSpec | None = None
    # How many workers, with which resources, placed how; the global batch.
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    # When to save checkpoints and which to keep.
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    # Restarts after lost workers, nodes and hangs; how long to wait for capacity.
    failure: FailureSpec = field(default_factory=FailureSpec)
    # Environment variables set in every worker (NCCL_SOCKET_IFNAME, NCCL_DEBUG, ...).
    env: dict[str, str] = field(default_factory=dict)
    # Parquet input the orchestrator streams, shards over the workers and resumes mid-epoch.
    data: DataSpec | None = None

    @property
    def kind(self) -> str:
        if self.script is not None:
            return "script"
        return "lightning" if self.lightning is not None else "torch"

    @property
    def sharded(self) -> bool:
        """fsdp (either path) and deepspeed: every rank holds, and checkpoints, its own part of the state."""
        return self.strategy in SHARDED_STRATEGIES

    @property
    def strategy(self) -> str:
        return (self.lightning or self.torch or self.script).strategy

    @property
    def ranks_per_worker(self) -> int:
        """Rank children each Ray Train worker (a node's agent) runs: script.nproc_per_node on the
        script path, scaling.nproc_per_node on the others."""
        return self.script.nproc_per_node if self.script is not None else self.scaling.nproc_per_node

    @property
    def strategy_field(self) -> str:
        return "lightning.trainer.strategy" if self.lightning is not None else "torch.strategy"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_record(self) -> dict[str, Any]:
        """to_dict() as JSON gives it back (lists for tuples): what a checkpoint's manifest keeps."""
        return json.loads(json.dumps(self.to_dict(), default=str))
