"""Checkpoint files on storage: written as a stream and hashed on the way, durable, checked back.

A state is serialised by `torch.save` straight into its file (`Serialized`), so saving holds no
copy of it beyond the snapshot. Local and shared filesystems get an fsync of every file before
the manifest that names it; object stores publish an object only once its upload completes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

from orchestrator import storage
from orchestrator.checkpoint.manifest import FileEntry
from orchestrator.errors import UserError
from orchestrator.storage import Location

CHUNK_BYTES = 8 << 20


class StorageFull(UserError):
    """A checkpoint could not be written because its filesystem is full. Retrying cannot help."""


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

    Read into one buffer, reused for every chunk: a new 8 MB bytes object per chunk left freed
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
