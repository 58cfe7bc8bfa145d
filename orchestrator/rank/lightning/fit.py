"""The Lightning path: an unmodified LightningModule and LightningDataModule, trained by Lightning's
own strategies (DDP, our FSDP2, DeepSpeed) in a rank child of its node's agent, with the cluster
environment read from the torchrun variables the agent gives it (TorchElasticEnvironment).

What we add to a plain `Trainer.fit`:
- the training DataLoader is rebuilt over the epoch's global order (orchestrator/data/order.py):
  the same samples in the same order at any world size, each rank taking its slice of every
  global batch. Its position (samples of the epoch consumed) is saved with every checkpoint and
  the rebuilt loader starts there, so a resume, at any world size, neither repeats nor skips a
  sample (by itself Lightning replays the epoch from its start);
- with scaling.global_batch_size, the loader's batch size and accumulate_grad_batches are chosen
  for the world size so that every optimizer step sees the same samples;
- checkpoints go through our store (atomic, checksummed, asynchronous) by Lightning's public
  CheckpointIO plugin, at the steps the spec asks for, with every rank's RNG state, and are
  loaded with weights_only=True and handed to Lightning from memory;
- the final model fingerprint and metrics go to the driver.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from orchestrator.checkpoint import Serialized
from orchestrator.checkpoint.names import LIGHTNING_STATE, shard_file
from orchestrator.checkpoint.serialization import plain_state
from orchestrator.data.order import GlobalOrderSampler, StepTracker, split_global_batch
from orchestrator.data.seeded import global_order_loader
from orchestrator.errors import CheckpointError
from orchestrator.rank.batches import batch_len
from orchestrator.rank.fingerprint import weights_sha256
from orchestrator.rank.heartbeat import EPOCH_END, FINISHING, TRAINING, VALIDATION
from orchestrator.rank.identity import agent_devices, rank_device
from orchestrator.rank.lightning.datamodule import build_datamodule
from orchestrator.rank.lightning.fsdp import ShardedLightningStrategy, reshard_parts
from orchestrator.rank.lightning.loggers import build_loggers, continue_logger_runs
from orchestrator.rank.lightning.stream_split import rank_share
from orchestrator.rank.metric_values import metric_floats
from orchestrator.rank.rng import restore_rng, seed_everything
from orchestrator.rank.scratch import make_scratch
from orchestrator.rank.session import Restored, StopTraining, WorkerSession
from orchestrator.rank.sharding import full_model_state, local_state
from orchestrator.rank.train_state import Progress

log = logging.getLogger("orchestrator.worker")

CKPT_FILE = LIGHTNING_STATE

# The "path" Lightning is given to save to and resume from: StoreCheckpointIO maps it to the store.
STORE_PATH_PREFIX = "orchestrator-store://"
# Extra key in Lightning's checkpoint dict: our per-rank state (RNG), in rank order.
RANKS_KEY = "orchestrator_ranks"
# Extra key: the training data's global position, {"epoch": e, "consumed": samples}.
DATA_KEY = "orchestrator_data"


class TrainOrder:
    """The rebuilt training loader's sampler, and where the current epoch's pass stands."""

    def __init__(self) -> None:
        self.sampler: GlobalOrderSampler | None = None
        self.tracker: StepTracker | None = None
        self._tracked_epoch = -1

    def micro_batch_done(self, epoch: int) -> tuple[bool, int]:
        """Count one trained micro-batch: (does it end an optimizer step, epoch position after it)."""
        if self.sampler is None:
            return True, 0
        if self.tracker is None or self._tracked_epoch != epoch:
            self.tracker, self._tracked_epoch = StepTracker(self.sampler), epoch
        self.tracker.advance()
        return self.tracker.step_due, self.tracker.consumed


class StoreCheckpointIO(CheckpointIO):
    """Lightning's checkpoints go through this public plugin into the orchestrator's store.

    Saving: `trainer.save_checkpoint(...)` builds Lightning's own checkpoint dict and hands it
    here on rank 0; `on_save` adds our state and commits it. Loading: `fit(ckpt_path=...)` asks
    for the checkpoint the worker group resumes from, which is already in memory (read,
    checksummed and loaded with weights_only=True): no copy of it is written anywhere.
    """

    def __init__(self, on_save, restored: dict[str, Any] | None):
        self._on_save = on_save
        self._restored = restored

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        self._on_save(checkpoint)

    def load_checkpoint(self, path, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if self._restored is None:
            raise CheckpointError(f"Lightning asked to load {path}, but this rank loaded no checkpoint to resume "
                                  "from: the checkpoint is the orchestrator's to choose. Fix: leave ckpt_path out of "
                                  "trainer.fit and set resume_from in the spec.")
        restored, self._restored = self._restored, None  # handed over once: Lightning owns it now
        return restored

    def remove_checkpoint(self, path) -> None:
        pass  # retention is the store's


class OrchestratorCallback(Callback):
    """Saves through the store at the spec's cadence and reports progress to the driver."""

    def __init__(self, session: WorkerSession, pending_rng: dict[str, Any] | None, order: TrainOrder):
        self.session = session
        self.order = order
        # Under DeepSpeed: this rank's files of a checkpoint, from Lightning's dict; and whether
        # DeepSpeed holds partly accumulated gradients (no checkpoint is taken then).
        self.checkpoint_files: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.at_step_boundary: Callable[[], bool] = lambda: True
        self.progress = Progress()
        self._pending_rng = pending_rng
        self._last_step = -1
        self._snapshot_prepared = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        heartbeat = self.session.heartbeat
        if heartbeat.phase in (EPOCH_END, VALIDATION):
            heartbeat.enter(TRAINING)
        if self._pending_rng is not None:  # the first batch after a resume: continue each rank's RNG stream
            restore_rng(self._pending_rng)
            self._pending_rng = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self._snapshot_prepared and trainer.global_step > 0 and self.checkpoint_files is None:
            # The optimizer state exists now (DeepSpeed's files take their buffers at the first save).
            self._snapshot_prepared = True
            state = {"model": pl_module.state_dict(), "optimizers": [o.state_dict() for o in trainer.optimizers]}
            self.session.prepare_snapshot(local_state(state) if self.session.sharded else state)
        self.session.count_samples(batch_len(batch))
        step_due, consumed = self.order.micro_batch_done(trainer.current_epoch)
        if step_due:
            self.progress.consumed = consumed
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            # Lightning hands callbacks the loss divided by accumulate_grad_batches (automatic
            # optimisation); the user's training_step returned the undivided one.
            scale = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
            self.progress.metrics["loss"] = float(loss.detach()) * scale
        self._update(trainer, batch_in_epoch=batch_idx + 1)
        step = trainer.global_step
        # Only at a completed optimizer step (not mid gradient accumulation), once per step.
        if step != self._last_step and self.at_step_boundary():
            self._last_step = step
            self.session.stepped(self.progress)
            reason = self.session.save_reason(step)
            if reason:
                self._save(trainer, reason)
            if reason == "stop":
                raise StopTraining
        else:
            self.session.progress(self.progress)

    def on_exception(self, trainer, pl_module, exception):
        """The first of Lightning's handlers of an exception leaving the training (this callback is
        the first): the rank is failing from now on, whatever the other handlers and Lightning's
        teardown take before the exception reaches the rank's end (rank_main.py)."""
        if not isinstance(exception, StopTraining):
            self.session.failing(exception)

    # Validation (and Lightning's sanity check) may take longer than the hang timeout.
    def on_validation_start(self, trainer, pl_module):
        self.session.heartbeat.enter(VALIDATION)

    def on_validation_end(self, trainer, pl_module):
        """The checkpoints saved from now on carry the new validation metrics (keep_best ranks by them)."""
        if not trainer.sanity_checking:
            self.progress.metrics.update(metric_floats(trainer.callback_metrics))

    def on_sanity_check_start(self, trainer, pl_module):
        self.session.heartbeat.enter(VALIDATION)

    def on_train_start(self, trainer, pl_module):
        """After a resume in the middle of an epoch at another world size or accumulation: set
        Lightning's batch counters to the micro-batches this size would have run by now, so its
        accumulation boundaries and the epoch's end fall where the global order puts them."""
        sampler = self.order.sampler
        if sampler is None or sampler.start == 0:
            return
        progress = trainer.fit_loop.epoch_loop.batch_progress
        delta = sampler.micro_batches_before() - progress.current.ready
        for counter in (progress.current, progress.total):
            counter.ready += delta
            counter.started += delta
            counter.processed += delta
            counter.completed += delta

    def on_train_epoch_end(self, trainer, pl_module):
        self.session.heartbeat.enter(EPOCH_END)
        self.progress.metrics.update(metric_floats(trainer.callback_metrics))
        self.progress.consumed = 0
        self._update(trainer, batch_in_epoch=0, epoch=trainer.current_epoch + 1)
        self.session.progress(self.progress, force=True)
        if self.session.spec.checkpoint.at_epoch_end and self.at_step_boundary():
            self._save(trainer, "epoch_end")

    def on_train_end(self, trainer, pl_module):
        self.session.heartbeat.enter(FINISHING)
        if not self.at_step_boundary() and self.session.rank == 0:
            self.session.note_once(
                "training ended with DeepSpeed holding the gradients of micro-batches that no optimizer step used "
                "(an epoch's batches are not a multiple of accumulate_grad_batches); a checkpoint cannot hold them, "
                "so a run continued from the final checkpoint differs from one longer run by those micro-batches")
        if trainer.global_step != self.session.last_save_step:
            self._update(trainer, batch_in_epoch=self.progress.batch_in_epoch)
            self._save(trainer, "end")

    def _update(self, trainer, *, batch_in_epoch: int, epoch: int | None = None) -> None:
        self.progress.step = trainer.global_step
        self.progress.epoch = trainer.current_epoch if epoch is None else epoch
        self.progress.batch_in_epoch = batch_in_epoch

    def _save(self, trainer: pl.Trainer, reason: str) -> None:
        with self.session.stalling():
            self._snapshot_and_commit(trainer, reason)

    def _snapshot_and_commit(self, trainer: pl.Trainer, reason: str) -> None:
        self._ranks, self._token = self.session.gather_for_save()
        self._reason = reason
        # Lightning's own checkpoint dict (model, optimizers, schedulers, loops), built on every
        # rank by the public API; it arrives in StoreCheckpointIO -> commit_checkpoint on rank 0,
        # or, sharded, on every rank with that rank's part of the states.
        trainer.save_checkpoint(f"{STORE_PATH_PREFIX}{reason}", weights_only=False)
        if self.session.rank != 0 and not self.session.sharded:
            self.session.commit(self.progress, reason, dict)

    def commit_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Rank 0 (sharded: every rank): Lightning's checkpoint dict plus our state, snapshotted
        and handed to the writer."""
        checkpoint[RANKS_KEY] = self._ranks
        checkpoint[DATA_KEY] = {"epoch": self.progress.epoch, "consumed": self.progress.consumed}
        # Paths and enums in hyperparameters become plain values; anything that could only be
        # unpickled is refused now, naming it, rather than at the first resume.
        checkpoint = plain_state(checkpoint)
        if self.checkpoint_files is not None:
            files = {name: plain_state(state, name) for name, state in self.checkpoint_files(checkpoint).items()}
        else:
            files = {shard_file(CKPT_FILE, self.session.rank) if self.session.sharded else CKPT_FILE: checkpoint}
        snapshot = self.session.snapshot(files)
        self.session.commit(self.progress, self._reason,
                            lambda: {name: Serialized(state) for name, state in snapshot.items()}, token=self._token)


SCRATCH_PREFIX = "orchestrator-lightning-"


def train_lightning(session: WorkerSession) -> None:
    # Lightning's root dir is a scratch folder of this worker that goes with it (nothing of
    # ours is written there: checkpoints go to the store through StoreCheckpointIO). A worker
    # that was killed cannot remove its own: the next one on the machine does.
    scratch = make_scratch(SCRATCH_PREFIX)
    try:
        _train(session, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)



def _train(session: WorkerSession, scratch: str) -> None:
    spec = session.spec.lightning
    seed_everything(session.spec.seed)
    # A sharded checkpoint holds a file per rank: this rank keeps only its own in memory.
    deepspeed = spec.strategy == "deepspeed"
    if deepspeed:  # (deepspeed is imported only by the runs that use it)
        from orchestrator.rank.lightning.deepspeed import kept_by_rank

        keep = functools.partial(kept_by_rank, rank=session.rank)
    else:
        keep = {CKPT_FILE, shard_file(CKPT_FILE, session.rank)}.__contains__
    restored = session.start(keep=keep)
    session.announce(restored)
    model: pl.LightningModule = spec.model.build()
    datamodule: pl.LightningDataModule = (spec.data.build() if spec.data is not None
                                          else build_datamodule(session.spec.data))
    restored_state, pending_rng, position = _prepare_resume(session, restored)
    order = TrainOrder()
    _use_global_order_train_loader(datamodule, session, position, order)

    callback = OrchestratorCallback(session, pending_rng, order)
    device = rank_device()
    if spec.strategy == "fsdp":
        strategy = ShardedLightningStrategy(session.world_size, device, load_parts=_reshard_loader(session, restored))
    elif deepspeed:
        strategy = _deepspeed_strategy(session, restored, restored_state, scratch)
        callback.checkpoint_files, callback.at_step_boundary = strategy.checkpoint_files, strategy.at_step_boundary
        restored_state = None  # DeepSpeed reads it through its checkpoint engine, not CheckpointIO
    else:
        strategy = DDPStrategy()
    checkpoint_io = StoreCheckpointIO(callback.commit_checkpoint, restored_state)
    ckpt_path = f"{STORE_PATH_PREFIX}{restored.info.name}" if restored is not None else None
    loggers = build_loggers(spec.logger, session.run_dir.lightning_logs)
    # Quiet by default (the driver prints progress); a user's own value wins.
    trainer_args = {"logger": loggers or False, "enable_progress_bar": False, "enable_model_summary": False,
                    **spec.trainer}
    # One rank a process, as under torchrun: its agent's devices are the node's (rank child i on
    # the i-th); the ranks, the world and the process group (made by rank_main.py) come from
    # torchrun's variables through TorchElasticEnvironment.
    here = [torch.device(d) for d in agent_devices()]
    trainer = pl.Trainer(
        **trainer_args,
        devices=[d.index for d in here] if device.type == "cuda" else session.identity.local_world_size,
        num_nodes=session.world_size // session.identity.local_world_size,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        strategy=strategy,
        plugins=[TorchElasticEnvironment(), checkpoint_io],
        callbacks=[callback, *(ref.build() for ref in spec.callbacks)],
        enable_checkpointing=False,
        default_root_dir=scratch,
    )
    if session.rank == 0:
        continue_logger_runs(loggers, restored.info.step if restored is not None else None,
                             session.run_dir.lightning_logs)
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except StopTraining:
        # The stop checkpoint is in the writer's hands; finish() commits it.
        session.finish(callback.progress, _fingerprint(session, model, strategy), {}, stopped=True)
        return
    callback.progress.step = trainer.global_step
    test_metrics: dict[str, float] = {}
    if _has_test(model, datamodule):
        results = trainer.test(model, datamodule=datamodule, verbose=False)
        for result in results:
            test_metrics.update(metric_floats(result))
    session.finish(callback.progress, _fingerprint(session, model, strategy), test_metrics)


def _fingerprint(session: WorkerSession, model: pl.LightningModule, strategy) -> str:
    """The whole model's weights hash, on rank 0 (sharded: gathered first, so every rank calls it)."""
    if session.spec.strategy == "deepspeed":
        state = strategy.full_model_state()
    else:
        state = full_model_state(model) if session.sharded else model.state_dict() if session.rank == 0 else {}
    return weights_sha256(state) if session.rank == 0 else ""


