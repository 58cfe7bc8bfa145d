"""`lightning.trainer.strategy: deepspeed...`: the DeepSpeed strategy a spec asks for, checked on
the driver and translated into the arguments of Lightning's DeepSpeedStrategy.

A spec names it as Lightning users do: one of Lightning's registered names (`deepspeed` is ZeRO
stage 2, `deepspeed_stage_3_offload`, ...), or a LightningCLI-style
`{class_path: lightning.pytorch.strategies.DeepSpeedStrategy, init_args: {stage: 3, config: ...}}`.
Everything is checked here, so that a refused setting never reaches the workers:

- the arguments, against DeepSpeedStrategy's signature; a DeepSpeed `config` (a dict or a JSON
  file, read here and shipped as a dict, so the file need not exist on the workers);
- what belongs to the Trainer or to the orchestrator is refused, naming the field to set: the
  batch sizes, accumulation and clipping are Trainer arguments that Lightning writes into the
  DeepSpeed config itself (a precision block is kept where it agrees with the Trainer's
  precision), and the devices, cluster and process group come from Ray;
- what would fail on the workers: ZeRO arguments beside a config (Lightning ignores them),
  clipping by value, a precision DeepSpeed has no mode for;
- what would take state around the store: DeepSpeed's own checkpoint engines and NVMe offload
  (whose swap files DeepSpeed copies beside its checkpoint files);
- an elastic world size: DeepSpeed cannot repartition ZeRO optimizer states for another number
  of ranks ("Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is
  not currently supported"), so a DeepSpeed run keeps its size (fsdp reshards).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import SpecError

FIELD = "lightning.trainer.strategy"
STRATEGY_CLASS_PATHS = (
    "lightning.pytorch.strategies.DeepSpeedStrategy",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy",
    "ray.train.lightning.RayDeepSpeedStrategy",
)
# DeepSpeedStrategy arguments the orchestrator sets on the workers.
OWNED_ARGS = {
    "accelerator": "scaling.use_gpu chooses the accelerator",
    "parallel_devices": "each rank has its own device, given by its node's agent",
    "cluster_environment": "the node's agent provides the ranks and the rendezvous (torchrun's variables)",
    "process_group_backend": "NCCL with scaling.use_gpu, gloo without",
    "precision_plugin": "set lightning.trainer.precision",
    "load_full_weights": "a run resumes from its own DeepSpeed checkpoints, one file set per rank",
}
# DeepSpeed config keys that Lightning fills in from the Trainer's arguments (and the loader).
TRAINER_KEYS = {
    "train_batch_size": "the loader's batch_size (DeepSpeed derives it: micro-batch x accumulation x workers)",
    "gradient_accumulation_steps": "lightning.trainer.accumulate_grad_batches",
    "gradient_clipping": "lightning.trainer.gradient_clip_val",
    "amp": "lightning.trainer.precision",
}
# Precision blocks a config may hold, if they agree with the Trainer's precision.
PRECISION_KEYS = {"fp16": ("16-mixed", "16-true"), "bf16": ("bf16-mixed", "bf16-true")}
# Lightning's precisions under DeepSpeed (its DeepSpeedPrecision plugin), and their older names.
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "half": "16-true"}
# DeepSpeedStrategy arguments that only build its default config: with a config of the user's,
# Lightning ignores them.
DEFAULT_CONFIG_ARGS = (
    "zero_optimization", "stage", "contiguous_gradients", "overlap_comm", "allgather_partitions", "reduce_scatter",
    "allgather_bucket_size", "reduce_bucket_size", "sub_group_size", "zero_allow_untested_optimizer",
    "logging_batch_size_per_gpu", "offload_optimizer", "offload_parameters", "offload_params_device",
    "offload_optimizer_device", "nvme_path", "params_buffer_count", "params_buffer_size", "max_in_cpu",
    "optimizer_buffer_count", "pin_memory", "block_size", "queue_depth", "single_submit", "overlap_events",
    "thread_count", "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
    "synchronize_checkpoint_boundary",
)
# DeepSpeed config keys that would checkpoint around the store.
STORE_KEYS = ("checkpoint", "nebula", "datastates")


def is_deepspeed(value: Any) -> bool:
    """Whether `lightning.trainer.strategy` names DeepSpeed (by name or by class_path)."""
    if isinstance(value, str):
        return value.startswith("deepspeed")
    if isinstance(value, Mapping):
        return "deepspeed" in str(value.get("class_path", "")).lower()
    return False


def deepspeed_args(value: Any) -> dict[str, Any]:
    """The keyword arguments of DeepSpeedStrategy that `lightning.trainer.strategy` stands for."""
    _check_installed()
    args = _registered_args(value) if isinstance(value, str) else _class_ref_args(value)
    _check_args(args)
    if args.get("config") is not None:
        args["config"] = _check_config(_load_config(args["config"]))
        ignored = [key for key in args if key in DEFAULT_CONFIG_ARGS]
        if ignored:
            raise SpecError(
                f"field '{FIELD}.init_args': {', '.join(ignored)} would be ignored: with a DeepSpeed config, "
                "Lightning builds nothing of its own and these arguments only shape the config it builds "
                "otherwise. Fix: move them into the config (zero_optimization: {stage: 3, offload_optimizer: "
                "{device: cpu}, ...}), or drop the config.")
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise SpecError(f"field '{FIELD}.init_args.timeout': got {timeout!r}; it is the seconds DeepSpeed's process "
                        "group waits for a collective. Fix: a number of seconds, e.g. timeout: 1800.")
    if "nvme" in offload_devices(args):
        raise SpecError(
            f"field '{FIELD}': NVMe offload is not supported: DeepSpeed copies its NVMe swap files next to its "
            "checkpoint files with its own file copies, around the orchestrator's store, so they would be neither "
            "committed atomically nor verified. Fix: offload to cpu (deepspeed_stage_3_offload), or use "
            "deepspeed_stage_3 without offload.")
    return args


def check_deepspeed_scaling(args: dict[str, Any], *, elastic: bool, use_gpu: bool, trainer: dict[str, Any],
                            global_batch_size: int | None = None) -> None:
    """What the scaling: section and the Trainer's arguments allow of the DeepSpeed settings."""
    precision = deepspeed_precision(trainer.get("precision"))
    _check_precision_blocks(args.get("config") or {}, precision)
    if trainer.get("gradient_clip_algorithm") == "value":
        raise SpecError(
            "field 'lightning.trainer.gradient_clip_algorithm': 'value' cannot go with DeepSpeed, which clips "
            "gradients by their norm only (Lightning: \"DeepSpeed does not support clipping gradients by value\"). "
            "Fix: remove it (norm is the default) and keep gradient_clip_val.")
    if zero_stage(args) == 3 and ((args.get("config") or {}).get("zero_optimization") or {}).get("elastic_checkpoint"):
        raise SpecError(
            f"field '{FIELD}.init_args.config.zero_optimization.elastic_checkpoint': DeepSpeed implements elastic "
            "checkpoints for ZeRO stages 1 and 2 only, and ZeRO-3 would fail at its first save. Fix: remove it.")
    if global_batch_size is not None:
        # Lightning writes the accumulation into DeepSpeed's config before the train loader is
        # first built, which is where the orchestrator derives it from the global batch.
        raise SpecError(
            f"field 'scaling.global_batch_size': {global_batch_size} cannot go with {FIELD}: DeepSpeed, whose "
            "gradient accumulation Lightning fixes in DeepSpeed's config before the orchestrator can derive it "
            "from the global batch. A DeepSpeed run keeps one world size, so the global batch is the loader's "
            "batch_size x scaling.num_workers x accumulate_grad_batches. Fix: remove scaling.global_batch_size and "
            "set lightning.trainer.accumulate_grad_batches (and the loader's batch_size).")
    if not use_gpu:
        _check_cpu(offload_devices(args), precision)
    if elastic:
        raise SpecError(
            f"field 'scaling.num_workers': a range (elastic) cannot go with {FIELD}: DeepSpeed, because DeepSpeed "
            "cannot repartition ZeRO optimizer states for another number of ranks, so a resume at another world "
            "size would fail. Fix: give scaling.num_workers one number, or use strategy: fsdp, whose sharded "
            "checkpoints resume at any world size.")


