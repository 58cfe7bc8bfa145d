"""What both harnesses share inside a worker: identity, the chosen checkpoint, saving, reporting.

One `WorkerSession` per worker process. Rank 0 owns the checkpoint writer; every rank takes part
in the collective steps (gathering per-rank state, agreeing that a time-based save is due).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist

from orchestrator import storage
from orchestrator.checkpoint import AsyncCheckpointWriter, CheckpointInfo, CheckpointStore, Manifest
from orchestrator.runtime.cadence import SaveCadence
from orchestrator.runtime.snapshot import SnapshotBuffers
from orchestrator.runtime.train_state import Progress
from orchestrator.spec import JobSpec

log = logging.getLogger("orchestrator.worker")

# Seconds between progress events rank 0 sends to the driver.
PROGRESS_INTERVAL_S = 2.0


@dataclass
class Restored:
    """The checkpoint a worker resumes from: its store info and its verified file contents."""

    info: CheckpointInfo
    files: dict[str, bytes]

    @property
    def manifest(self) -> Manifest:
        assert self.info.manifest is not None
        return self.info.manifest


class WorkerSession:
    def __init__(self, config: dict[str, Any]):
        self.spec: JobSpec = config["spec"]
        self.run_uri: str = config["run_uri"]
        self.resume_uri: str | None = config.get("resume_uri")
        self.monitor = config["monitor"]
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.local_rank = context.get_local_rank()
        self.store = CheckpointStore.for_run(self.run_uri)
        # Sharded state (torch.strategy: fsdp): every rank writes its own part of each checkpoint.
        self.sharded = self.spec.torch is not None and self.spec.torch.strategy == "fsdp"
        self.writer = AsyncCheckpointWriter(
            self.store, asynchronous=self.spec.checkpoint.async_save, on_commit=self._on_commit
        ) if self.rank == 0 or self.sharded else None
        self._buffers = SnapshotBuffers()
        self.cadence = SaveCadence(self.spec.checkpoint, self.rank, self.world_size)
        # Seconds the training loop spent blocked in saves: gather, snapshot and hand-off.
        self.stall_seconds = 0.0
        self.last_save_step = -1
        # The checkpoint this worker group started from (None: a fresh start).
        self.restored_uri: str | None = None
        self._last_progress = 0.0
        self._samples_since = 0
        self._since = time.monotonic()
        _quiet_worker(self.spec, self.rank, config.get("log_dir"))

    # --- restore ------------------------------------------------------------------------------

    def choose_checkpoint(self, keep: Callable[[str], bool] | None = None) -> Restored | None:
        """The newest checkpoint committed during this run (after a restart), else the driver's pick.

        Every file is verified; only those `keep` accepts are held in memory.
        """
        restored = self._load_chosen_checkpoint(keep)
        if restored is not None:
            # The state at that step is committed already: saving it again would only rewrite it.
            self.last_save_step = restored.info.step
            self.restored_uri = restored.info.uri
        return restored

    def _load_chosen_checkpoint(self, keep: Callable[[str], bool] | None) -> Restored | None:
        latest = ray.get(self.monitor.latest_checkpoint.remote())
        uri = latest["uri"] if latest else self.resume_uri
        if uri is None:
            return None
        try:
            info, files = self.store.open_uri(uri, keep)
            return Restored(info, files)
        except Exception as exc:  # noqa: BLE001 - fall back to the newest checkpoint that verifies
            log.warning("checkpoint %s could not be loaded (%s); falling back to the newest that verifies", uri, exc)
        selection = self.store.latest_loadable(keep)
        return Restored(selection.info, selection.files) if selection.info else None

    def announce(self, restored: Restored | None) -> None:
        self.monitor.push.remote(
            "worker_started", rank=self.rank, world_size=self.world_size,
            node_id=ray.get_runtime_context().get_node_id(), hostname=socket.gethostname(),
            pid=os.getpid(), restored_from=restored.info.uri if restored else None,
            restored_step=restored.info.step if restored else None,
        )

    # --- progress -----------------------------------------------------------------------------

    def count_samples(self, n: int) -> None:
        self._samples_since += n

    def progress(self, progress: Progress, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.rank != 0 or (not force and now - self._last_progress < PROGRESS_INTERVAL_S):
            return
        # The first event opens the measuring window (start-up is not throughput).
        samples_per_s = None
        if self._samples_since and self._last_progress:
            samples_per_s = self._samples_since * self.world_size / max(now - self._since, 1e-9)
        self._samples_since, self._since, self._last_progress = 0, now, now
        self.monitor.push.remote("progress", samples_per_s=samples_per_s, **progress.to_dict())

    # --- saving -------------------------------------------------------------------------------

    def save_reason(self, step: int) -> str | None:
        """Why to checkpoint after `step` ("preemption", "steps", "seconds"), or None when no save is due.

        Every rank must call it after every optimizer step (time-based decisions are collective).
        """
        reason = self.cadence.reason(step)
        if reason == "preemption" and self.rank == 0:
            self._announce_preemption(step)
        return reason if step != self.last_save_step else None

    def _announce_preemption(self, step: int) -> None:
        notice = self.cadence.preemption
        deadline_ms = getattr(notice, "deadline_ms", None)
        left = f"{max(0.0, deadline_ms / 1000 - time.time()):.0f} s" if deadline_ms else "an unknown time"
        nodes = list(getattr(notice, "preempted_node_ids", []))
        log.warning("node(s) %s will be preempted in %s: checkpointing at step %d", nodes, left, step)
        self.monitor.push.remote("preemption", step=step, nodes=nodes, seconds_left=left)

    @contextlib.contextmanager
    def stalling(self):
        """Time a block of the training loop that exists only to checkpoint."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stall_seconds += time.perf_counter() - start

    def gather(self, local: Any) -> list[Any]:
        """Collect one object from every rank (e.g. RNG states), in rank order."""
        if not (dist.is_available() and dist.is_initialized()) or self.world_size == 1:
            return [local]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, local)
        return out

    def prepare_snapshot(self, state: Any) -> None:
        """Once training runs, on each rank that writes: get snapshot memory ready in the background."""
        if self.writer is not None:
            self._buffers.prepare(state)

    def snapshot(self, state: Any) -> Any:
        """Copy `state` for the writer, once the previous write no longer reads the buffers."""
        assert self.writer is not None
        self.writer.wait()
        return self._buffers.take(state)

    def commit(self, progress: Progress, reason: str, build_files: Callable[[], dict[str, bytes]],
               token: str = "") -> None:
        """Hand a snapshot to the writer (asynchronous unless checkpoint.async is false).

        Every rank calls it. Unsharded, rank 0 writes the whole checkpoint; sharded, every rank
        writes its own files and rank 0 commits once all are there (`token`: the same on all ranks).
        """
        self.last_save_step = progress.step
        self.cadence.saved()
        if self.writer is None:
            return
        manifest = Manifest(step=progress.step, epoch=progress.epoch, batch_in_epoch=progress.batch_in_epoch,
                            world_size=self.world_size, kind=self.spec.kind, files={},
                            metrics=_floats(progress.metrics), reason=reason, sharded=self.sharded)
        if self.sharded:
            self.writer.save_shard(manifest, token, self.rank, build_files)
        else:
            self.writer.save(manifest, build_files)

    def _on_commit(self, info: CheckpointInfo) -> None:
        self.monitor.push.remote("checkpoint", uri=info.uri, step=info.step, name=info.name,
                                 reason=info.manifest.reason if info.manifest else "")
        best = self.spec.checkpoint.keep_best
        self.store.retain(self.spec.checkpoint.keep_last, (best.k, best.monitor, best.mode) if best else None)

    def abandon(self) -> None:
        """The training loop raised: still commit the checkpoint already handed to the writer.

        Its snapshot was taken before the error, so it is a valid state; losing it would throw
        away work that was promised to the user. A failure of that write is only logged here,
        so the loop's own exception is the one that reaches the driver.
        """
        if self.writer is None:
            return
        try:
            self.writer.close()
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            log.warning("the checkpoint in flight when training failed was not committed: %s", exc)
        _flush_logs()

    def finish(self, progress: Progress, fingerprint: str, extra_metrics: dict[str, float]) -> None:
        """Wait for the last write, then (rank 0) tell the driver how the run ended."""
        if self.writer is not None and self.rank != 0:
            self.writer.close()  # this rank's last shard: rank 0's commit waits for it
        if self.writer is not None and self.rank == 0:
            # Training is over here: waiting for the last write is reported, not counted as stall.
            flush_start = time.perf_counter()
            self.writer.close()
            final_flush = time.perf_counter() - flush_start
            stall = self.stall_seconds
            last = self.writer.last_committed
            final_checkpoint = last.uri if last else self.restored_uri
            # Waited for: the worker may be torn down as soon as this function returns, and a
            # call still queued in it would be lost. Calls from one caller arrive in order, so
            # the checkpoint events sent before this one are delivered too.
            ray.get(self.monitor.push.remote(
                "finished", weights_sha256=fingerprint, final_checkpoint=final_checkpoint,
                checkpoint_stall_s=stall, final_flush_s=final_flush,
                metrics={**_floats(progress.metrics), **_floats(extra_metrics)},
                **{k: v for k, v in progress.to_dict().items() if k != "metrics"},
            ), timeout=60)
        _flush_logs()


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


