"""The checkpoints of a run: atomic commits with a checksummed manifest on any pyarrow filesystem,
the sources a rank restores from, and the run's writer lease. Runs in the driver (choosing,
listing) and in the ranks (saving, restoring).

    store.py          the commit protocol: reading, committing, sharded commits, branches, deleting
    info.py           what the store knows of one checkpoint folder: name, step, status, manifest
    manifest.py       what a checkpoint holds and how to check it; written last, its presence commits
    files.py          files written as a stream, hashed on the way, fsynced, read back with retries
    names.py          the names of the state files, for both harnesses
    serialization.py  state to bytes and back, never unpickling arbitrary objects
    writer.py         background writes: the training loop waits only for its snapshot
    retention.py      which checkpoints retention may delete (keep_last, keep_best)
    phases.py         the named points of a save, each a kill switch for tests
    source.py         the checkpoint-source interface: what a source holds, one step opened, verified
    store_source.py   the store as a source (the first implementation)
    nearest.py        a rank's sources asked nearest first, and the newest step every rank can get
    lease.py          one writer per run: claims, heartbeats, takeover, the fence every commit checks

The names below are loaded on first use, so that the lease (`orchestrator.checkpoint.lease`),
which a second driver checks before anything slow, is imported without torch.
"""

import importlib

_WHERE = {
    "Serialized": "files", "StorageFull": "files", "Manifest": "manifest", "dumps_state": "serialization",
    "loads_state": "serialization", "CheckpointInfo": "store", "CheckpointStore": "store",
    "AsyncCheckpointWriter": "writer", "CheckpointSource": "source", "Restored": "source", "NotHeld": "source",
    "StoreSource": "store_source", "NearestFirst": "nearest",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'orchestrator.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"orchestrator.checkpoint.{_WHERE[name]}"), name)