def _deepspeed_strategy(session: WorkerSession, restored: Restored | None, client_state: dict[str, Any] | None,
                        scratch: str):
    """The DeepSpeed strategy, serving the resumed checkpoint's files from the store: the file with
    Lightning's dict already loaded (`client_state`), the others as DeepSpeed asks for them."""
    from orchestrator.rank.lightning.deepspeed import StoreDeepSpeedStrategy, StoreFiles, client_state_file

    def read(name: str) -> Any:
        assert restored is not None
        state = session.restored_state(restored, name)
        restored.files.pop(name, None)
        return state

    files = StoreFiles(read if restored is not None else None)
    args = dict(session.spec.lightning.deepspeed)
    if isinstance(args.get("timeout"), (int, float)):  # seconds in the spec
        import datetime

        args["timeout"] = datetime.timedelta(seconds=args["timeout"])
    strategy = StoreDeepSpeedStrategy(files, os.path.join(scratch, "deepspeed"), **args)
    if restored is not None:
        strategy.checkpoint_names = sorted(restored.manifest.files)
        files.serve(client_state_file(strategy.checkpoint_names, session.rank), client_state)
    return strategy


def _reshard_loader(session: WorkerSession, restored: Restored | None):
    """Sharded, resumed at another world size: this rank's parts rebuilt from the old ranks' files
    (read one at a time, checked against their checksums); None when no resharding is needed."""
    if restored is None or restored.manifest.world_size == session.world_size:
        return None
    old_world = restored.manifest.world_size

    def read_old(old_rank: int) -> dict[str, Any]:
        fname = shard_file(CKPT_FILE, old_rank)
        return session.restored_state(restored, fname)

    return lambda objects: reshard_parts(objects, read_old, old_world=old_world, world_size=session.world_size,
                                         rank=session.rank)


