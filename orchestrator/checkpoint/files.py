"""Checkpoint files on storage: written as a stream and hashed on the way, durable, checked back.

A state is serialised by `torch.save` straight into its file (`Serialized`), so saving holds no
copy of it beyond the snapshot. Local and shared filesystems get an fsync of every file before
the manifest that names it; object stores publish an object only once its upload completes.

Reading a checkpoint back tells two failures apart (`read_retrying`). A file the manifest names
that is not there is a fact about the checkpoint. Any other storage error (EIO, a timeout, S3
throttling or a 5xx, which pyarrow raises as OSError) says nothing about it: the read is tried
again, and if storage never answers it fails as `CheckpointUnreadable`, which never makes a
checkpoint count as corrupt.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import torch

from orchestrator import storage
from orchestrator.checkpoint.manifest import FileEntry
from orchestrator.errors import UserError
from orchestrator.failures import TransientStartError
from orchestrator.storage import Location

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20

# A checkpoint read that fails with a storage error is tried again: first after this many
# seconds, each wait twice the one before...
READ_RETRY_FIRST_WAIT_S = 0.5
# ...until the waits would pass this many seconds in all (0.5 + 1 + 2 + 4 + 8: six tries over
# 15.5 s of waiting); then the read fails as CheckpointUnreadable (an infrastructure failure).
READ_RETRY_BUDGET_S = 30.0
# Errors that prove a file is not where its manifest says: a verified fault of the checkpoint,
# never retried. Every other OSError is the storage's, and is.
MISSING_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError)

T = TypeVar("T")


class StorageFull(UserError):
    """A checkpoint could not be written because its filesystem is full. Retrying cannot help."""


class CheckpointUnreadable(TransientStartError):
    """Storage failed every try to return a checkpoint's file (EIO, a timeout, S3 throttling).

    Not a verdict on the checkpoint: nothing is skipped or set aside for it. In a worker it is a
    start that could not read its checkpoint, so `failures.classify` calls it infrastructure
    whatever the storage's error was (retried against failure.max_failures, never judged the
    user's for coming back at the same step).
    """


@dataclass
class Serialized:
    """A state to be written with torch.save directly into its checkpoint file."""

    state: Any

    def approx_bytes(self) -> int:
        """The bytes of its tensors: about the size of the file it becomes."""
        total, stack = 0, [self.state]
        while stack:
            value = stack.pop()
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
            elif isinstance(value, dict):
                stack.extend(value.values())
            elif isinstance(value, (list, tuple)):
                stack.extend(value)
        return total


Payload = bytes | memoryview | Serialized


def payload_bytes(payload: Payload) -> int:
    return payload.approx_bytes() if isinstance(payload, Serialized) else len(payload)


class _HashingStream:
    """A write-only stream that counts and hashes what passes through it."""

    def __init__(self, out: BinaryIO, on_first_bytes: Callable[[], None] | None):
        self._out, self._on_first_bytes = out, on_first_bytes
        self.size = 0
        self._digest = hashlib.sha256()

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._out.write(view)
        self._digest.update(view)
        self.size += len(view)
        if self._on_first_bytes is not None:
            hook, self._on_first_bytes = self._on_first_bytes, None
            hook()
        return len(view)

    def flush(self) -> None:
        self._out.flush()

    @property
    def entry(self) -> FileEntry:
        return FileEntry(size=self.size, sha256=self._digest.hexdigest())


def write_file(loc: Location, payload: Payload, *, on_first_bytes: Callable[[], None] | None = None) -> FileEntry:
    """Write one file and return its size and sha256. Local files are fsynced before returning."""
    if loc.is_local:
        with open(loc.path, "wb") as out:
            entry = _write_into(out, payload, on_first_bytes)
            out.flush()
            os.fsync(out.fileno())
        return entry
    with loc.fs.open_output_stream(loc.path) as out:
        return _write_into(out, payload, on_first_bytes)


def _write_into(out: BinaryIO, payload: Payload, on_first_bytes: Callable[[], None] | None) -> FileEntry:
    stream = _HashingStream(out, on_first_bytes)
    if isinstance(payload, Serialized):
        torch.save(payload.state, stream)
    else:
        view = memoryview(payload).cast("B")
        for start in range(0, max(len(view), 1), CHUNK_BYTES):
            stream.write(view[start:start + CHUNK_BYTES])
    return stream.entry


def file_entry(loc: Location) -> FileEntry:
    """Size and sha256 of a stored file, streamed: the file is never held in memory whole.

    Read into one buffer, reused for every chunk: a new bytes object per chunk would leave freed
    chunks behind in the allocator's arenas after every read-back.
    """
    digest, size = hashlib.sha256(), 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with loc.fs.open_input_stream(loc.path) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
            size += n
    return FileEntry(size=size, sha256=digest.hexdigest())


def read_retrying(checkpoint_uri: str, what: str, read: Callable[..., T], *args: Any) -> T:
    """`read(*args)`, tried again after a storage error, with waits that double (READ_RETRY_*).

    A missing file (MISSING_ERRORS) and any error that is not an OSError (a checksum or a
    manifest that does not decode, found by the caller) pass through at once. An OSError on
    the last try becomes CheckpointUnreadable, naming `checkpoint_uri` and `what` was read.
    """
    waited, wait, attempts = 0.0, READ_RETRY_FIRST_WAIT_S, 1
    while True:
        try:
            return read(*args)
        except MISSING_ERRORS:
            raise
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            if waited + wait > READ_RETRY_BUDGET_S:
                raise CheckpointUnreadable(
                    f"checkpoint {checkpoint_uri} could not be read: {what} failed {attempts} times over "
                    f"{waited:.1f} s, the last time with {error}. This is an error of the storage (an I/O "
                    "error, a timeout, throttling), not a damaged checkpoint, so the checkpoint was not "
                    "skipped or set aside and every checkpoint after it is kept. Fix: make sure the storage "
                    "answers, then restart or resubmit the run (the same command) to resume from it."
                ) from exc
            log.warning("checkpoint %s: %s failed (%s); trying again in %.1f s", checkpoint_uri, what, error, wait)
        time.sleep(wait)
        waited, wait, attempts = waited + wait, wait * 2, attempts + 1


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in a local directory durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether an error, or one it was raised from (torch.save wraps the OSError), is a full disk."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def storage_full_error(step: int, where: Location, needed: int) -> StorageFull:
    free = ""
    if where.is_local:
        try:
            usage = shutil.disk_usage(where.path)
            free = f" ({_mb(usage.free)} free of {_mb(usage.total)})"
        except OSError:
            pass
    return StorageFull(
        f"checkpoint step {step} could not be written to {where.uri}: the filesystem is full{free} and the "
        f"checkpoint needs about {_mb(needed)}. The checkpoints committed before it are intact and the partial "
        "write was removed. Fix: free space there, keep fewer checkpoints (checkpoint.keep_last), or point "
        "storage at a larger filesystem or an object store; then run the same command again to resume."
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def remove_tree(path: str) -> list[str]:
    """Remove a local folder; returns what could not be removed (a later pass retries it)."""
    problems: list[str] = []
    shutil.rmtree(path, onerror=lambda _fn, p, exc_info: problems.append(f"{p}: {exc_info[1]}"))
    return problems


def discard(loc: Location) -> None:
    """Best-effort removal of an uncommitted write's leftovers (retention retries what stays)."""
    try:
        if loc.is_local:
            remove_tree(loc.path)
        elif storage.exists(loc):
            loc.fs.delete_dir(loc.path)
    except OSError:
        pass
