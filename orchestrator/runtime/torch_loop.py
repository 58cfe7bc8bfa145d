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
import uuid
from collections.abc import Iterator
from typing import Any

import ray.train
import ray.train.torch
import torch
from torch.utils.data import DataLoader, Dataset

from orchestrator.checkpoint import dumps_state, loads_state
from orchestrator.runtime.batches import batch_len, to_device
from orchestrator.runtime.fingerprint import weights_sha256
from orchestrator.runtime.heartbeat import EPOCH_END, TRAINING
from orchestrator.runtime.rng import capture_rng, restore_rng, seed_everything
from orchestrator.runtime.sampling import ResumableDistributedSampler
from orchestrator.runtime.session import Restored, StopTraining, WorkerSession
from orchestrator.runtime.sharding import full_model_state, load_local_state, local_state, shard_model
from orchestrator.runtime.train_state import Progress, TrainState
from orchestrator.spec import import_object

log = logging.getLogger("orchestrator.worker")

STATE_FILE = "state.pt"


def shard_file(rank: int) -> str:
    """Rank `rank`'s file of a sharded checkpoint (torch.strategy: fsdp)."""
    return f"state-{rank:05d}.pt"


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
        self.device: torch.device = ray.train.torch.get_device()
        self.progress = Progress()
        self._tracked: dict[str, Any] = {}
        self._loaders: list[ResumableLoader] = []
        # The training loader's index among this context's loaders (None: no step taken yet),
        # and the loaders being iterated now, innermost last.
        self._train_loader: int | None = None
        self._iterating: list[ResumableLoader] = []
        self._restored: TrainState | None = None
        self._pending_rng: dict[str, Any] | None = None
        self._last_batch_size = 0
        self._snapshot_prepared = False
        if restored is not None:
            fname = shard_file(self.rank) if restored.manifest.sharded else STATE_FILE
            raw = loads_state(restored.files[fname], source=f"{restored.info.uri}/{fname}")
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

    def prepare_model(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """Move the model to this worker's device and make it data-parallel, as torch.strategy says.

        ddp: wrapped in DistributedDataParallel (kwargs go to it). fsdp: sharded in place with
        fully_shard, each submodule that owns parameters and then the root (kwargs go to
        fully_shard); build the optimizer from the returned model's parameters.
        """
        if self._session.sharded:
            return shard_model(model, self.device, **kwargs)
        return ray.train.torch.prepare_model(model, parallel_strategy_kwargs=kwargs or None)

    def data_loader(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
                    **loader_kwargs: Any) -> ResumableLoader:
        """A DataLoader over this rank's shard: seeded per epoch, resumable mid-epoch, moved to the device."""
        sampler = ResumableDistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle, seed=self.seed,
            drop_last=drop_last, batch_size=batch_size,
        )
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **loader_kwargs)
        resumable = ResumableLoader(self, loader, sampler, index=len(self._loaders))
        self._loaders.append(resumable)
        return resumable

    def track(self, **objects: Any) -> None:
        """Register objects with state_dict()/load_state_dict() (model, optimizer, scheduler, scaler).

        Their state is saved in every checkpoint and, when resuming, loaded into them right here.
        """
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"ctx.track({name}=...): {type(obj).__name__} has no state_dict()/load_state_dict()")
            self._tracked[name] = obj
            if self._restored is not None:
                saved = self._restored.objects.get(name)
                if saved is None:
                    raise KeyError(f"ctx.track({name}=...): the checkpoint being resumed holds no state named "
                                   f"'{name}' (it has {sorted(self._restored.objects)})")
                if self._session.sharded:
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
            active = self._iterating[-1]
            self._train_loader = self.progress.train_loader = active.index
            self.progress.batch_in_epoch = active.position
        self.progress.step += 1
        self.progress.metrics.update(_scalars(metrics))
        self._session.count_samples(self._last_batch_size)
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
        self.progress.metrics.update(_scalars(metrics))

    def save(self, reason: str = "manual") -> None:
        """Checkpoint now (every rank must call it). The loop only blocks for an in-memory copy.

        Unsharded, rank 0 writes the whole state; sharded (fsdp), every rank writes its own part.
        """
        session = self._session
        with session.stalling():
            local: dict[str, Any] = {"rng": capture_rng()}
            if session.sharded:  # rank 0's token names this save's staging folder on every rank
                local["token"] = uuid.uuid4().hex[:8]
            gathered = session.gather(local)
            ranks = [{"rng": entry["rng"]} for entry in gathered]
            if self.rank != 0 and not session.sharded:
                session.commit(self.progress, reason, dict)
                return
            state = TrainState(progress=self.progress, ranks=ranks, objects=self._tracked_state())
            snapshot = session.snapshot(state.to_dict())
            fname = shard_file(self.rank) if session.sharded else STATE_FILE
            session.commit(self.progress, reason, lambda: {fname: dumps_state(snapshot)},
                           token=gathered[0].get("token", ""))

    # --- internals -----------------------------------------------------------------------------

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
    """Iterates this rank's batches of the current epoch.

    Each loader keeps its own position. The training loader (the one being iterated when the
    loop first calls ctx.step(); its index is saved in every checkpoint) is the only one whose
    position is the run's (`progress.batch_in_epoch`): it resumes there. Any other loader, e.g.
    a validation loader, runs its whole pass every time it is iterated and moves nothing.
    """

    def __init__(self, ctx: TrainContext, loader: DataLoader, sampler: ResumableDistributedSampler, index: int):
        self._ctx, self.loader, self.sampler, self.index = ctx, loader, sampler, index
        # Batches of the current pass already yielded.
        self.position = 0

    def __len__(self) -> int:
        return len(self.loader)

    def _is_training(self) -> bool:
        known = self._ctx._train_loader
        return known == self.index or (known is None and self.index == 0)

    def __iter__(self):
        ctx = self._ctx
        training = self._is_training()
        start = ctx.progress.batch_in_epoch if training else 0
        self.position = start
        self.sampler.set_epoch(ctx.progress.epoch)
        self.sampler.start_batch = start
        # Building a DataLoader iterator draws from the global RNG. The uninterrupted run built
        # it at the epoch's start: so restore before building at an epoch boundary, after it
        # mid-epoch (the saved state already includes that draw).
        if training and start == 0:
            ctx._restore_pending_rng()
        iterator = iter(self.loader)
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
                if training:
                    ctx.progress.batch_in_epoch = self.position
                    ctx._last_batch_size = batch_len(batch)
                yield to_device(batch, ctx.device)
        finally:
            ctx._iterating.remove(self)
        if self._is_training():
            # The epoch's data is done: what the loop does until the next epoch's first batch
            # (evaluation, logging) is not timed as a hang.
            heartbeat.enter(EPOCH_END)


def train_torch(session: WorkerSession) -> None:
    spec = session.spec
    seed_everything(spec.seed)
    # A sharded checkpoint holds a file per rank: this rank loads only its own.
    own_files = {STATE_FILE, shard_file(session.rank)}
    restored = session.start(keep=own_files.__contains__)
    session.announce(restored)
    ctx = TrainContext(session, restored)
    stopped = False
    if ctx._done():
        log.info("nothing to train: the run already reached its limits")
    else:
        train_loop = import_object(spec.torch.train_loop, "torch.train_loop")
        try:
            train_loop(ctx)
        except StopTraining:
            stopped = True  # the stop checkpoint is in the writer's hands; finish() commits it
    # The end-of-run checkpoint, unless the last save was at this very step.
    if not stopped and ctx.progress.step != session.last_save_step:
        ctx.save(reason="end")
    model_state = ctx._model_state() if session.rank == 0 or session.sharded else {}
    fingerprint = weights_sha256(model_state) if session.rank == 0 else ""
    session.finish(ctx.progress, fingerprint, {}, stopped=stopped)


def _unwrap(obj: Any) -> Any:
    return obj.module if isinstance(obj, torch.nn.parallel.DistributedDataParallel) else obj



def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().item()
        out[key] = float(value)
    return out