def _prepare_resume(session: WorkerSession, restored: Restored | None
                    ) -> tuple[dict[str, Any] | None, dict | None, dict[str, int]]:
    """The checkpoint the group resumes from, loaded (weights_only: unsafe content is refused with
    a clear message) for Lightning to take through StoreCheckpointIO; this rank's RNG state; and
    the training data's position."""
    if restored is None:
        return None, None, {"epoch": 0, "consumed": 0}
    if session.spec.strategy == "deepspeed":  # the DeepSpeed file that holds Lightning's dict
        from orchestrator.rank.lightning.deepspeed import client_state_file

        fname = client_state_file(sorted(restored.manifest.files), session.rank)
    elif session.sharded:  # this rank's own shard; at another world size, rank 0's (resharded later)
        fname = shard_file(CKPT_FILE, session.rank if restored.manifest.world_size == session.world_size else 0)
    else:
        fname = CKPT_FILE
    state = session.restored_state(restored, fname)
    restored.files.pop(fname, None)  # Lightning gets the loaded state; the bytes are not needed again
    ranks = state.pop(RANKS_KEY, None) or []
    pending = ranks[session.rank]["rng"] if len(ranks) == session.world_size else None
    position = state.pop(DATA_KEY, None) or {"epoch": restored.manifest.epoch, "consumed": restored.manifest.consumed}
    return state, pending, {"epoch": int(position["epoch"]), "consumed": int(position["consumed"])}


