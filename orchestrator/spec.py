"""The job spec: YAML or a Python dict in, typed and validated `JobSpec` out.

Validation happens once, at the edge. Every mistake raises `SpecError` with one paragraph naming
the field path, the value that was given and how to fix it; an unknown key names the nearest
valid key. Past this module the rest of the code trusts the types.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import SpecError
from orchestrator.lightning_cli_config import merge_lightning_config
from orchestrator.spec_data import DataSpec, parse_data
from orchestrator.spec_deepspeed import STRATEGY_CLASS_PATHS, check_deepspeed_scaling, deepspeed_args, is_deepspeed
from orchestrator.spec_lightning import (
    check_lightning_class,
    check_logger_package,
    checkpoint_settings,
    is_model_checkpoint,
    merge_checkpoint,
)

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
    "plugins": "the orchestrator installs Ray's cluster environment plugin",
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
    class_path: str
    # Keyword arguments for its constructor.
    init_args: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        return import_object(self.class_path, "class_path")(**self.init_args)


@dataclass(frozen=True)
class LightningSpec:
    model: ClassRef
    # The LightningDataModule (optional with a data: section, which then provides the loaders).
    data: ClassRef | None
    # Keyword arguments for lightning.Trainer, checked against its signature.
    trainer: dict[str, Any]
    # ddp: a full copy of the model per rank (Ray's RayDDPStrategy). fsdp: parameters, gradients
    # and optimizer state sharded over the ranks with FSDP2 (fully_shard), on CPUs and GPUs; a
    # module without a configure_model of its own is sharded per submodule, and every rank
    # writes its own shard of each checkpoint (orchestrator/runtime/lightning_fsdp.py).
    strategy: str = "ddp"
    # deepspeed: the arguments of Lightning's DeepSpeedStrategy (stage, offload, config...),
    # translated from lightning.trainer.strategy (orchestrator/spec_deepspeed.py); every rank
    # writes its own DeepSpeed files of each checkpoint (orchestrator/runtime/lightning_deepspeed.py).
    deepspeed: dict[str, Any] | None = None
    # Callbacks built in every worker, after the orchestrator's own (a ModelCheckpoint is
    # translated into the checkpoint: section instead: orchestrator/spec_lightning.py).
    callbacks: list[ClassRef] = field(default_factory=list)
    # Lightning loggers, built in every worker (they write from rank 0) into
    # <run>/logs/lightning/<kind>/ unless their init_args name a save_dir.
    logger: list[ClassRef] = field(default_factory=list)


@dataclass(frozen=True)
class TorchSpec:
    # "package.module:function" (or "package.module.function"); called as train_loop(ctx).
    train_loop: str
    # Free-form settings handed to the loop as ctx.config.
    config: dict[str, Any] = field(default_factory=dict)
    # Epochs to train; the loop iterates ctx.epochs(). At least one of max_epochs/max_steps.
    max_epochs: int | None = None
    # Optimizer steps to train in total; training stops after this many ctx.step() calls.
    max_steps: int | None = None
    # ddp: ctx.prepare_model wraps the model in DistributedDataParallel (a full copy per rank).
    # fsdp: it shards parameters, gradients and optimizer state over the ranks (fully_shard), and
    # every rank writes its own shard of each checkpoint.
    strategy: str = "ddp"


@dataclass(frozen=True)
class ScalingSpec:
    # Number of training workers (DDP ranks), >= 1. Written [min, max] in a spec: elastic, and
    # this is the max (the size the run grows back to when the cluster has room).
    num_workers: int = 2
    # Elastic runs: the fewest workers the run trains with (equal to num_workers: a fixed size).
    min_workers: int = 2
    # Elastic runs: seconds between checks for room to grow back toward num_workers. A growth
    # restarts the workers from the newest checkpoint, so a shorter interval grows sooner.
    resize_interval_s: float = 30.0
    # Samples per optimizer step over all workers, the same at every world size (None: each
    # worker's batch is its loader's batch_size, so the global batch follows the world size).
    # The orchestrator splits it into per-worker micro-batches and gradient accumulation.
    global_batch_size: int | None = None
    # Give each worker one GPU and use NCCL; false trains on CPU with gloo.
    use_gpu: bool = False
    # Ray resources each worker asks for, e.g. {CPU: 1}.
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    # spread: one worker per node where possible; pack: fill a node before using the next.
    placement: str = "spread"

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.num_workers


@dataclass(frozen=True)
class KeepBestSpec:
    # Keep the K checkpoints with the best value of `monitor` (a metric in their manifests).
    k: int
    # The metric to rank by, e.g. val_loss: a metric the training reports (Lightning's logged
    # metrics, or ctx.report / ctx.step on the torch path).
    monitor: str
    # min: lower is better (losses) | max: higher is better (accuracies)
    mode: str = "min"


@dataclass(frozen=True)
class CheckpointSpec:
    # Save every N optimizer steps (None: only at epoch ends and at the end of the run).
    every_n_steps: int | None = None
    # Save when at least this many seconds passed since the last save (None: off).
    every_n_seconds: float | None = None
    # Also save at the end of every epoch.
    at_epoch_end: bool = True
    # Keep the newest K committed checkpoints (None: keep all). The newest is never deleted.
    keep_last: int | None = 3
    # Also keep the best K by a metric; kept on top of keep_last (None: off).
    keep_best: KeepBestSpec | None = None
    # Write checkpoints in the background; the training loop only waits for an in-memory copy.
    async_save: bool = True
    # Save as soon as Ray announces that a node of the run will be preempted (a node drain with
    # a deadline, e.g. a spot instance reclaimed), so the restart loses almost nothing.
    on_preemption: bool = True


@dataclass(frozen=True)
class FailureSpec:
    # Worker-group restarts allowed after infrastructure failures (a lost node or worker, a hang,
    # a lost connection) before the run fails (-1: unlimited, 0: none). An exception raised by the
    # user's code is never retried: the run fails at once.
    max_failures: int = 3
    # Restarts after a node preemption, counted apart from max_failures (-1: unlimited).
    max_preemptions: int = -1
    # Seconds without progress after which a worker counts as hung and the group restarts from
    # the newest checkpoint: a rank that stops answering (SIGSTOP, a frozen node) or ranks that
    # stop taking optimizer steps while training (a deadlock, a stuck collective). The first
    # step, checkpoints and validation are not timed by it (the first step and checkpoints have
    # limits of their own, below). Must exceed the longest optimizer step.
    hang_timeout_s: float = 60.0
    # Seconds a rank may spend starting: from its group's start to its first optimizer step
    # (restoring the checkpoint, building the model, a compiled or autotuned first step).
    startup_timeout_s: float = 1800.0
    # Seconds a rank may spend in one save: gathering and copying the state, and waiting for the
    # previous background write (its upload, read-back and retention) to end. A storage stall
    # (a hard NFS mount) past it restarts the group.
    checkpoint_timeout_s: float = 1800.0
    # Seconds a rank may spend finishing: after the last step, the end save and its write.
    finish_timeout_s: float = 1800.0

    @property
    def phase_limits(self) -> dict[str, float]:
        """The hang watchdog's limit for each phase that has one of its own (watchdog.py)."""
        return {"starting": self.startup_timeout_s, "checkpoint": self.checkpoint_timeout_s,
                "finishing": self.finish_timeout_s}
    # Seconds a run waits for the cluster to have room for its workers, at the start or after a
    # loss, before it gives up (exit 1, checkpoints kept). It says what it waits for every 30 s.
    capacity_timeout_s: float = 600.0