# --- worker logs -------------------------------------------------------------------------------

class _Tee:
    """Writes to the worker's original stream (Ray's log file) and to the run's log file."""

    def __init__(self, stream, file):
        self._stream, self._file = stream, file

    def write(self, text):
        self._file.write(text)
        return self._stream.write(text)

    def flush(self):
        self._file.flush()
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


_LOG_FILE = None


def _quiet_worker(spec: JobSpec, rank: int, log_dir: str | None) -> None:
    """Keep per-rank chatter out of sight: Lightning's info lines and known harmless warnings."""
    global _LOG_FILE
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (".*LeafSpec.*", ".*does not have many workers.*", ".*barebones.*", ".*is not resumable.*",
                    ".*TypedStorage is deprecated.*", ".*torch.utils._pytree.*"):
        warnings.filterwarnings("ignore", message=pattern)
    if log_dir and _LOG_FILE is None:
        try:
            os.makedirs(log_dir, exist_ok=True)
            _LOG_FILE = open(os.path.join(log_dir, f"rank-{rank}.log"), "a", buffering=1)
            sys.stdout = _Tee(sys.stdout, _LOG_FILE)
            sys.stderr = _Tee(sys.stderr, _LOG_FILE)
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logging.getLogger("orchestrator").addHandler(handler)
            logging.getLogger("orchestrator").setLevel(logging.INFO)
        except OSError:
            pass  # logs still reach Ray's own worker log files


def _flush_logs() -> None:
    if _LOG_FILE is not None:
        _LOG_FILE.flush()


def local_log_dir(run_uri: str) -> str | None:
    """Worker logs go to <run_dir>/logs when the run directory is on a local or shared filesystem."""
    loc = storage.resolve(run_uri)
    return os.path.join(loc.path, "logs") if loc.is_local else None