class _PositionedLoader(DataLoader):
    """The rebuilt training loader. Its position lives in its sampler (set from our checkpoint),
    so its own state is empty; having one tells Lightning that it resumes mid-epoch."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _use_global_order_train_loader(datamodule: pl.LightningDataModule, session: WorkerSession,
                                   position: dict[str, int], order: TrainOrder) -> None:
    """Make the datamodule's train_dataloader() follow the global order, without changing the user's class.

    The rebuilt loader keeps every setting of the user's (collate function, workers,
    worker_init_fn, generator, prefetch...); its batch size is the user's, or with
    scaling.global_batch_size the largest micro-batch up to it that splits this rank's share, with
    Trainer.accumulate_grad_batches set to match. A loader the global order cannot take over is
    never changed silently (`_kept_as_written`): its sampling stays the user's, and the driver
    says once how it resumes.
    """
    original_cls = type(datamodule)
    spec = session.spec

    def train_dataloader(self):
        loader = original_cls.train_dataloader(self)
        if not isinstance(loader, DataLoader) or isinstance(loader, (_PositionedLoader, _RankShardedLoader)):
            return loader
        world, rank = session.world_size, session.rank
        kept = _kept_as_written(loader, world, rank)
        if kept is not None:
            loader, note = kept
            if rank == 0:
                session.note_once(note)
            return loader
        global_batch = spec.scaling.global_batch_size
        if global_batch:
            micro, accumulation = split_global_batch(global_batch, world, loader.batch_size)
            if self.trainer is not None:
                self.trainer.accumulate_grad_batches = accumulation
        else:
            micro, global_batch = loader.batch_size, loader.batch_size * world
        positioned, sampler = global_order_loader(
            loader.dataset, world_size=world, rank=rank, global_batch=global_batch, micro_batch=micro,
            shuffle=isinstance(loader.sampler, RandomSampler), seed=spec.seed, drop_last=loader.drop_last,
            loader_class=_PositionedLoader, **_loader_settings(loader))
        sampler.start_at(position["epoch"], position["consumed"])
        sampler.set_epoch(position["epoch"])
        order.sampler = sampler
        return positioned

    datamodule.__class__ = type(original_cls.__name__, (original_cls,), {"train_dataloader": train_dataloader})


def _loader_settings(loader: DataLoader) -> dict[str, Any]:
    """Everything of a DataLoader's own configuration except its dataset, batching and sampling."""
    settings = {"num_workers": loader.num_workers, "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
                "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn, "generator": loader.generator,
                "multiprocessing_context": loader.multiprocessing_context}
    if loader.num_workers:
        settings.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    return settings