def deepspeed_precision(precision: Any) -> str:
    """The Trainer's precision under DeepSpeed, by its current name (refused if DeepSpeed has none)."""
    name = "32-true" if precision is None else PRECISION_ALIASES.get(str(precision), str(precision))
    if name not in PRECISIONS:
        raise SpecError(
            f"field 'lightning.trainer.precision': {precision!r} is not one DeepSpeed trains in. Valid choices under "
            f"DeepSpeed: {', '.join(PRECISIONS)}. Fix: e.g. precision: bf16-mixed.")
    return name


def zero_stage(args: dict[str, Any]) -> int:
    """The ZeRO stage the settings give (Lightning's default, 2, unless a config or `stage` says)."""
    config = args.get("config")
    if config is not None:
        return int((config.get("zero_optimization") or {}).get("stage", 0))
    return int(args.get("stage", 2))


def offload_devices(args: dict[str, Any]) -> set[str]:
    """Where the settings offload ZeRO's states to ("cpu", "nvme"), from the arguments or the config."""
    config = args.get("config")
    if config is not None:
        zero = config.get("zero_optimization") or {}
        devices = {str((zero.get(key) or {}).get("device", "none")) for key in ("offload_optimizer", "offload_param")}
        return devices - {"none"}
    devices = set()
    if args.get("offload_optimizer"):
        devices.add(args.get("offload_optimizer_device", "cpu"))
    if args.get("offload_parameters"):
        devices.add(args.get("offload_params_device", "cpu"))
    if args.get("remote_device"):
        devices.add(args["remote_device"])
    return devices


