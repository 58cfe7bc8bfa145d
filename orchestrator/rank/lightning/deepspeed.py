"""`lightning.trainer.strategy: deepspeed`: an unchanged LightningModule trained with DeepSpeed ZeRO
(stages 1-3, CPU offload on GPUs), with its checkpoints in the orchestrator's store.

The strategy is Lightning's DeepSpeedStrategy (the ranks and devices from torchrun's variables,
in a rank child of its node's agent) with three things added:

- **CPUs.** Lightning allows DeepSpeed on CUDA only, though DeepSpeed has a CPU accelerator that
  trains over gloo. On a CPU run the two GPU-only checks are skipped and the device is given an
  index, which DeepSpeed requires. Everything else is DeepSpeed's own code, as on GPUs.
- **Saving through the store.** DeepSpeed saves with `engine.save_checkpoint`, which writes each
  rank's files through the engine's `checkpoint_engine` (DeepSpeed's extension point for where
  checkpoints go). `StoreFiles` is one: it keeps the states instead of writing them, and each rank
  hands its files (`deepspeed-<DeepSpeed's file name>`) to the store's sharded commit, with
  Lightning's checkpoint dict (loops, callbacks, hyperparameters) and ours inside DeepSpeed's
  model-states file as DeepSpeed's "client state".
- **Resuming from the store.** `engine.load_checkpoint` reads through the same checkpoint engine,
  which serves each file from the store's verified bytes, loaded with weights_only=True. DeepSpeed
  also lists the checkpoint's directory (a glob) and checks that files exist before reading them:
  for that it is given a directory of empty placeholder files, named after the checkpoint's files,
  in the worker's scratch folder. No byte of the checkpoint is copied.

DeepSpeed's optimizer states hold a few objects of its own (a loss scaler, the addresses of
parameter fragments); they are saved as their plain attributes and rebuilt from them (three known
DeepSpeed classes), so that nothing is ever unpickled.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy

from orchestrator.errors import CheckpointError

FILE_PREFIX = "deepspeed-"
TAG = "checkpoint"  # DeepSpeed's folder for one checkpoint (Lightning's tag)
OBJECT_KEY = "__deepspeed_object__"


def store_name(deepspeed_file: str) -> str:
    """The store's name for one of DeepSpeed's checkpoint files."""
    return FILE_PREFIX + os.path.basename(deepspeed_file)


def is_deepspeed_file(name: str) -> bool:
    return name.startswith(FILE_PREFIX)


def kept_by_rank(name: str, rank: int) -> bool:
    """The files a rank reads when it resumes: its own (ZeRO partitions, or under stage 3 its part
    of the model) and the model-states file of stages 0-2, which every rank loads."""
    return is_deepspeed_file(name) and (f"zero_pp_rank_{rank}_" in name or name == store_name(
        "mp_rank_00_model_states.pt"))


def client_state_file(names: list[str], rank: int) -> str:
    """Which of a checkpoint's files holds Lightning's dict (DeepSpeed's client state) for `rank`."""
    own = store_name(f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")  # stage 3: every rank's
    for name in (store_name("mp_rank_00_model_states.pt"), own):
        if name in names:
            return name
    raise FileNotFoundError(f"no DeepSpeed model-states file for rank {rank} among {sorted(names)}")


class StoreFiles(CheckpointEngine):
    """DeepSpeed's checkpoint engine for one rank: saved states are kept for the store, and loaded
    ones are served from it (see the module's docstring)."""

    def __init__(self, read: Callable[[str], Any] | None = None):
        super().__init__()
        self.name = "orchestrator-store"
        self.saved: dict[str, Any] = {}
        self._served: dict[str, Any] = {}
        self._read = read  # a file of the checkpoint being resumed that was not handed over in memory

    def serve(self, name: str, state: Any) -> None:
        self._served[name] = state

    def release(self) -> None:
        """After the resume: DeepSpeed has loaded what it was served."""
        self._served = {}

    # --- DeepSpeed's interface -------------------------------------------------------------------

    def create(self, info) -> None:
        self.saved = {}

    def makedirs(self, path, exist_ok=False) -> None:
        pass  # nothing is written where DeepSpeed points

    def save(self, state_dict, path: str) -> None:
        self.saved[store_name(path)] = plain_deepspeed_objects(state_dict)

    def load(self, path: str, map_location=None) -> Any:
        # DeepSpeed reads the model-states file twice (a check, then the load): it stays served
        # until the resume is over (release()).
        name = store_name(path)
        state = self._served.get(name)
        if state is None:
            if self._read is None:
                raise FileNotFoundError(f"DeepSpeed asked for {name}, which the checkpoint being resumed lacks")
            state = self._read(name)
        return with_deepspeed_objects(state)

    def commit(self, info) -> bool:
        return True


class StoreDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy on CPUs as on GPUs, saving to and resuming from the store.

    `files` is this rank's checkpoint engine (what DeepSpeed saves is kept there for the store;
    what it loads is served from there); `placeholders` is a folder in the worker's scratch for
    the names DeepSpeed lists when it resumes, and for the recovery scripts it copies on a save.
    """

    def __init__(self, files: StoreFiles, placeholders: str, **deepspeed_args: Any):
        super().__init__(**deepspeed_args)
        self.files = files
        self._placeholders = placeholders
        self.checkpoint_names: list[str] = []  # the resumed checkpoint's files

    @property
    def root_device(self) -> torch.device:
        device = super().root_device
        # DeepSpeed selects its device by index (`device_rank`); on CPUs there is one.
        return torch.device("cpu", 0) if device.type == "cpu" else device

    def setup_environment(self) -> None:
        if self.root_device.type == "cpu":  # Lightning's check that DeepSpeed runs on CUDA
            DDPStrategy.setup_environment(self)
        else:
            super().setup_environment()

    def setup_distributed(self) -> None:
        if self.root_device.type == "cpu":  # as Lightning's, less its check of CUDA device indices
            reset_seed()
            self.set_world_ranks()
            self._init_deepspeed_distributed()
        else:
            super().setup_distributed()

    def at_step_boundary(self) -> bool:
        """Whether DeepSpeed holds no partly accumulated gradients, which a checkpoint cannot hold.

        DeepSpeed accumulates gradients itself, counting micro-batches over the whole run, while
        Lightning counts them per epoch and leaves a last, incomplete accumulation to DeepSpeed:
        when an epoch's batches are not a multiple of accumulate_grad_batches, Lightning's step
        ends and DeepSpeed's fall apart, and only DeepSpeed's are safe to save at.
        """
        engine = self.deepspeed_engine
        return engine.micro_steps % engine.gradient_accumulation_steps() == 0

    def full_model_state(self) -> dict[str, Any]:
        """The whole model's state on rank 0 (empty elsewhere); every rank calls it (stage 3 gathers)."""
        module = self.lightning_module
        if not self.zero_stage_3:
            return module.state_dict() if self.global_rank == 0 else {}
        import deepspeed

        # One parameter at a time, copied to the CPU on rank 0: the whole model gathered at once
        # would not fit on a device, for just the models ZeRO-3 is for.
        state = {}
        for key, value in module.state_dict(keep_vars=True).items():
            with deepspeed.zero.GatheredParameters([value] if hasattr(value, "ds_id") else [], modifier_rank=None):
                if self.global_rank == 0:
                    state[key] = value.detach().to("cpu", copy=True)
        return state

    # --- checkpoints ---------------------------------------------------------------------------------

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        return {}  # DeepSpeed saves its optimizer's partitions itself (and Lightning drops this)

    def checkpoint_files(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """This rank's files of a checkpoint: DeepSpeed's states, with Lightning's dict (less the
        model and optimizer states, which DeepSpeed holds) as its client state. Every rank calls it."""
        engine = self.deepspeed_engine
        engine.checkpoint_engine = self.files
        client = {key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")}
        # DeepSpeed writes only small side files where it is pointed: its recovery scripts.
        save_dir = os.path.join(self._placeholders, "save")
        os.makedirs(save_dir, exist_ok=True)
        engine.save_checkpoint(save_dir, tag=TAG, client_state=client,
                               save_latest=False, exclude_frozen_parameters=self.exclude_frozen_parameters)
        files, self.files.saved = self.files.saved, {}
        return files

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        # Every rank: the CheckpointIO plugin hands Lightning's dict to the orchestrator, which
        # asks checkpoint_files() for this rank's files and commits them as its shard.
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        from lightning.pytorch.trainer.states import TrainerFn

        engine = self.deepspeed_engine
        engine.checkpoint_engine = self.files
        load_dir = os.path.join(self._placeholders, "load")
        folder = os.path.join(load_dir, TAG)
        os.makedirs(folder, exist_ok=True)
        for name in self.checkpoint_names:
            open(os.path.join(folder, name[len(FILE_PREFIX):]), "w").close()
        try:
            fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
            _, client_state = engine.load_checkpoint(load_dir, tag=TAG, load_optimizer_states=fitting,
                                                     load_lr_scheduler_states=False,
                                                     load_module_strict=self.lightning_module.strict_loading)
        finally:
            shutil.rmtree(load_dir, ignore_errors=True)
            self.files.release()
        if client_state is None:
            raise CheckpointError(f"DeepSpeed could not load checkpoint {checkpoint_path}: it found no state of its "
                                  "own there. Fix: resume with the strategy the checkpoint was written with, or "
                                  "start a new run (another name, or resume_from: none).")
        return client_state


def _deepspeed_objects() -> dict[str, type]:
    """The DeepSpeed classes found in its checkpoint states (measured for ZeRO stages 0-3, fp32 and
    bf16), which are saved as their attributes and rebuilt from them: nothing else is."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.utils.tensor_fragment import fragment_address

    return {cls.__name__: cls for cls in (LossScaler, DynamicLossScaler, fragment_address)}


def plain_deepspeed_objects(value: Any) -> Any:
    """`value` with DeepSpeed's own objects (loss scalers, fragment addresses) replaced by their attributes."""
    known = _deepspeed_objects()
    if type(value).__name__ in known and type(value) is known[type(value).__name__]:
        return {OBJECT_KEY: type(value).__name__, "state": dict(vars(value))}
    if isinstance(value, dict):
        return _same_mapping(value, {key: plain_deepspeed_objects(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(plain_deepspeed_objects(item) for item in value)
    return value


def with_deepspeed_objects(value: Any) -> Any:
    """The inverse of `plain_deepspeed_objects`, for the classes it names only."""
    if isinstance(value, dict):
        if OBJECT_KEY in value:
            cls = _deepspeed_objects()[value[OBJECT_KEY]]
            obj = cls.__new__(cls)
            obj.__dict__.update(value["state"])
            return obj
        return _same_mapping(value, {key: with_deepspeed_objects(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(with_deepspeed_objects(item) for item in value)
    return value


def _same_mapping(original: dict, items: dict) -> dict:
    """`items` as an OrderedDict where `original` was one (DeepSpeed's state dicts), else a dict."""
    import collections

    return collections.OrderedDict(items) if isinstance(original, collections.OrderedDict) else items
