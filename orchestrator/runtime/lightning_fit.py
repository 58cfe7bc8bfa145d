"""The Lightning path: an unmodified LightningModule and LightningDataModule, trained with DDP
through Ray's Lightning strategy, environment and trainer preparation.

What we add to a plain `Trainer.fit`:
- the training DataLoader is rebuilt over the epoch's global order (orchestrator/data/order.py):
  the same samples in the same order at any world size, each rank taking its slice of every
  global batch. Its position (samples of the epoch consumed) is saved with every checkpoint and
  the rebuilt loader starts there, so a resume, at any world size, neither repeats nor skips a
  sample (by itself Lightning replays the epoch from its start);
- with scaling.global_batch_size, the loader's batch size and accumulate_grad_batches are chosen
  for the world size so that every optimizer step sees the same samples;
- checkpoints go through our store (atomic, checksummed, asynchronous), at the steps the spec
  asks for, with every rank's RNG state, and are loaded with weights_only=True;
- the final model fingerprint and metrics go to the driver.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from orchestrator.checkpoint import Serialized, loads_state
from orchestrator.data.order import GlobalOrderSampler, StepTracker, split_global_batch
from orchestrator.runtime.batches import batch_len
from orchestrator.runtime.fingerprint import weights_sha256
from orchestrator.runtime.heartbeat import EPOCH_END, FINISHING, TRAINING, VALIDATION
from orchestrator.runtime.rng import capture_rng, restore_rng, seed_everything
from orchestrator.runtime.session import Restored, StopTraining, WorkerSession
from orchestrator.runtime.train_state import Progress

log = logging.getLogger("orchestrator.worker")

CKPT_FILE = "lightning.ckpt"
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


class OrchestratorCallback(Callback):
    """Saves through the store at the spec's cadence and reports progress to the driver."""

    def __init__(self, session: WorkerSession, pending_rng: dict[str, Any] | None, order: TrainOrder):
        self.session = session
        self.order = order
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
        if not self._snapshot_prepared and trainer.global_step > 0:  # the optimizer state exists now
            self._snapshot_prepared = True
            self.session.prepare_snapshot({"model": pl_module.state_dict(),
                                           "optimizers": [o.state_dict() for o in trainer.optimizers]})
        self.session.count_samples(batch_len(batch))
        step_due, consumed = self.order.micro_batch_done(trainer.current_epoch)
        if step_due:
            self.progress.consumed = consumed
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self.progress.metrics["loss"] = float(loss.detach())
        self._update(trainer, batch_in_epoch=batch_idx + 1)
        step = trainer.global_step
        # Only at a completed optimizer step (not mid gradient accumulation), once per step.
        if step != self._last_step:
            self._last_step = step
            self.session.stepped(self.progress)
            reason = self.session.save_reason(step)
            if reason:
                self._save(trainer, reason)
            if reason == "stop":
                raise StopTraining
        else:
            self.session.progress(self.progress)

    # Validation (and Lightning's sanity check) may take longer than the hang timeout.
    def on_validation_start(self, trainer, pl_module):
        self.session.heartbeat.enter(VALIDATION)

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
        self.progress.metrics.update(_metric_floats(trainer.callback_metrics))
        self.progress.consumed = 0
        self._update(trainer, batch_in_epoch=0, epoch=trainer.current_epoch + 1)
        self.session.progress(self.progress, force=True)
        if self.session.spec.checkpoint.at_epoch_end:
            self._save(trainer, "epoch_end")

    def on_train_end(self, trainer, pl_module):
        self.session.heartbeat.enter(FINISHING)
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
        ranks = self.session.gather({"rng": capture_rng()})
        # Lightning's own checkpoint dict (model, optimizers, schedulers, loops and the stateful
        # loader's position); taken on every rank, as Trainer.save_checkpoint does.
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if self.session.rank != 0:
            self.session.commit(self.progress, reason, dict)
            return
        checkpoint[RANKS_KEY] = ranks
        checkpoint[DATA_KEY] = {"epoch": self.progress.epoch, "consumed": self.progress.consumed}
        snapshot = self.session.snapshot(checkpoint)
        self.session.commit(self.progress, reason, lambda: {CKPT_FILE: Serialized(snapshot)})


SCRATCH_PREFIX = "orchestrator-lightning-"


def train_lightning(session: WorkerSession) -> None:
    # Lightning's root dir and the copy of the checkpoint it resumes from live in a scratch
    # folder of this worker that goes with it (a checkpoint can be gigabytes). A worker that was
    # killed cannot remove its own: the next one on the machine does.
    _remove_scratch_of_dead_workers()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        _train(session, scratch)


