"""The plain-PyTorch path: `train_loop(ctx)` with a context that makes a DDP loop resumable.

A tutorial DDP loop becomes a job by changing a few lines:

    model = ctx.prepare_model(Net())                        # was: DDP(model.to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.config["lr"])
    loader = ctx.data_loader(dataset, batch_size=64)        # was: DataLoader(..., sampler=DistributedSampler(...))
    ctx.track(model=model, optimizer=optimizer)             # restores them when resuming
    for epoch in ctx.epochs():                              # was: for epoch in range(E): sampler.set_epoch(epoch)
        for x, y in loader:
            ...; optimizer.step()
            ctx.step(loss=loss.item())                      # counts the step, reports, checkpoints

Everything that makes resume exact (tracked state dicts, epoch, step, position in the epoch,
every rank's RNG) is saved together in one checkpoint and restored before the first batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from orchestrator.checkpoint import Serialized
from orchestrator.checkpoint.names import TORCH_STATE, shard_file
from orchestrator.data.order import GlobalOrderSampler, StepTracker, split_global_batch
from orchestrator.data.parquet import ParquetDataset
from orchestrator.data.seeded import global_order_loader
from orchestrator.data.sources import open_source
from orchestrator.errors import ContextMisuse, UserError
from orchestrator.rank.batches import batch_len, to_device
from orchestrator.rank.fingerprint import weights_sha256
from orchestrator.rank.heartbeat import EPOCH_END, FINISHING, TRAINING
from orchestrator.rank.identity import rank_device
from orchestrator.rank.metric_values import metric_floats
from orchestrator.rank.rng import restore_rng, seed_everything
from orchestrator.rank.session import Restored, StopTraining, WorkerSession
from orchestrator.rank.sharding import (
    full_model_state,
    load_local_state,
    local_state,
    reshard_states,
    shard_model,
)
from orchestrator.rank.train_state import Progress, TrainState
from orchestrator.spec import import_object

log = logging.getLogger("orchestrator.worker")

STATE_FILE = TORCH_STATE


class TrainContext:
    """What a plain PyTorch DDP loop needs from the orchestrator, and nothing more."""

    def __init__(self, session: WorkerSession, restored: Restored | None):
        self._session = session
        spec = session.spec
        self.config: dict[str, Any] = dict(spec.torch.config)
        self.max_epochs: int | None = spec.torch.max_epochs
        self.max_steps: int | None = spec.torch.max_steps
        self.seed: int = spec.seed
        self.rank: int = session.rank
        self.world_size: int = session.world_size
        self.local_rank: int = session.local_rank
        self.device: torch.device = rank_device()
        self.progress = Progress()
        self._tracked: dict[str, Any] = {}
        self._loaders: list[ResumableLoader] = []
        self._data_loaders: dict[str, ResumableLoader] = {}
        # The training loader's index among this context's loaders (None: no step taken yet),
        # and the loaders being iterated now, innermost last.
        self._train_loader: int | None = None
        self._iterating: list[ResumableLoader] = []
        self._restored: TrainState | None = None
        self._session_restored = restored
        self._pending_rng: dict[str, Any] | None = None
        self._samples_since_step = 0
        self._snapshot_prepared = False
        self._prepared: torch.nn.Module | None = None
        # A sharded checkpoint written by another number of ranks: this rank's state is rebuilt
        # from the old ranks' files that hold its rows (read as needed, in track()).
        self._reshard_from: int | None = None
        if restored is not None:
            manifest = restored.manifest
            if manifest.sharded and manifest.world_size != self.world_size:
                self._reshard_from = manifest.world_size
                fname = shard_file(STATE_FILE, 0)
            else:
                fname = shard_file(STATE_FILE, self.rank) if manifest.sharded else STATE_FILE
            raw = self._session.restored_state(restored, fname)
            self._restored = TrainState.from_dict(raw)
            self.progress = self._restored.progress
            self._train_loader = self.progress.train_loader
            self._pending_rng = self._restored.rng_of(self.rank, self.world_size)

    # --- building blocks --------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    @property
    def global_step(self) -> int:
        return self.progress.step

    @property
    def attempt(self) -> int:
        """Which start of the run's worker group this is: one more after every restart or resize."""
        return self._session.attempt

    def prepare_model(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """Move the model to this worker's device and make it data-parallel, as torch.strategy says.

        ddp: wrapped in DistributedDataParallel (kwargs go to it). fsdp: sharded in place with
        fully_shard, each submodule that owns parameters and then the root (kwargs go to
        fully_shard); build the optimizer from the returned model's parameters.
        """
        if self._session.sharded:
            self._prepared = shard_model(model, self.device, **kwargs)
        else:
            self._prepared = _data_parallel(model, self.device, kwargs)
        return self._prepared

    def data_loader(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
                    **loader_kwargs: Any) -> ResumableLoader:
        """A DataLoader over this rank's share of each global batch: one order per epoch whatever
        the world size, resumable mid-epoch, moved to the device.

        `batch_size` is the most samples one forward pass takes. With scaling.global_batch_size
        the training loader yields micro-batches of at most that size, `ctx.accumulation_steps`
        of them per optimizer step; otherwise its global batch is batch_size x world size.
        """
        resumable = ResumableLoader(self, dataset, batch_size, shuffle=shuffle, drop_last=drop_last,
                                    loader_kwargs=loader_kwargs, index=len(self._loaders))
        self._loaders.append(resumable)
        return resumable

    def data(self, name: str = "train", **loader_kwargs: Any) -> ResumableLoader:
        """The loader of the spec's `data.<name>` Parquet input (see `data_loader`): batches are
        dicts of tensors named as in the spec's columns, streamed a row group at a time."""
        if name not in self._data_loaders:
            source = getattr(self._session.spec.data, name, None) if self._session.spec.data else None
            if source is None:
                raise UserError(f"ctx.data({name!r}): the spec has no data.{name} section. Fix: add data.{name} with "
                                "a path (and columns, batch_size), or build your own loader with ctx.data_loader().")
            dataset = ParquetDataset(open_source(source, f"data.{name}"), window=source.window)
            self._data_loaders[name] = self.data_loader(
                dataset, source.batch_size, shuffle=source.shuffle, drop_last=source.drop_last,
                collate_fn=ParquetDataset.collate, **loader_kwargs)
        return self._data_loaders[name]

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on this rank (1 unless scaling.global_batch_size asks
        for more samples per rank than the training loader's batch_size)."""
        loader = self._training_loader()
        return loader.batching(training=True)[2] if loader is not None else 1

    @property
    def step_due(self) -> bool:
        """Whether the training micro-batch just yielded completes an optimizer step: take the
        optimizer step and call ctx.step() only then. Always true without accumulation."""
        loader = self._training_loader()
        return loader is None or loader.tracker is None or loader.tracker.step_due

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward() for gradient accumulation: scaled by the micro-batches of this step, and
        without the gradient all-reduce on every micro-batch but the step's last."""
        loader = self._training_loader()
        tracker = loader.tracker if loader is not None else None
        count = tracker.micro_batches_in_step if tracker is not None else 1
        if count <= 1:
            loss.backward()
            return
        loss = loss / count
        model, due = self._prepared, self.step_due
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not due:
            with model.no_sync():
                loss.backward()
        elif hasattr(model, "set_requires_gradient_sync"):  # fully_shard (fsdp)
            model.set_requires_gradient_sync(due)
            loss.backward()
        else:
            loss.backward()

    def track(self, **objects: Any) -> None:
        """Register objects with state_dict()/load_state_dict() (model, optimizer, scheduler, scaler).

        Their state is saved in every checkpoint and, when resuming, loaded into them right here.
        """
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise ContextMisuse(f"ctx.track({name}=...): {type(obj).__name__} has no state_dict() and "
                                    "load_state_dict(), so it can be neither saved nor restored. Fix: track the "
                                    "model, optimizer, LR scheduler or grad scaler, or wrap other state in an "
                                    "object with both methods.")
            if self._restored is not None and name not in self._restored.objects:
                raise ContextMisuse(f"ctx.track({name}=...): the checkpoint being resumed holds no state named "
                                    f"'{name}' (it has {sorted(self._restored.objects)}). Fix: track the names the "
                                    "checkpoint was written with, or start a new run (another name, or "
                                    "resume_from: none).")
        self._tracked.update(objects)
        if self._restored is None:
            return
        # Resharding reads the old ranks' files once for all the objects of this call.
        resharded = self._resharded(objects) if self._reshard_from is not None else {}
        for name, obj in objects.items():
            saved = self._restored.objects[name]
            if self._reshard_from is not None:
                load_local_state(obj, resharded[name])
            elif self._session.sharded:
                load_local_state(obj, saved)
            else:
                _unwrap(obj).load_state_dict(saved)

    def epochs(self) -> Iterator[int]:
        """Epoch numbers from where the run stands; stops at max_epochs or when max_steps is reached."""
        while not self._done():
            epoch = self.progress.epoch
            if not self._loaders:  # no ctx.data_loader: restore the RNG before the epoch instead
                self._restore_pending_rng()
            yield epoch
            if self._steps_exhausted():
                break
            self.progress.epoch = epoch + 1
            self.progress.batch_in_epoch = 0
            self.progress.consumed = 0
            self._session.progress(self.progress, force=True)
            if self._session.spec.checkpoint.at_epoch_end:
                self.save(reason="epoch_end")

    def step(self, **metrics: Any) -> None:
        """Call once after each optimizer step. Counts it, reports metrics, and checkpoints when due."""
        if not self._snapshot_prepared:  # after the first optimizer step its state exists
            self._snapshot_prepared = True
            self._session.prepare_snapshot(self._tracked_state())
        if self._train_loader is None and self._iterating:
            # The first step names the training loader: the one this step's batches came from.
            self._name_training_loader(self._iterating[-1])
        loader = self._training_loader()
        if loader is not None and loader.tracker is not None and loader in self._iterating:
            if not loader.tracker.step_due:
                raise ContextMisuse(
                    f"ctx.step() was called after a micro-batch that does not end an optimizer step: each "
                    f"step of this run takes {self.accumulation_steps} micro-batches per rank "
                    "(scaling.global_batch_size split over the workers, at most the loader's batch_size "
                    "per forward pass). Fix: call ctx.backward(loss) for every micro-batch and "
                    "optimizer.step() and ctx.step() only when ctx.step_due is true.")
            self.progress.consumed = loader.tracker.consumed
            self.progress.batch_in_epoch = loader.position
        self.progress.step += 1
        self.progress.metrics.update(metric_floats(metrics, strict=True))
        self._session.count_samples(self._samples_since_step)
        self._samples_since_step = 0
        self._session.stepped(self.progress)
        reason = self._session.save_reason(self.progress.step)
        if reason:
            self.save(reason=reason)
        if reason == "stop":
            raise StopTraining

    @contextlib.contextmanager
    def untimed(self, phase: str = "validation") -> Iterator[None]:
        """A block that may take longer than failure.hang_timeout_s without counting as a hang,
        e.g. an evaluation in the middle of an epoch: `with ctx.untimed(): evaluate(...)`.
        (The time between an epoch's last batch and the next epoch's first is untimed already.)"""
        with self._session.heartbeat.during(phase):
            yield

    def report(self, **metrics: Any) -> None:
        """Record metrics that are not per step (validation accuracy...); they go into summary.json."""
        self.progress.metrics.update(metric_floats(metrics, strict=True))

    def save(self, reason: str = "manual") -> None:
        """Checkpoint now (every rank must call it). The loop only blocks for an in-memory copy.

        Unsharded, rank 0 writes the whole state; sharded (fsdp), every rank writes its own part.
        """
        session = self._session
        with session.stalling():
            ranks, token = session.gather_for_save()
            if self.rank != 0 and not session.sharded:
                session.commit(self.progress, reason, dict)
                return
            state = TrainState(progress=self.progress, ranks=ranks, objects=self._tracked_state())
            snapshot = session.snapshot(state.to_dict())
            fname = shard_file(STATE_FILE, self.rank) if session.sharded else STATE_FILE
            session.commit(self.progress, reason, lambda: {fname: Serialized(snapshot)},
                           token=token)

    # --- internals -----------------------------------------------------------------------------

    def _resharded(self, objects: dict[str, Any]) -> dict[str, Any]:
        restored = self._session_restored

        def read_old(old_rank: int) -> dict[str, Any]:
            if old_rank == 0:
                return self._restored.objects
            fname = shard_file(STATE_FILE, old_rank)
            raw = self._session.restored_state(restored, fname)
            return raw["objects"]

        return reshard_states(objects, read_old, old_world=self._reshard_from, world_size=self.world_size,
                              rank=self.rank)

    def _training_loader(self) -> ResumableLoader | None:
        index = self._train_loader if self._train_loader is not None else 0
        return self._loaders[index] if index < len(self._loaders) else None

    def _name_training_loader(self, loader: ResumableLoader) -> None:
        if loader.index != 0 and loader.batching(training=True) != loader.batching(training=False):
            raise ContextMisuse(
                f"the training loader is ctx.data_loader number {loader.index + 1}, but the loop "
                "iterated the first loader before it as if it were the training loader, and with "
                "scaling.global_batch_size the two batch differently. Fix: create the training "
                "loader first (before any validation loader).")
        self._train_loader = self.progress.train_loader = loader.index

    def _restore_pending_rng(self) -> None:
        if self._pending_rng is not None:
            restore_rng(self._pending_rng)
            self._pending_rng = None

    def _done(self) -> bool:
        epochs_done = self.max_epochs is not None and self.progress.epoch >= self.max_epochs
        return epochs_done or self._steps_exhausted()

    def _steps_exhausted(self) -> bool:
        return self.max_steps is not None and self.progress.step >= self.max_steps

    def _tracked_state(self) -> dict[str, Any]:
        """Every tracked object's state_dict(); sharded, this rank's local part of each."""
        states = {name: _unwrap(obj).state_dict() for name, obj in self._tracked.items()}
        return local_state(states) if self._session.sharded else states

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state on rank 0 (sharded: gathered, so every rank must call it)."""
        model = self._tracked.get("model")
        if model is None:
            models = [o for o in self._tracked.values() if isinstance(o, torch.nn.Module)]
            model = models[0] if models else None
        if model is None:
            return {}
        return full_model_state(model) if self._session.sharded else _unwrap(model).state_dict()


class ResumableLoader:
    """Iterates this rank's batches of the current epoch, in the epoch's global order.

    Each loader keeps its own position. The training loader (the one being iterated when the
    loop first calls ctx.step(); its index is saved in every checkpoint) is the only one whose
    position is the run's (`progress.consumed`): it resumes there, at any world size. Any other
    loader, e.g. a validation loader, covers its whole dataset once per pass (each sample on
    exactly one rank) and moves nothing.
    """

    def __init__(self, ctx: TrainContext, dataset: Dataset, batch_size: int, *, shuffle: bool, drop_last: bool,
                 loader_kwargs: dict[str, Any], index: int):
        self._ctx, self.dataset, self.index = ctx, dataset, index
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self._loader_kwargs = loader_kwargs
        self._built: dict[tuple[int, int, bool], tuple[DataLoader, GlobalOrderSampler]] = {}
        # Micro-batches of the current epoch already yielded (counting those before a resume).
        self.position = 0
        # The training pass's step bookkeeping (None before the first training pass).
        self.tracker: StepTracker | None = None

    def batching(self, *, training: bool) -> tuple[int, int, int]:
        """(global batch, micro-batch, accumulation steps) of this loader at this world size."""
        world = self._ctx.world_size
        global_batch = self._ctx._session.spec.scaling.global_batch_size
        if training and global_batch:
            micro, accumulation = split_global_batch(global_batch, world, self.batch_size)
            return global_batch, micro, accumulation
        return self.batch_size * world, self.batch_size, 1

    def _build(self, training: bool) -> tuple[DataLoader, GlobalOrderSampler]:
        global_batch, micro, _ = self.batching(training=training)
        key = (global_batch, micro, training)
        if key not in self._built:
            ctx = self._ctx
            self._built[key] = global_order_loader(
                self.dataset, world_size=ctx.world_size, rank=ctx.rank, global_batch=global_batch,
                micro_batch=micro, shuffle=self.shuffle, seed=ctx.seed, drop_last=self.drop_last, training=training,
                **self._loader_kwargs)
        return self._built[key]

    def __len__(self) -> int:
        """Micro-batches of a whole epoch on this rank."""
        loader, sampler = self._build(self._is_training())
        sampler.set_epoch(self._ctx.progress.epoch)
        return len(loader)

    def _is_training(self) -> bool:
        known = self._ctx._train_loader
        return known == self.index or (known is None and self.index == 0)

    def __iter__(self):
        ctx = self._ctx
        training = self._is_training()
        loader, sampler = self._build(training)
        sampler.set_epoch(ctx.progress.epoch)
        sampler.start_at(ctx.progress.epoch, ctx.progress.consumed if training else 0)
        tracker = self.tracker = StepTracker(sampler)
        start = sampler.start
        self.position = sampler.micro_batches_before()
        # Building a DataLoader iterator draws from the global RNG. The uninterrupted run built
        # it at the epoch's start: so restore before building at an epoch boundary, after it
        # mid-epoch (the saved state already includes that draw).
        if training and start == 0:
            ctx._restore_pending_rng()
        iterator = iter(loader)
        if training:
            ctx._restore_pending_rng()
        heartbeat = ctx._session.heartbeat
        ctx._iterating.append(self)
        try:
            for batch in iterator:
                training = self._is_training()
                if training and ctx._steps_exhausted():
                    return
                if training and heartbeat.phase == EPOCH_END:
                    heartbeat.enter(TRAINING)
                self.position += 1
                tracker.advance()
                if training:
                    ctx.progress.batch_in_epoch = self.position
                    ctx._samples_since_step += batch_len(batch)
                yield to_device(batch, ctx.device)
        finally:
            ctx._iterating.remove(self)
            if self._is_training():
                # The training pass is over, whether its data ran out, max_steps ended it
                # mid-epoch or the loop broke out: what the loop does until the next epoch's
                # first batch (evaluation, logging, the end save) is not timed as a hang.
                heartbeat.enter(EPOCH_END)


def train_torch(session: WorkerSession) -> None:
    spec = session.spec
    seed_everything(spec.seed)
    # A sharded checkpoint holds a file per rank: this rank loads only its own.
    own_files = {STATE_FILE, shard_file(STATE_FILE, session.rank)}
    restored = session.start(keep=own_files.__contains__)
    session.announce(restored)
    ctx = TrainContext(session, restored)
    stopped = False
    if ctx._done():
        log.info("nothing to train: the run already reached its limits; the loop only restores the model")
    # Run even when nothing is left to train (a group started at the run's end): the loop builds
    # and restores the model, ctx.epochs() yields nothing, and the result's fingerprint is the
    # loaded model's, never that of an empty state.
    train_loop = import_object(spec.torch.train_loop, "torch.train_loop")
    try:
        train_loop(ctx)
    except StopTraining:
        stopped = True  # the stop checkpoint is in the writer's hands; finish() commits it
    # The end save, the last write and (fsdp) the gathered model are bounded by
    # failure.finish_timeout_s, not by the training step's hang timeout.
    session.heartbeat.enter(FINISHING)
    # The end-of-run checkpoint, unless the last save was at this very step.
    if not stopped and ctx.progress.step != session.last_save_step:
        ctx.save(reason="end")
    model_state = ctx._model_state() if session.rank == 0 or session.sharded else {}
    fingerprint = weights_sha256(model_state) if session.rank == 0 else ""
    session.finish(ctx.progress, fingerprint, {}, stopped=stopped)


def _data_parallel(model: torch.nn.Module, device: torch.device, kwargs: dict[str, Any]) -> torch.nn.Module:
    """The model on this rank's device, in DistributedDataParallel when there are peers (as Ray
    Train's prepare_model makes it)."""
    model = model.to(device)
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return model
    if device.type == "cuda":
        kwargs = {"device_ids": [device], "output_device": device, **kwargs}
    return torch.nn.parallel.DistributedDataParallel(model, **kwargs)


def _unwrap(obj: Any) -> Any:
    return obj.module if isinstance(obj, torch.nn.parallel.DistributedDataParallel) else obj