def _kept_as_written(loader: DataLoader, world: int, rank: int) -> tuple[DataLoader, str] | None:
    """A training loader the global order cannot take over, and what the driver should say about it.

    - An IterableDataset: a stream that is the same on every rank is cut, every rank taking one
      sample of each `world` consecutive ones; one that already splits itself by rank is kept as
      written (stream_split.py tells them apart; collective: every rank gets here together).
    - Its own sampler or batch sampler (a WeightedRandomSampler...): Lightning shards it over the
      ranks as under plain Trainer.fit (DistributedSamplerWrapper), so its weighting is kept.
    Neither has a position to resume from: a resume in the middle of an epoch starts that
    epoch's data again, as Lightning does for such loaders.
    """
    if isinstance(loader.dataset, IterableDataset):
        share, note = rank_share(loader.dataset, world, rank)
        if share is loader.dataset:
            return loader, note
        return _RankShardedLoader(share, batch_size=loader.batch_size, drop_last=loader.drop_last,
                                  **_loader_settings(loader)), note
    custom_batches = loader.batch_sampler is not None and loader.batch_size is None
    sampler = loader.batch_sampler if custom_batches else loader.sampler
    if custom_batches or not isinstance(sampler, (RandomSampler, SequentialSampler)):
        note = (f"the training loader uses its own {'batch sampler' if custom_batches else 'sampler'} "
                f"({type(sampler).__name__}): it is kept, and sharded over the ranks as Lightning does; a resume "
                "in the middle of an epoch starts that epoch's sampling again, and scaling.global_batch_size "
                "does not apply to it")
        return loader, note
    return None


class _RankShardedLoader(DataLoader):
    """The rebuilt loader over a rank's share of an iterable dataset (recognised, not rebuilt twice)."""


def _has_test(model: pl.LightningModule, datamodule: pl.LightningDataModule) -> bool:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden("test_step", model) and is_overridden("test_dataloader", datamodule)
