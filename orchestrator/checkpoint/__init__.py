"""The checkpoint store: atomic commits with a checksummed manifest, on any pyarrow filesystem.

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