def _remove_scratch_of_dead_workers() -> None:
    import shutil

    from orchestrator.cluster import is_alive

    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if name.startswith(SCRATCH_PREFIX) and pid.isdigit() and not is_alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _train(session: WorkerSession, scratch: str) -> None:
    spec = session.spec.lightning
    seed_everything(session.spec.seed)
    restored = session.start()
    session.announce(restored)
    model: pl.LightningModule = spec.model.build()
    datamodule: pl.LightningDataModule = spec.data.build()
    ckpt_path, pending_rng, position = _prepare_resume(session, restored, scratch)
    order = TrainOrder()
    _use_global_order_train_loader(datamodule, session, position, order)

    callback = OrchestratorCallback(session, pending_rng, order)
    # Quiet by default (the driver prints progress); a user's own value wins.
    trainer_args = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, **spec.trainer}
    trainer = pl.Trainer(
        **trainer_args,
        devices="auto",
        accelerator="gpu" if session.spec.scaling.use_gpu else "cpu",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[callback],
        enable_checkpointing=False,
        default_root_dir=scratch,
    )
    trainer = prepare_trainer(trainer)
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except StopTraining:
        # The stop checkpoint is in the writer's hands; finish() commits it.
        session.finish(callback.progress, weights_sha256(model.state_dict()) if session.rank == 0 else "", {},
                       stopped=True)
        return
    callback.progress.step = trainer.global_step
    test_metrics: dict[str, float] = {}
    if _has_test(model, datamodule):
        results = trainer.test(model, datamodule=datamodule, verbose=False)
        for result in results:
            test_metrics.update(_metric_floats(result))
    fingerprint = weights_sha256(model.state_dict()) if session.rank == 0 else ""
    session.finish(callback.progress, fingerprint, test_metrics)


def _prepare_resume(session: WorkerSession, restored: Restored | None,
                    scratch: str) -> tuple[str | None, dict | None, dict[str, int]]:
    """Write the chosen checkpoint where Lightning can load it; pick out this rank's RNG state and
    the training data's position."""
    if restored is None:
        return None, None, {"epoch": 0, "consumed": 0}
    data = restored.files[CKPT_FILE]
    # Our own weights_only load first: it refuses unsafe content with a clear message.
    state = loads_state(data, source=f"{restored.info.uri}/{CKPT_FILE}")
    ranks = state.get(RANKS_KEY) or []
    pending = ranks[session.rank]["rng"] if len(ranks) == session.world_size else None
    position = state.get(DATA_KEY) or {"epoch": restored.manifest.epoch, "consumed": restored.manifest.consumed}
    path = os.path.join(scratch, CKPT_FILE)
    with open(path, "wb") as f:
        f.write(data)
    return path, pending, {"epoch": int(position["epoch"]), "consumed": int(position["consumed"])}


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

    The rebuilt loader keeps the dataset, collate function and worker settings; its batch size is
    the user's, or with scaling.global_batch_size the largest micro-batch up to it that splits this
    rank's share, with Trainer.accumulate_grad_batches set to match. A loader with its own batch
    sampler, or over an iterable dataset, is kept as the user wrote it (and resumes as Lightning does).
    """
    original_cls = type(datamodule)
    spec = session.spec

    def train_dataloader(self):
        loader = original_cls.train_dataloader(self)
        if not isinstance(loader, DataLoader) or isinstance(loader, _PositionedLoader):
            return loader
        custom_batches = loader.batch_sampler is not None and loader.batch_size is None
        if custom_batches or isinstance(loader.dataset, IterableDataset):
            return loader
        world, rank = session.world_size, session.rank
        global_batch = spec.scaling.global_batch_size
        if global_batch:
            micro, accumulation = split_global_batch(global_batch, world, loader.batch_size)
            if self.trainer is not None:
                self.trainer.accumulate_grad_batches = accumulation
        else:
            micro, global_batch = loader.batch_size, loader.batch_size * world
        sampler = GlobalOrderSampler(loader.dataset, world_size=world, rank=rank, global_batch=global_batch,
                                     micro_batch=micro, shuffle=isinstance(loader.sampler, RandomSampler),
                                     seed=spec.seed, drop_last=loader.drop_last)
        sampler.start_at(position["epoch"], position["consumed"])
        sampler.set_epoch(position["epoch"])
        order.sampler = sampler
        return _PositionedLoader(
            loader.dataset, batch_size=micro, sampler=sampler, num_workers=loader.num_workers,
            collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
            persistent_workers=loader.persistent_workers if loader.num_workers else False,
        )

    datamodule.__class__ = type(original_cls.__name__, (original_cls,), {"train_dataloader": train_dataloader})


def _has_test(model: pl.LightningModule, datamodule: pl.LightningDataModule) -> bool:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden("test_step", model) and is_overridden("test_dataloader", datamodule)


def _metric_floats(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = float(value.detach())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out