@dataclass(frozen=True)
class JobSpec:
    # Run identity: <storage>/<name>/ holds its checkpoints and summary.json.
    name: str
    # Local directory, shared mount, or a pyarrow.fs URI (s3://...).
    storage: str = DEFAULT_STORAGE
    # latest | none | <checkpoint URI>
    resume_from: str = "latest"
    # Seeds python, numpy and torch on every rank (each rank offsets by its rank).
    seed: int = 0
    # A LightningModule and LightningDataModule to train (exactly one of lightning / torch).
    lightning: LightningSpec | None = None
    # A plain PyTorch loop, train_loop(ctx), to train (exactly one of lightning / torch).
    torch: TorchSpec | None = None
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
        return "lightning" if self.lightning is not None else "torch"

    @property
    def sharded(self) -> bool:
        """fsdp (either path) and deepspeed: every rank holds, and checkpoints, its own part of the state."""
        return self.strategy in SHARDED_STRATEGIES

    @property
    def strategy(self) -> str:
        return (self.lightning or self.torch).strategy

    @property
    def strategy_field(self) -> str:
        return "lightning.trainer.strategy" if self.lightning is not None else "torch.strategy"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_record(self) -> dict[str, Any]:
        """to_dict() as JSON gives it back (lists for tuples): what a checkpoint's manifest keeps."""
        return json.loads(json.dumps(self.to_dict(), default=str))


# ---------------------------------------------------------------------------------------------
# Loading and overrides


