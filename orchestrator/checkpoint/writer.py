"""Background checkpoint writes: the training loop waits only for an in-memory snapshot.

Serialisation, checksums, upload and commit run on one background thread, with at most one
write in flight: a new save first waits for the previous one. A failure in the background is
kept and raised in the training loop at the next save or at `close()`, so it reaches the driver.

The thread lives as long as the writer. One thread per save would cost memory: glibc gives each
new thread a malloc arena of its own, and every arena keeps the read-back's freed buffers, so
the process would grow with every save (bench/README.md, "Commit latency and rank 0's memory").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from orchestrator.checkpoint.files import Payload
from orchestrator.checkpoint.manifest import Manifest
from orchestrator.checkpoint.store import CheckpointInfo, CheckpointStore
from orchestrator.errors import OrchestratorError, UserError


class BackgroundWriteFailed(OrchestratorError, RuntimeError):
    """A background checkpoint write failed; its cause is the error (failures.py classifies the run
    by the cause: a full disk is the user's, a storage error the infrastructure's)."""


class AsyncCheckpointWriter:
    def __init__(self, store: CheckpointStore, *, asynchronous: bool = True,
                 on_commit: Callable[[CheckpointInfo], None] | None = None):
        self.store = store
        self.asynchronous = asynchronous
        self.on_commit = on_commit
        self._thread: threading.Thread | None = None
        self._writes: queue.SimpleQueue[Callable[[], CheckpointInfo | None] | None] = queue.SimpleQueue()
        self._idle = threading.Event()  # set while no write is queued or in flight
        self._idle.set()
        self._error: BaseException | None = None
        # Seconds the caller was blocked inside save() (snapshot + waiting for the previous write).
        self.blocked_seconds = 0.0
        self.last_committed: CheckpointInfo | None = None

    def save(self, manifest: Manifest, build_files: Callable[[], dict[str, Payload]]) -> None:
        """Commit a checkpoint. `build_files` names the files of an already-taken snapshot (bytes or Serialized states).

        The caller must pass a snapshot that later training steps cannot change (tensors cloned).
        """
        self._submit(lambda: self.store.commit(manifest, build_files()))

    def save_shard(self, manifest: Manifest, token: str, rank: int,
                   build_files: Callable[[], dict[str, Payload]]) -> None:
        """Write this rank's shard of a sharded checkpoint; on rank 0, then commit once all are there.

        Every rank of the save calls it with the same `token`.
        """
        def write() -> CheckpointInfo | None:
            self.store.write_shard(manifest.step, token, rank, build_files())
            return self.store.commit_shards(manifest, token) if rank == 0 else None

        self._submit(write)

    def _submit(self, write: Callable[[], CheckpointInfo | None]) -> None:
        start = time.perf_counter()
        self.wait()
        if not self.asynchronous:
            self._write(write)
            self.blocked_seconds += time.perf_counter() - start
            self._raise_if_failed()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="checkpoint-writer", daemon=True)
            self._thread.start()
        self._idle.clear()
        self._writes.put(write)
        self.blocked_seconds += time.perf_counter() - start

    def _serve(self) -> None:
        while (write := self._writes.get()) is not None:
            self._write(write)
            self._idle.set()

    def _write(self, write: Callable[[], CheckpointInfo | None]) -> None:
        try:
            info = write()
            if info is None:
                return
            if info.status == "committed":  # not one that failed to read back
                self.last_committed = info
            if self.on_commit is not None:
                self.on_commit(info)
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised on the training thread
            self._error = exc

    def wait(self) -> None:
        """Block until the write in flight (if any) is committed; raise its error if it failed."""
        self._idle.wait()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, UserError):  # e.g. StorageFull: its own message says what to do
                raise error
            raise BackgroundWriteFailed(
                f"a background checkpoint write failed: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        """Wait for the write in flight (raising its error), then end the background thread."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._writes.put(None)
                self._thread.join()
                self._thread = None
