"""Validation: a raw spec in, a JobSpec out, or one SpecError paragraph naming the field, the
value and the fix. An unknown key names the nearest valid key. The rules of each section live here;
the typed readers they use are in fields.py; what needs an import to be checked is in imports.py,
and runs after every key, type and value here was read."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import SpecError, nearest
from orchestrator.spec.data import parse_data
from orchestrator.spec.deepspeed import check_deepspeed_scaling, is_deepspeed
from orchestrator.spec.facts import aliases, default_of, facts_of, field_of
from orchestrator.spec.fields import check_import_path, check_keys, describe, integer, mapping, read, require
from orchestrator.spec.imports import check_user_code, check_with_libraries
from orchestrator.spec.lightning import checkpoint_settings, is_model_checkpoint, merge_checkpoint
from orchestrator.spec.lightning_cli import merge_lightning_config
from orchestrator.spec.model import (
    LIGHTNING_STRATEGIES,
    NAME_PATTERN,
    OWNED_TRAINER_ARGS,
    CheckpointSpec,
    ClassRef,
    FailureSpec,
    JobSpec,
    KeepBestSpec,
    LightningSpec,
    ScalingSpec,
    TorchSpec,
)
from orchestrator.spec.script import agent_resources, parse_script


def validate(raw: Mapping[str, Any], *, check_imports: bool = True, read_only: bool = False) -> JobSpec:
    """Turn a raw mapping into a JobSpec, or raise SpecError naming the first problem found.

    Imports come last, so that a typo anywhere is refused at once (torch alone takes seconds of
    CPU to import, and a user's module may do anything when imported): first every section's
    keys, types and values, importing nothing; then what only Lightning or torch can tell
    (Trainer and DeepSpeedStrategy arguments, Lightning's defaults, dtypes); then, with
    check_imports, the user's own code (class paths, the train loop, the script). With
    `read_only`, the first pass alone: enough to know the run (its name and storage) before
    anything slow, e.g. to refuse a second driver of a live run at once."""
    if isinstance(raw, JobSpec):
        return raw
    if not isinstance(raw, Mapping):
        raise SpecError(f"a job spec must be a mapping of fields, got {describe(raw)}.")
    raw, from_file = merge_lightning_config(dict(raw))
    spec, strategy = _read(raw)
    if read_only:
        return spec
    spec = check_with_libraries(spec, strategy, from_file)
    if spec.lightning is not None:
        _check_lightning_scaling(spec.lightning, spec.scaling)
    if check_imports:
        check_user_code(spec)
    return spec


def _read(raw: dict[str, Any]) -> tuple[JobSpec, Any]:
    """Every section's keys, types and values, and the rules between sections, importing nothing;
    and lightning.trainer.strategy as written when it names DeepSpeed (checked with Lightning)."""
    check_keys(raw, JobSpec, "")
    name = read(raw, JobSpec, "name", "")
    if not NAME_PATTERN.match(name):
        raise SpecError(
            f"field 'name': {name!r} cannot name a run directory. Fix: use letters, digits, '.', '_' "
            "or '-' only, starting with a letter or digit (at most 128 characters), e.g. 'digits-ddp'."
        )
    storage = read(raw, JobSpec, "storage", "")
    if not storage.strip():
        raise SpecError("field 'storage': got an empty string. Fix: name a directory or URI, e.g. ~/orchestrator-runs.")
    resume_from = read(raw, JobSpec, "resume_from", "")
    seed = read(raw, JobSpec, "seed", "")

    has_lightning = raw.get("lightning") is not None
    has_torch = raw.get("torch") is not None
    has_script = raw.get("script") is not None
    if has_lightning + has_torch + has_script != 1:
        sections = (("lightning", has_lightning), ("torch", has_torch), ("script", has_script))
        given = [f"'{k}:'" for k, v in sections if v]
        got = {0: "neither", 2: "both " + " and ".join(given), 3: "all three"}[len(given)]
        raise SpecError(
            f"the spec has {got} of 'lightning:', 'torch:' and 'script:'; it needs exactly one. Fix: use "
            "'lightning:' with model/data class_paths for a LightningModule, 'torch:' with "
            "train_loop: 'module:function' for a plain PyTorch loop, or 'script:' with path: train.py for an "
            "unmodified torchrun script."
        )
    script = parse_script(raw["script"]) if has_script else None
    if script is not None and raw.get("data") is not None:
        raise SpecError("the spec has both 'script:' and 'data:'; a script reads its own data. Fix: remove the "
                        "data: section (or use the torch: or lightning: path, which stream it for you).")
    data = parse_data(raw.get("data"))
    lightning, model_checkpoint, strategy = (_lightning(raw["lightning"], data_section=data is not None)
                                             if has_lightning else (None, {}, None))
    raw_checkpoint = raw.get("checkpoint") or {}
    if model_checkpoint:
        mapping(raw_checkpoint, "checkpoint")
        raw_checkpoint = merge_checkpoint(raw_checkpoint, model_checkpoint, "lightning.callbacks")
    torch_spec = _torch(raw["torch"]) if has_torch else None
    scaling = _scaling(raw.get("scaling") or {})
    if script is not None:
        scaling = _script_scaling(raw.get("scaling") or {}, scaling, script.nproc_per_node)
    if lightning is not None:
        _check_logger_storage(lightning, storage)
    return JobSpec(
        name=name,
        storage=storage,
        resume_from=resume_from,
        seed=seed,
        lightning=lightning,
        torch=torch_spec,
        script=script,
        scaling=scaling,
        checkpoint=_checkpoint(raw_checkpoint),
        failure=_failure(raw.get("failure") or {}),
        env=_env(raw.get("env") or {}),
        data=data,
    ), strategy


def _lightning(raw: Any, data_section: bool = False) -> tuple[LightningSpec, dict[str, Any], Any]:
    """The Lightning section; the checkpoint: fields a ModelCheckpoint among its callbacks stands
    for; and the trainer's strategy as written when it names DeepSpeed (else None)."""
    path = "lightning"
    mapping(raw, path)
    check_keys(raw, LightningSpec, path)
    model = _class_ref(require(raw, "model", path, dict), f"{path}.model")
    if raw.get("data") is None and data_section:
        data = None  # the loaders come from the spec's data: section
    elif raw.get("data") is None:
        raise SpecError("field 'lightning.data' is required but missing. Fix: name a LightningDataModule, e.g. "
                        "data: {class_path: jobs.digits.DigitsData}, or add a data: section with Parquet input "
                        "(data.train.path), from which the orchestrator builds the loaders.")
    else:
        data = _class_ref(require(raw, "data", path, dict), f"{path}.data")
    trainer = dict(read(raw, LightningSpec, "trainer", path))
    if trainer.get("logger") in (False, None):
        trainer.pop("logger", None)  # off is the default; loggers go under lightning.logger
    strategy_value = trainer.pop("strategy", raw.get("strategy", default_of(LightningSpec, "strategy")))
    strategy = "deepspeed" if is_deepspeed(strategy_value) else str(strategy_value)
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
    callbacks, model_checkpoint = _callbacks(raw.get("callbacks"), f"{path}.callbacks")
    loggers = _loggers(raw.get("logger"), f"{path}.logger")
    return (LightningSpec(model=model, data=data, trainer=trainer, strategy=strategy, callbacks=callbacks,
                          logger=loggers),
            model_checkpoint, strategy_value if strategy == "deepspeed" else None)


def _loggers(raw: Any, path: str) -> list[ClassRef]:
    if raw is None or raw is False:
        return []
    items = [raw] if isinstance(raw, Mapping) else raw
    if not isinstance(items, (list, tuple)):
        raise SpecError(f"field '{path}': got {describe(raw)}; it must be one {{class_path, init_args}} or a list "
                        "of them. Fix: e.g. logger: {class_path: lightning.pytorch.loggers.CSVLogger}.")
    loggers = []
    for i, item in enumerate(items):
        where = path if isinstance(raw, Mapping) else f"{path}[{i}]"
        mapping(item, where)
        loggers.append(_class_ref(item, where))
    return loggers


def _callbacks(raw: Any, path: str) -> tuple[list[ClassRef], dict[str, Any]]:
    if raw is None:
        return [], {}
    if not isinstance(raw, (list, tuple)):
        raise SpecError(f"field '{path}': got {describe(raw)}; it must be a list of {{class_path, init_args}}. "
                        "Fix: e.g. callbacks: [{class_path: lightning.pytorch.callbacks.EarlyStopping, "
                        "init_args: {monitor: val_loss}}].")
    callbacks, model_checkpoint = [], {}
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        mapping(item, where)
        ref = _class_ref(item, where)
        if is_model_checkpoint(ref.class_path, None):  # a subclass of it is refused when imported
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
    """What can be said of the Trainer's arguments without Lightning (their names are checked
    against its signature after every key of the spec: imports.py)."""
    for key in trainer:
        if key in OWNED_TRAINER_ARGS:
            raise SpecError(
                f"field '{path}.{key}': the orchestrator sets this Trainer argument itself "
                f"({OWNED_TRAINER_ARGS[key]}). Fix: remove '{key}' from {path}."
            )
    for key in ("max_epochs", "max_steps", "accumulate_grad_batches"):
        if key in trainer and trainer[key] is not None:
            integer(trainer, key, path, None, minimum=-1 if key == "max_steps" else 1)


def _torch(raw: Any) -> TorchSpec:
    path = "torch"
    mapping(raw, path)
    check_keys(raw, TorchSpec, path)
    loop = read(raw, TorchSpec, "train_loop", path)
    check_import_path(loop, f"{path}.train_loop")  # imported last: imports.py
    config = dict(read(raw, TorchSpec, "config", path))
    max_epochs = read(raw, TorchSpec, "max_epochs", path)
    max_steps = read(raw, TorchSpec, "max_steps", path)
    if max_epochs is None and max_steps is None:
        raise SpecError(
            "field 'torch': neither max_epochs nor max_steps is set, so the run would never end. "
            "Fix: set torch.max_epochs (e.g. 5) or torch.max_steps (e.g. 1000)."
        )
    strategy = read(raw, TorchSpec, "strategy", path)
    return TorchSpec(train_loop=loop, config=config, max_epochs=max_epochs, max_steps=max_steps, strategy=strategy)


def _script_scaling(raw: dict[str, Any], scaling: ScalingSpec, nproc: int) -> ScalingSpec:
    """On the script path a worker is a node's agent: it holds the resources of its K ranks."""
    if scaling.nproc_per_node != 1:
        raise SpecError(f"field 'scaling.nproc_per_node' ({scaling.nproc_per_node}) is for the torch: and lightning: "
                        "paths; a script's ranks per node are script.nproc_per_node. Fix: move it to "
                        f"script: {{nproc_per_node: {scaling.nproc_per_node}}} (torchrun's --nproc_per_node).")
    if scaling.global_batch_size is not None:
        raise SpecError("field 'scaling.global_batch_size' does not apply to a script: the script sizes its own "
                        "batches. Fix: remove it (the script's DistributedSampler shards over WORLD_SIZE ranks).")
    resources = agent_resources(raw, nproc, scaling.use_gpu)
    return dataclasses.replace(scaling, resources_per_worker=resources) if resources else scaling


def _scaling(raw: Any) -> ScalingSpec:
    path = "scaling"
    mapping(raw, path)
    check_keys(raw, ScalingSpec, path)
    workers = raw.get("num_workers", default_of(ScalingSpec, "num_workers"))
    if raw.get("min_workers") is not None and isinstance(workers, int) and not isinstance(workers, bool):
        workers = [raw["min_workers"], workers]  # the form JobSpec.to_dict() writes
    low, high = _worker_range(workers)
    global_batch = read(raw, ScalingSpec, "global_batch_size", path)
    per_node = read(raw, ScalingSpec, "nproc_per_node", path)
    if global_batch is not None:
        _check_global_batch(global_batch, low, high, per_node)
    use_gpu = read(raw, ScalingSpec, "use_gpu", path)
    # A worker holds its ranks' resources: a CPU (and a GPU) each, unless the spec says otherwise.
    default = agent_resources(raw, per_node, use_gpu) if per_node > 1 else default_of(ScalingSpec,
                                                                                      "resources_per_worker")
    resources = read(raw, ScalingSpec, "resources_per_worker", path, default)
    least = facts_of(field_of(ScalingSpec, "resources_per_worker")).minimum
    for key, value in resources.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < least:
            raise SpecError(
                f"field 'scaling.resources_per_worker.{key}': got {value!r}; a resource amount must be a "
                "non-negative number. Fix: write e.g. resources_per_worker: {CPU: 1}."
            )
    placement = read(raw, ScalingSpec, "placement", path)
    return ScalingSpec(
        num_workers=high,
        min_workers=low,
        resize_interval_s=read(raw, ScalingSpec, "resize_interval_s", path),
        global_batch_size=global_batch,
        use_gpu=use_gpu,
        resources_per_worker={str(k): float(v) for k, v in resources.items()},
        placement=placement,
        nproc_per_node=per_node,
    )


def _worker_range(value: Any) -> tuple[int, int]:
    """scaling.num_workers: a whole number, or an elastic [min, max]."""
    where = "field 'scaling.num_workers'"
    least = int(facts_of(field_of(ScalingSpec, "num_workers")).minimum)
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise SpecError(f"{where}: got {list(value)!r}; an elastic size is two whole numbers [min, max]. "
                            "Fix: e.g. num_workers: [2, 4] (or one number for a fixed size).")
        low, high = value
        if low < least:
            raise SpecError(f"{where}: [{low}, {high}] has min {low}, but at least one worker must train. "
                            f"Fix: num_workers: [{least}, {max(high, least)}].")
        if low > high:
            raise SpecError(f"{where}: [{low}, {high}] has min {low} above max {high}. "
                            f"Fix: num_workers: [{high}, {low}].")
        return low, high
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: got {describe(value)}, expected a whole number >= {least} or an elastic range "
                        f"[min, max]. Fix: e.g. num_workers: 2 or num_workers: [{least}, 4].")
    if value < least:
        raise SpecError(f"{where}: got {value}, but it must be at least {least}. "
                        f"Fix: set scaling.num_workers to {least} or more.")
    return value, value


def _check_global_batch(global_batch: int, low: int, high: int, per_node: int = 1) -> None:
    from orchestrator.data.order import nearest_splittable, sizes_that_split

    bad = [w * per_node for w in range(low, high + 1) if global_batch % (w * per_node)]
    if not bad:
        return
    sizes = "[" + f"{low}, {high}" + "]" if low != high else str(low)
    ranks = f" x scaling.nproc_per_node {per_node}" if per_node > 1 else ""
    unit = "rank" if per_node > 1 else "worker"
    low, high = low * per_node, high * per_node
    works = sizes_that_split(global_batch, low, high)
    nearest = nearest_splittable(global_batch, low, high)
    raise SpecError(
        f"field 'scaling.global_batch_size': {global_batch} does not split evenly over "
        f"{', '.join(map(str, bad))} {unit}(s), a size that scaling.num_workers {sizes}{ranks} allows; every "
        f"{unit} takes the same share of each global batch. "
        + (f"Sizes in range that split it: {', '.join(map(str, works))}. " if works else "")
        + f"Fix: global_batch_size: {nearest} (the nearest that every size from {low} to {high} splits), "
        "or narrow num_workers to sizes that split it."
    )


def _checkpoint(raw: Any) -> CheckpointSpec:
    path = "checkpoint"
    mapping(raw, path)
    keys = aliases(CheckpointSpec)
    raw = {keys.get(k, k): v for k, v in raw.items()}
    check_keys(raw, CheckpointSpec, path, extra=tuple(keys))
    every_s = raw.get("every_n_seconds")
    above = facts_of(field_of(CheckpointSpec, "every_n_seconds")).above
    if every_s is not None and (isinstance(every_s, bool) or not isinstance(every_s, (int, float))
                                or every_s <= above):
        raise SpecError(
            f"field 'checkpoint.every_n_seconds': got {every_s!r}; it must be a positive number of seconds "
            "or null. Fix: e.g. every_n_seconds: 600."
        )
    return CheckpointSpec(
        every_n_steps=read(raw, CheckpointSpec, "every_n_steps", path),
        every_n_seconds=float(every_s) if every_s is not None else None,
        at_epoch_end=read(raw, CheckpointSpec, "at_epoch_end", path),
        # Written out as null: keep every checkpoint (absent: the declared default).
        keep_last=None if "keep_last" in raw and raw["keep_last"] is None else read(raw, CheckpointSpec,
                                                                                    "keep_last", path),
        keep_best=_keep_best(raw.get("keep_best")),
        async_save=read(raw, CheckpointSpec, "async_save", path),
        on_preemption=read(raw, CheckpointSpec, "on_preemption", path),
    )


def _keep_best(raw: Any) -> KeepBestSpec | None:
    if raw is None:
        return None
    path = "checkpoint.keep_best"
    mapping(raw, path)
    check_keys(raw, KeepBestSpec, path)
    monitor = read(raw, KeepBestSpec, "monitor", path)
    return KeepBestSpec(k=read(raw, KeepBestSpec, "k", path), monitor=monitor,
                        mode=read(raw, KeepBestSpec, "mode", path))


def _failure(raw: Any) -> FailureSpec:
    path = "failure"
    mapping(raw, path)
    check_keys(raw, FailureSpec, path)
    return FailureSpec(**{f.name: read(raw, FailureSpec, f.name, path) for f in dataclasses.fields(FailureSpec)})


def _env(raw: Any) -> dict[str, str]:
    mapping(raw, "env")
    env = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise SpecError(f"field 'env': {key!r} is not a valid environment variable name. "
                            "Fix: use letters, digits and '_'.")
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError(f"field 'env.{key}': got {describe(value)}; environment values must be strings "
                            f"or numbers. Fix: quote it, e.g. {key}: \"1\".")
        env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _class_ref(raw: dict[str, Any], path: str) -> ClassRef:
    allowed = ("class_path", "init_args")
    for key in raw:
        if key not in allowed:
            raise SpecError(f"field '{path}.{key}' is not a valid key{nearest(key, allowed)}. "
                            "Valid keys: class_path, init_args.")
    class_path = read(raw, ClassRef, "class_path", path)
    check_import_path(class_path, f"{path}.class_path")  # imported last: imports.py
    init_args = read(raw, ClassRef, "init_args", path)
    return ClassRef(class_path=class_path, init_args=dict(init_args))