def load_spec_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML spec file into a raw dict, with clear errors for a missing or broken file."""
    path = Path(path)
    if not path.exists():
        raise SpecError(
            f"spec file '{path}' does not exist (looked in {path.resolve().parent}). "
            "Fix: pass the path of a YAML job spec, e.g. `orchestrator run jobs/quickstart.yaml`."
        )
    if path.is_dir():
        raise SpecError(f"spec path '{path}' is a directory, not a file. Fix: pass a YAML spec file inside it.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(
            f"spec file '{path}' is not valid YAML{where}: {exc.problem}. "
            "Fix: correct the YAML syntax there (indentation uses spaces; `key: value` pairs)."
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file '{path}' is not valid YAML: {exc}. Fix: correct the YAML syntax.") from None
    if not isinstance(raw, dict):
        raise SpecError(
            f"spec file '{path}' must hold a mapping of fields (name:, lightning: or torch:, ...), "
            f"but its top level is {_describe(raw)}. Fix: write the spec as `key: value` lines."
        )
    return raw


def parse_set_option(option: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", parsed value). The value is parsed as YAML: 3 is an int, [1, 2] a list."""
    key, sep, text = option.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):
        raise SpecError(
            f"--set '{option}' is not of the form KEY=VALUE with a dotted KEY. "
            "Fix: write it like `--set scaling.num_workers=4` or `--set lightning.trainer.max_epochs=10`."
        )
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return key, value


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set dotted keys ("scaling.num_workers") in a copy of the raw spec, creating mappings on the way."""
    result = _deep_copy(raw)
    for dotted, value in overrides.items():
        node = result
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                prefix = ".".join(parts[: i + 1])
                raise SpecError(
                    f"--set {dotted}: '{prefix}' is {_describe(child)}, not a mapping, so it has no field "
                    f"'{parts[i + 1]}'. Fix: set '{prefix}' itself, or check the key's spelling."
                )
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Validation


def validate(raw: Mapping[str, Any], *, check_imports: bool = True) -> JobSpec:
    """Turn a raw mapping into a JobSpec, or raise SpecError naming the first problem found."""
    if isinstance(raw, JobSpec):
        return raw
    if not isinstance(raw, Mapping):
        raise SpecError(f"a job spec must be a mapping of fields, got {_describe(raw)}.")
    raw = merge_lightning_config(dict(raw))
    _check_keys(raw, JobSpec, "")
    name = _require(raw, "name", "", str, example="digits-ddp")
    if not NAME_PATTERN.match(name):
        raise SpecError(
            f"field 'name': {name!r} cannot name a run directory. Fix: use letters, digits, '.', '_' "
            "or '-' only, starting with a letter or digit (at most 128 characters), e.g. 'digits-ddp'."
        )
    storage = _optional(raw, "storage", "", str, DEFAULT_STORAGE)
    if not storage.strip():
        raise SpecError("field 'storage': got an empty string. Fix: name a directory or URI, e.g. ~/orchestrator-runs.")
    resume_from = str(_optional(raw, "resume_from", "", (str,), "latest"))
    seed = _int(raw, "seed", "", 0, minimum=0)

    has_lightning = raw.get("lightning") is not None
    has_torch = raw.get("torch") is not None
    if has_lightning == has_torch:
        got = "both" if has_lightning else "neither"
        raise SpecError(
            f"the spec has {got} of 'lightning:' and 'torch:'; it needs exactly one. Fix: use "
            "'lightning:' with model/data class_paths for a LightningModule, or 'torch:' with "
            "train_loop: 'module:function' for a plain PyTorch loop."
        )
    data = parse_data(raw.get("data"))
    lightning, model_checkpoint = (_lightning(raw["lightning"], check_imports, data_section=data is not None)
                                   if has_lightning else (None, {}))
    raw_checkpoint = raw.get("checkpoint") or {}
    if model_checkpoint:
        _mapping(raw_checkpoint, "checkpoint")
        raw_checkpoint = merge_checkpoint(raw_checkpoint, model_checkpoint, "lightning.callbacks")
    torch_spec = _torch(raw["torch"], check_imports) if has_torch else None
    scaling = _scaling(raw.get("scaling") or {})
    if lightning is not None:
        _check_lightning_scaling(lightning, scaling)
        _check_logger_storage(lightning, storage)
    return JobSpec(
        name=name,
        storage=storage,
        resume_from=resume_from,
        seed=seed,
        lightning=lightning,
        torch=torch_spec,
        scaling=scaling,
        checkpoint=_checkpoint(raw_checkpoint),
        failure=_failure(raw.get("failure") or {}),
        env=_env(raw.get("env") or {}),
        data=data,
    )


def _lightning(raw: Any, check_imports: bool, data_section: bool = False) -> tuple[LightningSpec, dict[str, Any]]:
    """The Lightning section, and the checkpoint: fields a ModelCheckpoint among its callbacks stands for."""
    path = "lightning"
    _mapping(raw, path)
    _check_keys(raw, LightningSpec, path)
    model = _class_ref(_require(raw, "model", path, dict), f"{path}.model", check_imports)
    if raw.get("data") is None and data_section:
        data = None  # the loaders come from the spec's data: section
    elif raw.get("data") is None:
        raise SpecError("field 'lightning.data' is required but missing. Fix: name a LightningDataModule, e.g. "
                        "data: {class_path: jobs.digits.DigitsData}, or add a data: section with Parquet input "
                        "(data.train.path), from which the orchestrator builds the loaders.")
    else:
        data = _class_ref(_require(raw, "data", path, dict), f"{path}.data", check_imports)
    if check_imports:
        for ref, role in ((model, "model"), (data, "data")):
            if ref is None:
                continue
            cls = import_object(ref.class_path, f"{path}.{role}.class_path")
            check_lightning_class(cls, ref.class_path, f"{path}.{role}.class_path", role)
    trainer = dict(_optional(raw, "trainer", path, dict, {}))
    if trainer.get("logger") in (False, None):
        trainer.pop("logger", None)  # off is the default; loggers go under lightning.logger
    strategy_value = trainer.pop("strategy", raw.get("strategy", "ddp"))
    deepspeed = None
    if is_deepspeed(strategy_value):
        deepspeed, strategy = deepspeed_args(strategy_value), "deepspeed"
    else:
        strategy = str(strategy_value)
    if strategy not in LIGHTNING_STRATEGIES:
        raise SpecError(
            f"field 'lightning.trainer.strategy': {strategy!r} is not available on the Lightning path. "
            f"Valid choices: ddp, fsdp, deepspeed (or deepspeed_stage_1/2/3, ..._offload). Fix: set strategy: "
            "ddp, or fsdp to shard the model over the ranks with PyTorch."
        )
    _check_trainer_args(trainer, f"{path}.trainer")
    if trainer.get("max_epochs") is None and trainer.get("max_steps") in (None, -1):
        raise SpecError(
            "field 'lightning.trainer': neither max_epochs nor max_steps is set, so training would run "
            "for Lightning's default of 1000 epochs. Fix: set lightning.trainer.max_epochs (e.g. 5) "
            "or lightning.trainer.max_steps."
        )
    callbacks, model_checkpoint = _callbacks(raw.get("callbacks"), f"{path}.callbacks", check_imports)
    loggers = _loggers(raw.get("logger"), f"{path}.logger", check_imports)
    return LightningSpec(model=model, data=data, trainer=trainer, strategy=strategy, deepspeed=deepspeed,
                         callbacks=callbacks, logger=loggers), model_checkpoint


def _loggers(raw: Any, path: str, check_imports: bool) -> list[ClassRef]:
    if raw is None or raw is False:
        return []
    items = [raw] if isinstance(raw, Mapping) else raw
    if not isinstance(items, (list, tuple)):
        raise SpecError(f"field '{path}': got {_describe(raw)}; it must be one {{class_path, init_args}} or a list "
                        "of them. Fix: e.g. logger: {class_path: lightning.pytorch.loggers.CSVLogger}.")
    loggers = []
    for i, item in enumerate(items):
        where = path if isinstance(raw, Mapping) else f"{path}[{i}]"
        _mapping(item, where)
        ref = _class_ref(item, where, check_imports)
        if check_imports:
            cls = import_object(ref.class_path, f"{where}.class_path")
            check_lightning_class(cls, ref.class_path, f"{where}.class_path", "logger")
            check_logger_package(cls, ref.class_path, f"{where}.class_path")
        loggers.append(ref)
    return loggers


def _callbacks(raw: Any, path: str, check_imports: bool) -> tuple[list[ClassRef], dict[str, Any]]:
    if raw is None:
        return [], {}
    if not isinstance(raw, (list, tuple)):
        raise SpecError(f"field '{path}': got {_describe(raw)}; it must be a list of {{class_path, init_args}}. "
                        "Fix: e.g. callbacks: [{class_path: lightning.pytorch.callbacks.EarlyStopping, "
                        "init_args: {monitor: val_loss}}].")
    callbacks, model_checkpoint = [], {}
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        _mapping(item, where)
        ref = _class_ref(item, where, check_imports)
        cls = import_object(ref.class_path, f"{where}.class_path") if check_imports else None
        if cls is not None:
            check_lightning_class(cls, ref.class_path, f"{where}.class_path", "callbacks")
        if is_model_checkpoint(ref.class_path, cls):
            if model_checkpoint:
                raise SpecError(f"field '{where}': a second ModelCheckpoint; the run has one store and one "
                                "retention policy. Fix: keep one ModelCheckpoint (or none, and use checkpoint:).")
            model_checkpoint = checkpoint_settings(ref.init_args, where)
            continue
        callbacks.append(ref)
    return callbacks, model_checkpoint


def _check_lightning_scaling(lightning: LightningSpec, scaling: ScalingSpec) -> None:
    """Trainer arguments whose meaning depends on the world size cannot go with an elastic one."""
    if lightning.deepspeed is not None:
        check_deepspeed_scaling(lightning.deepspeed, elastic=scaling.min_workers != scaling.num_workers,
                                use_gpu=scaling.use_gpu, trainer=lightning.trainer,
                                global_batch_size=scaling.global_batch_size)
    accumulate = lightning.trainer.get("accumulate_grad_batches")
    if accumulate is None:
        return
    if scaling.global_batch_size is not None:
        raise SpecError(
            f"field 'lightning.trainer.accumulate_grad_batches': {accumulate} is set together with "
            f"scaling.global_batch_size {scaling.global_batch_size}, and the orchestrator chooses the "
            "accumulation itself from the global batch, the world size and the loader's batch_size. "
            "Fix: remove accumulate_grad_batches (the loader's batch_size is the largest micro-batch).")
    if scaling.min_workers != scaling.num_workers:
        raise SpecError(
            f"field 'lightning.trainer.accumulate_grad_batches': {accumulate} cannot resize with "
            f"scaling.num_workers [{scaling.min_workers}, {scaling.num_workers}]: a fixed accumulation "
            "makes the samples per optimizer step change with the world size. Fix: remove it and set "
            "scaling.global_batch_size (held constant at every size; the accumulation is chosen for you).")


def _check_logger_storage(lightning: LightningSpec, storage: str) -> None:
    """Loggers write into the run directory only when it is a filesystem path."""
    if "://" not in storage or storage.startswith("file://"):
        return
    for i, ref in enumerate(lightning.logger):
        if "save_dir" not in ref.init_args and "tracking_uri" not in ref.init_args:
            raise SpecError(
                f"field 'lightning.logger': {ref.class_path} would write into the run directory, but storage "
                f"{storage!r} is an object store, where Lightning's loggers do not write by default. Fix: set "
                f"lightning.logger{'' if len(lightning.logger) == 1 else f'[{i}]'}.init_args.save_dir to a "
                "directory (a shared mount, so that the logs outlive the node), or, for MLFlowLogger, "
                "init_args.tracking_uri to your MLflow server."
            )


def _check_trainer_args(trainer: dict[str, Any], path: str) -> None:
    import inspect

    from lightning.pytorch import Trainer

    valid = [p for p in inspect.signature(Trainer.__init__).parameters if p != "self"]
    for key in trainer:
        if key in OWNED_TRAINER_ARGS:
            raise SpecError(
                f"field '{path}.{key}': the orchestrator sets this Trainer argument itself "
                f"({OWNED_TRAINER_ARGS[key]}). Fix: remove '{key}' from {path}."
            )
        if key not in valid:
            raise SpecError(
                f"field '{path}.{key}': {key!r} is not an argument of lightning.Trainer"
                f"{_nearest(key, valid)}. Fix: use one of Trainer's arguments "
                "(max_epochs, max_steps, precision, accumulate_grad_batches, gradient_clip_val, ...)."
            )
    for key in ("max_epochs", "max_steps", "accumulate_grad_batches"):
        if key in trainer and trainer[key] is not None:
            _int(trainer, key, path, None, minimum=-1 if key == "max_steps" else 1)


def _torch(raw: Any, check_imports: bool) -> TorchSpec:
    path = "torch"
    _mapping(raw, path)
    _check_keys(raw, TorchSpec, path)
    loop = _require(raw, "train_loop", path, str, example="jobs.digits_torch:train_loop")
    if check_imports:
        func = import_object(loop, f"{path}.train_loop")
        if not callable(func):
            raise SpecError(f"field '{path}.train_loop': {loop!r} is {_describe(func)}, not a function. "
                            "Fix: name a function train_loop(ctx).")
    config = dict(_optional(raw, "config", path, dict, {}))
    max_epochs = _int(raw, "max_epochs", path, None, minimum=1)
    max_steps = _int(raw, "max_steps", path, None, minimum=1)
    if max_epochs is None and max_steps is None:
        raise SpecError(
            "field 'torch': neither max_epochs nor max_steps is set, so the run would never end. "
            "Fix: set torch.max_epochs (e.g. 5) or torch.max_steps (e.g. 1000)."
        )
    strategy = _choice(raw, "strategy", path, TORCH_STRATEGIES, "ddp")
    return TorchSpec(train_loop=loop, config=config, max_epochs=max_epochs, max_steps=max_steps, strategy=strategy)


def _scaling(raw: Any) -> ScalingSpec:
    path = "scaling"
    _mapping(raw, path)
    _check_keys(raw, ScalingSpec, path)
    workers = raw.get("num_workers", 2)
    if raw.get("min_workers") is not None and isinstance(workers, int) and not isinstance(workers, bool):
        workers = [raw["min_workers"], workers]  # the form JobSpec.to_dict() writes
    low, high = _worker_range(workers)
    global_batch = _int(raw, "global_batch_size", path, None, minimum=1)
    if global_batch is not None:
        _check_global_batch(global_batch, low, high)
    use_gpu = _bool(raw, "use_gpu", path, False)
    resources = _optional(raw, "resources_per_worker", path, dict, {"CPU": 1.0})
    for key, value in resources.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SpecError(
                f"field 'scaling.resources_per_worker.{key}': got {value!r}; a resource amount must be a "
                "non-negative number. Fix: write e.g. resources_per_worker: {CPU: 1}."
            )
    placement = _choice(raw, "placement", path, PLACEMENTS, "spread")
    return ScalingSpec(
        num_workers=high,
        min_workers=low,
        resize_interval_s=_seconds(raw, "resize_interval_s", path, 30.0, minimum=1.0),
        global_batch_size=global_batch,
        use_gpu=use_gpu,
        resources_per_worker={str(k): float(v) for k, v in resources.items()},
        placement=placement,
    )


def _worker_range(value: Any) -> tuple[int, int]:
    """scaling.num_workers: a whole number, or an elastic [min, max]."""
    where = "field 'scaling.num_workers'"
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise SpecError(f"{where}: got {list(value)!r}; an elastic size is two whole numbers [min, max]. "
                            "Fix: e.g. num_workers: [2, 4] (or one number for a fixed size).")
        low, high = value
        if low < 1:
            raise SpecError(f"{where}: [{low}, {high}] has min {low}, but at least one worker must train. "
                            f"Fix: num_workers: [1, {max(high, 1)}].")
        if low > high:
            raise SpecError(f"{where}: [{low}, {high}] has min {low} above max {high}. "
                            f"Fix: num_workers: [{high}, {low}].")
        return low, high
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: got {_describe(value)}, expected a whole number >= 1 or an elastic range "
                        "[min, max]. Fix: e.g. num_workers: 2 or num_workers: [1, 4].")
    if value < 1:
        raise SpecError(f"{where}: got {value}, but it must be at least 1. Fix: set scaling.num_workers to 1 or more.")
    return value, value


def _check_global_batch(global_batch: int, low: int, high: int) -> None:
    from orchestrator.data.order import nearest_splittable, sizes_that_split

    bad = [w for w in range(low, high + 1) if global_batch % w]
    if not bad:
        return
    sizes = "[" + f"{low}, {high}" + "]" if low != high else str(low)
    works = sizes_that_split(global_batch, low, high)
    nearest = nearest_splittable(global_batch, low, high)
    raise SpecError(
        f"field 'scaling.global_batch_size': {global_batch} does not split evenly over "
        f"{', '.join(map(str, bad))} worker(s), a size that scaling.num_workers {sizes} allows; every worker "
        "takes the same share of each global batch. "
        + (f"Sizes in range that split it: {', '.join(map(str, works))}. " if works else "")
        + f"Fix: global_batch_size: {nearest} (the nearest that every size from {low} to {high} splits), "
        "or narrow num_workers to sizes that split it."
    )


_CHECKPOINT_ALIASES = {"async": "async_save"}


def _checkpoint(raw: Any) -> CheckpointSpec:
    path = "checkpoint"
    _mapping(raw, path)
    raw = {_CHECKPOINT_ALIASES.get(k, k): v for k, v in raw.items()}
    _check_keys(raw, CheckpointSpec, path, extra=("async",))
    every_s = raw.get("every_n_seconds")
    if every_s is not None and (isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or every_s <= 0):
        raise SpecError(
            f"field 'checkpoint.every_n_seconds': got {every_s!r}; it must be a positive number of seconds "
            "or null. Fix: e.g. every_n_seconds: 600."
        )
    return CheckpointSpec(
        every_n_steps=_int(raw, "every_n_steps", path, None, minimum=1),
        every_n_seconds=float(every_s) if every_s is not None else None,
        at_epoch_end=_bool(raw, "at_epoch_end", path, True),
        # Written out as null: keep every checkpoint (absent: the default, 3).
        keep_last=None if "keep_last" in raw and raw["keep_last"] is None else _int(raw, "keep_last", path, 3,
                                                                                     minimum=1),
        keep_best=_keep_best(raw.get("keep_best")),
        async_save=_bool(raw, "async_save", path, True),
        on_preemption=_bool(raw, "on_preemption", path, True),
    )


def _keep_best(raw: Any) -> KeepBestSpec | None:
    if raw is None:
        return None
    path = "checkpoint.keep_best"
    _mapping(raw, path)
    _check_keys(raw, KeepBestSpec, path)
    monitor = _require(raw, "monitor", path, str, example="val_loss")
    return KeepBestSpec(k=_int(raw, "k", path, 1, minimum=1), monitor=monitor,
                        mode=_choice(raw, "mode", path, ("min", "max"), "min"))


def _failure(raw: Any) -> FailureSpec:
    path = "failure"
    _mapping(raw, path)
    _check_keys(raw, FailureSpec, path)
    return FailureSpec(max_failures=_int(raw, "max_failures", path, 3, minimum=-1),
                       max_preemptions=_int(raw, "max_preemptions", path, -1, minimum=-1),
                       hang_timeout_s=_seconds(raw, "hang_timeout_s", path, 60.0, minimum=5.0),
                       startup_timeout_s=_seconds(raw, "startup_timeout_s", path, 1800.0, minimum=5.0),
                       checkpoint_timeout_s=_seconds(raw, "checkpoint_timeout_s", path, 1800.0, minimum=5.0),
                       finish_timeout_s=_seconds(raw, "finish_timeout_s", path, 1800.0, minimum=5.0),
                       capacity_timeout_s=_seconds(raw, "capacity_timeout_s", path, 600.0, minimum=10.0))


def _env(raw: Any) -> dict[str, str]:
    _mapping(raw, "env")
    env = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise SpecError(f"field 'env': {key!r} is not a valid environment variable name. "
                            "Fix: use letters, digits and '_'.")
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError(f"field 'env.{key}': got {_describe(value)}; environment values must be strings "
                            f"or numbers. Fix: quote it, e.g. {key}: \"1\".")
        env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _class_ref(raw: dict[str, Any], path: str, check_imports: bool) -> ClassRef:
    allowed = ("class_path", "init_args")
    for key in raw:
        if key not in allowed:
            raise SpecError(f"field '{path}.{key}' is not a valid key{_nearest(key, allowed)}. "
                            "Valid keys: class_path, init_args.")
    class_path = _require(raw, "class_path", path, str, example="jobs.digits.DigitsClassifier")
    init_args = _optional(raw, "init_args", path, dict, {})
    if check_imports:
        obj = import_object(class_path, f"{path}.class_path")
        if not isinstance(obj, type):
            raise SpecError(f"field '{path}.class_path': {class_path!r} is {_describe(obj)}, not a class. "
                            "Fix: name the class itself.")
    return ClassRef(class_path=class_path, init_args=dict(init_args))


def import_object(dotted: str, field_path: str) -> Any:
    """Import "pkg.mod.Name" or "pkg.mod:Name"; a failure names the module and attribute tried."""
    if ":" in dotted:
        module_name, _, attr = dotted.partition(":")
    else:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise SpecError(
            f"field '{field_path}': {dotted!r} is not an import path. Fix: write 'package.module.Name' "
            "or 'package.module:name', e.g. jobs.digits.DigitsClassifier."
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise SpecError(
                f"field '{field_path}': module '{module_name}' (for {dotted!r}) could not be imported: "
                f"no module named '{exc.name}'. Fix: check the spelling, run from the directory that "
                "contains the package, or install it (pip install -e .)."
            ) from None
        raise SpecError(
            f"field '{field_path}': module '{module_name}' was found but importing it failed: {exc}. "
            f"Fix: install the missing dependency '{exc.name}'."
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise SpecError(
            f"field '{field_path}': importing module '{module_name}' raised {type(exc).__name__}: {exc}. "
            "Fix: make the module importable (run `python -c \"import "
            f"{module_name}\"` to see the full error)."
        ) from None
    if not hasattr(module, attr):
        public = [n for n in dir(module) if not n.startswith("_")]
        raise SpecError(
            f"field '{field_path}': module '{module_name}' has no attribute '{attr}'"
            f"{_nearest(attr, public)}. Fix: correct the name after the last '.' in {dotted!r}."
        )
    return getattr(module, attr)


# --- small checkers: each raises SpecError with path, value and fix -----------------------------


def _check_keys(raw: Mapping[str, Any], cls: type, path: str, extra: tuple[str, ...] = ()) -> None:
    valid = [f.name for f in dataclasses.fields(cls)] + list(extra)
    for key in raw:
        if key not in valid:
            where = f"{path}.{key}" if path else str(key)
            raise SpecError(
                f"field '{where}' is not a valid key{_nearest(str(key), valid)}. "
                f"Valid keys{' under ' + path if path else ''}: {', '.join(valid)}."
            )


def _nearest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _mapping(raw: Any, path: str) -> None:
    if not isinstance(raw, Mapping):
        raise SpecError(f"field '{path}': got {_describe(raw)}, expected a mapping of fields. "
                        f"Fix: write '{path}:' followed by indented 'key: value' lines.")


def _require(raw: Mapping[str, Any], key: str, path: str, kind: type, example: str | None = None) -> Any:
    where = f"{path}.{key}" if path else key
    if raw.get(key) is None:
        hint = f", e.g. {key}: {example}" if example else ""
        raise SpecError(f"field '{where}' is required but missing. Fix: add it to the spec{hint}.")
    return _typed(raw[key], where, kind)


def _optional(raw: Mapping[str, Any], key: str, path: str, kind: Any, default: Any) -> Any:
    if raw.get(key) is None:
        return default
    return _typed(raw[key], f"{path}.{key}" if path else key, kind)


def _typed(value: Any, where: str, kind: Any) -> Any:
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        expected = {"dict": "a mapping", "str": "a string", "list": "a list"}.get(names, names)
        raise SpecError(f"field '{where}': got {_describe(value)}, expected {expected}. "
                        f"Fix: give '{where}' {expected}.")
    return value


def _int(raw: Mapping[str, Any], key: str, path: str, default: int | None, minimum: int) -> int | None:
    where = f"{path}.{key}" if path else key
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"field '{where}': got {_describe(value)}, expected a whole number >= {minimum}. "
                        f"Fix: e.g. {key}: {max(minimum, 1) if default is None else default}.")
    if value < minimum:
        raise SpecError(f"field '{where}': got {value}, but it must be at least {minimum}. "
                        f"Fix: set {where} to {minimum} or more.")
    return value


def _seconds(raw: Mapping[str, Any], key: str, path: str, default: float, minimum: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise SpecError(f"field '{path}.{key}': got {_describe(value)}; it must be a number of seconds of at "
                        f"least {minimum:g}. Fix: e.g. {key}: {default:g}.")
    return float(value)


def _bool(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"field '{path}.{key}': got {_describe(value)}, expected true or false. "
                        f"Fix: write {key}: {str(default).lower()}.")
    return value


def _choice(raw: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise SpecError(
            f"field '{path}.{key}': {value!r} is not a valid choice{_nearest(str(value), choices)}. "
            f"Valid choices: {', '.join(choices)}. Fix: set {key}: {default}."
        )
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def resolve_spec(spec: JobSpec | Mapping[str, Any] | str | os.PathLike,
                 overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """Load (if a path), apply dotted overrides, and validate. The one entry the CLI and API share."""
    # class_paths name modules relative to where the user stands, as `python -m` would find them;
    # the console script's own sys.path starts at its bin directory instead.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if isinstance(spec, JobSpec):
        if not overrides:
            return spec
        spec = spec.to_dict()
        spec = {k: v for k, v in spec.items() if v is not None}
        spec["checkpoint"] = {("async" if k == "async_save" else k): v for k, v in spec["checkpoint"].items()}
        kind = "lightning" if spec.get("lightning") else "torch"
        if kind == "lightning":
            lightning = spec["lightning"]
            strategy, deepspeed = lightning.pop("strategy"), lightning.pop("deepspeed", None)
            if deepspeed is not None:
                strategy = {"class_path": STRATEGY_CLASS_PATHS[0], "init_args": deepspeed}
            lightning["trainer"] = {**lightning["trainer"], "strategy": strategy}
    raw = load_spec_file(spec) if isinstance(spec, (str, os.PathLike)) else dict(spec)
    if overrides:
        raw = apply_overrides(raw, overrides)
    return validate(raw)


