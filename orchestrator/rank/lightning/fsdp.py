"""`lightning.trainer.strategy: fsdp`: an unchanged LightningModule, sharded with FSDP2.

Lightning's own FSDPStrategy wraps with FSDP1 and refuses CPUs (as does Ray's RayFSDPStrategy,
built on it), and its ModelParallelStrategy runs FSDP2 (`fully_shard`) but only for modules that
shard themselves in `configure_model`. This strategy is the latter with the rest filled in:

- a module's own `configure_model` runs first (it may shard the module itself; the mesh is
  `self.device_mesh`). A module left unsharded, by having no `configure_model` or one that only
  builds layers, is then sharded the way the torch path shards a model (`sharding.shard_model`:
  each submodule that owns parameters, tied ones together, then the module itself as the root),
  over one data-parallel mesh of the worker group. Each step (training_step, validation_step,
  ...) then runs inside the module's own forward call, where FSDP's root hooks are;
- the device is the one the rank's agent was given, and the ranks and process group are the
  rank child's (rank/rank_main.py, from torchrun's variables);
- a checkpoint is sharded: every rank hands the store its own part of the model and optimizer
  states, as plain tensors (`sharding.local_state`), through the CheckpointIO plugin; nothing is
  gathered on one rank. A resume loads each rank's part back, rebuilt from the old ranks' files
  when the world size changed (`sharding.reshard_states`), and gives Lightning the rest (loops,
  schedulers, callbacks, hyperparameters).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden

from orchestrator.rank.sharding import load_local_state, local_state, reshard_states, shard_model

# Lightning's checkpoint dict: the entries that are sharded (one part per rank).
MODEL_KEY = "state_dict"
OPTIMIZERS_KEY = "optimizer_states"


class ShardedLightningStrategy(ModelParallelStrategy):
    """FSDP2 for a Lightning module trained by one rank a process (see the module's docstring).

    `load_parts(objects)`: on a resume at another world size, this rank's parts for `objects`
    ({MODEL_KEY: model, "optimizer_<i>": optimizer}) rebuilt from the old ranks' files; None when
    the checkpoint handed to `load_checkpoint` is this rank's own shard.
    """

    def __init__(self, world_size: int, device: torch.device,
                 load_parts: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        super().__init__(data_parallel_size=world_size, tensor_parallel_size=1, save_distributed_checkpoint=True)
        self._device = device
        self._load_parts = load_parts

    @property
    def root_device(self) -> torch.device:
        return self._device

    @property
    def num_processes(self) -> int:
        return 1  # one rank a process, each its agent's child

    def setup_environment(self) -> None:
        # configure_model is where a module is sharded: Lightning calls it once the device mesh
        # exists, before the optimizers are built. The module's own runs first (it may shard
        # itself, or only build layers); whatever it left unsharded is sharded after it.
        module = self.lightning_module
        if module is not None:
            own = module.configure_model if is_overridden("configure_model", module) else None
            module.configure_model = types.MethodType(_shard_unless_sharded(self, own), module)
        super().setup_environment()

    # --- every step inside the root's forward (Lightning calls training_step, not forward) -----------

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.train_step_context():
            return self._step("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self._step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self._step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self._step("predict_step", *args, **kwargs)

    def _step(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.fsdp import FSDPModule

        module = self.lightning_module
        if isinstance(module, FSDPModule):
            return _through_forward(module, method, *args, **kwargs)
        return getattr(module, method)(*args, **kwargs)  # a module that sharded only its children

    # --- the checkpoint, one part per rank ---------------------------------------------------------

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return local_state(self.lightning_module.state_dict())

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer  # the wrapped torch optimizer (public property)
        return local_state(optimizer.state_dict())

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        # Every rank: its part goes to the CheckpointIO plugin, which commits it as its shard.
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """This rank's part of the model and optimizer states loaded (after setup: the model is
        sharded and the optimizers exist); Lightning restores the rest from the returned dict."""
        checkpoint = self.checkpoint_io.load_checkpoint(checkpoint_path, weights_only=weights_only)
        objects = {MODEL_KEY: self.lightning_module,
                   **{f"optimizer_{i}": optimizer for i, optimizer in enumerate(self.optimizers)}}
        parts = self._load_parts(objects) if self._load_parts is not None else checkpoint_parts(checkpoint)
        for name, obj in objects.items():
            if name in parts:
                load_local_state(obj, parts[name])
        return checkpoint


def checkpoint_parts(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A rank's saved checkpoint dict as the named parts `reshard_states` reads."""
    return {MODEL_KEY: checkpoint[MODEL_KEY],
            **{f"optimizer_{i}": state for i, state in enumerate(checkpoint.get(OPTIMIZERS_KEY, []))}}


def reshard_parts(objects: dict[str, Any], read_old: Callable[[int], dict[str, Any]], *, old_world: int,
                  world_size: int, rank: int) -> dict[str, Any]:
    """This rank's parts rebuilt from a checkpoint written by `old_world` ranks."""
    return reshard_states(objects, lambda old: checkpoint_parts(read_old(old)), old_world=old_world,
                          world_size=world_size, rank=rank)


def _shard_unless_sharded(strategy: ShardedLightningStrategy, own: Callable[[], None] | None
                          ) -> Callable[[Any], None]:
    def configure_model(module) -> None:
        from torch.distributed.fsdp import FSDPModule

        if own is not None:
            own()
        # A module whose configure_model only builds layers would otherwise train unsharded, each
        # rank on its own, with nothing synchronising the ranks' gradients.
        if not any(isinstance(m, FSDPModule) for m in module.modules()):
            # Each submodule that owns parameters (tied ones together), then the module itself
            # as the one root, which `_step` makes run around every step.
            shard_model(module, strategy.root_device, mesh=strategy.device_mesh["data_parallel"])

    return configure_model


def _through_forward(module: torch.nn.Module, method: str, *args: Any, **kwargs: Any) -> Any:
    """`module.<method>(*args)` called from inside `module(...)`, so that the hooks FSDP put on
    the root's forward (gathering its own parameters, the root's bookkeeping, the end-of-backward
    callback) run around the step. Lightning does the same for a wrapper module."""
    had_own_forward = "forward" in vars(module)
    original = module.forward

    def forward(*inner_args: Any, **inner_kwargs: Any) -> Any:
        _restore_forward(module, original, had_own_forward)  # the step's own self(x) is the real forward
        return getattr(module, method)(*inner_args, **inner_kwargs)

    module.forward = forward
    try:
        return module(*args, **kwargs)
    finally:
        _restore_forward(module, original, had_own_forward)


def _restore_forward(module: torch.nn.Module, original: Any, had_own_forward: bool) -> None:
    if had_own_forward:
        module.forward = original
    else:
        vars(module).pop("forward", None)