def _check_cpu(offload_devices: set[str], precision: Any) -> None:
    """DeepSpeed runs on CPUs too (its CPU accelerator, over gloo), with two limits of its own."""
    if offload_devices:
        raise SpecError(
            f"field '{FIELD}': offload moves ZeRO's optimizer state (and parameters) from GPU memory into CPU "
            "memory, and this run trains on CPUs (scaling.use_gpu is false), where there is nothing to move. "
            "Fix: drop the offload (deepspeed_stage_2 or deepspeed_stage_3), or set scaling.use_gpu: true.")
    if precision.startswith("16"):
        raise SpecError(
            f"field 'lightning.trainer.precision': {precision!r} under DeepSpeed needs a GPU: DeepSpeed's CPU "
            "accelerator does not support fp16 (\"Type fp16 is not supported on your device\"). Fix: "
            "precision: bf16-mixed, or scaling.use_gpu: true.")


def _check_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise SpecError(
            f"field '{FIELD}': DeepSpeed needs the 'deepspeed' package, which is not installed here. Fix: pip "
            "install 'orchestrator[deepspeed]' (or pip install deepspeed) on every node of the cluster, or use "
            "strategy: fsdp, which shards with PyTorch alone.")


def _registered_args(name: str) -> dict[str, Any]:
    from lightning.pytorch.strategies import StrategyRegistry

    names = sorted(key for key in StrategyRegistry if key.startswith("deepspeed"))
    if name not in names:
        raise SpecError(
            f"field '{FIELD}': {name!r} is not one of Lightning's DeepSpeed strategies. Valid choices: "
            f"{', '.join(names)}. Fix: choose one of them, or write {{class_path: "
            "lightning.pytorch.strategies.DeepSpeedStrategy, init_args: {stage: 3, ...}}.")
    return dict(StrategyRegistry[name]["init_params"])


def _class_ref_args(value: Mapping[str, Any]) -> dict[str, Any]:
    class_path = str(value.get("class_path", ""))
    unknown = sorted(set(value) - {"class_path", "init_args"})
    if unknown:
        raise SpecError(f"field '{FIELD}': unknown key(s) {', '.join(unknown)}. Fix: write {{class_path, init_args}}.")
    if class_path.replace(":", ".") not in STRATEGY_CLASS_PATHS:
        raise SpecError(
            f"field '{FIELD}.class_path': {class_path!r} is not Lightning's DeepSpeedStrategy (the workers build "
            "their own subclass of it, with Ray's devices and the orchestrator's checkpoints). Fix: class_path: "
            "lightning.pytorch.strategies.DeepSpeedStrategy, with your settings under init_args.")
    init_args = value.get("init_args") or {}
    if not isinstance(init_args, Mapping):
        raise SpecError(f"field '{FIELD}.init_args': got {type(init_args).__name__}; it must be a mapping of "
                        "DeepSpeedStrategy's arguments. Fix: e.g. init_args: {stage: 3}.")
    return dict(init_args)


