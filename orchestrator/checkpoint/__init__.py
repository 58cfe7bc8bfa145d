"""The checkpoint store: atomic commits with a checksummed manifest, on any pyarrow filesystem."""

from orchestrator.checkpoint.manifest import Manifest
from orchestrator.checkpoint.serialization import dumps_state, loads_state
from orchestrator.checkpoint.store import CheckpointInfo, CheckpointStore
from orchestrator.checkpoint.writer import AsyncCheckpointWriter

__all__ = ["AsyncCheckpointWriter", "CheckpointInfo", "CheckpointStore", "Manifest", "dumps_state", "loads_state"]
