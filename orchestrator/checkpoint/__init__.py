"""The checkpoint store: atomic commits with a checksummed manifest, on any pyarrow filesystem."""

from orchestrator.checkpoint.files import Serialized, StorageFull
from orchestrator.checkpoint.manifest import Manifest
from orchestrator.checkpoint.serialization import dumps_state, loads_state
from orchestrator.checkpoint.store import CheckpointInfo, CheckpointStore
from orchestrator.checkpoint.writer import AsyncCheckpointWriter

__all__ = ["AsyncCheckpointWriter", "CheckpointInfo", "CheckpointStore", "Manifest", "Serialized", "StorageFull",
           "dumps_state", "loads_state"]