def _check_args(args: dict[str, Any]) -> None:
    from lightning.pytorch.strategies import DeepSpeedStrategy

    valid = [p for p in inspect.signature(DeepSpeedStrategy.__init__).parameters if p != "self"]
    for key in args:
        if key in OWNED_ARGS:
            raise SpecError(f"field '{FIELD}.init_args.{key}': the orchestrator sets this itself "
                            f"({OWNED_ARGS[key]}). Fix: remove it.")
        if key not in valid:
            raise SpecError(f"field '{FIELD}.init_args.{key}': {key!r} is not an argument of DeepSpeedStrategy. "
                            f"Fix: use one of {', '.join(valid)}.")
    stage = args.get("stage", 2)
    if stage not in (0, 1, 2, 3):
        raise SpecError(f"field '{FIELD}.init_args.stage': got {stage!r}; ZeRO stages are 0, 1, 2 and 3. "
                        "Fix: e.g. stage: 3.")


def _load_config(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config) as f:
                loaded = json.load(f)
        except OSError as exc:
            raise SpecError(f"field '{FIELD}.init_args.config': the DeepSpeed config file {str(config)!r} cannot "
                            f"be read ({exc.strerror}). Fix: give the path of a JSON file, or the config inline."
                            ) from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"field '{FIELD}.init_args.config': {str(config)!r} is not JSON ({exc}). Fix: correct the "
                            "file; DeepSpeed configs are JSON.") from None
        if isinstance(loaded, dict):
            return loaded
    raise SpecError(f"field '{FIELD}.init_args.config': got {type(config).__name__}; it must be a DeepSpeed config "
                    "(a mapping) or the path of one in JSON. Fix: e.g. config: {zero_optimization: {stage: 3}}.")


def _check_precision_blocks(config: dict[str, Any], precision: str) -> None:
    for key, precisions in PRECISION_KEYS.items():
        block = config.get(key)
        if block is None:
            continue
        enabled = block.get("enabled") if isinstance(block, dict) else None
        if enabled is not True and enabled is not False:
            raise SpecError(
                f"field '{FIELD}.init_args.config.{key}.enabled': got {enabled!r}; DeepSpeed needs true or false here "
                "('auto' is Hugging Face's, not DeepSpeed's). Fix: remove the block, and lightning.trainer.precision "
                "sets it.")
        if enabled != (precision in precisions):
            raise SpecError(
                f"field '{FIELD}.init_args.config.{key}': enabled: {str(enabled).lower()} disagrees with "
                f"lightning.trainer.precision: {precision}. Fix: remove the block (Lightning writes it from the "
                f"precision), or set precision: {precisions[0]}." if enabled else
                f"field '{FIELD}.init_args.config.{key}': enabled: false disagrees with lightning.trainer.precision: "
                f"{precision}. Fix: remove the block, or choose another precision.")


def _check_config(config: dict[str, Any]) -> dict[str, Any]:
    for key, owner in TRAINER_KEYS.items():
        if key in config:
            raise SpecError(
                f"field '{FIELD}.init_args.config.{key}': Lightning writes {key!r} into the DeepSpeed config itself, "
                f"from {owner}; set in both places, the two could disagree. Fix: remove it from the config and set "
                f"{owner}.")
    for key in STORE_KEYS:
        if key in config:
            raise SpecError(
                f"field '{FIELD}.init_args.config.{key}': DeepSpeed's own checkpoint engines would write around the "
                "orchestrator's store, which commits every checkpoint atomically and finds it for resume_from: "
                "latest. Fix: remove it; set when to save and what to keep under checkpoint:.")
    return config
