"""The store as a checkpoint source: what every rank reads from shared storage (store.py).

Every rank sees the same store (the start checks that the run directory is shared, run_dir.py),
so rank 0's holding is every rank's and nothing is gathered for it.
"""

from __future__ import annotations

from orchestrator.checkpoint.info import CheckpointInfo
from orchestrator.checkpoint.source import CheckpointSource, Holding, Keep, Restored
from orchestrator.checkpoint.store import CheckpointStore


class StoreSource(CheckpointSource):
    name = "storage"
    same_on_every_rank = True

    def __init__(self, store: CheckpointStore):
        self.store = store

    def holding(self) -> Holding:
        committed, skipped = self.store.committed_and_skipped()
        return Holding({info.step: info for info in committed}, skipped)

    def open(self, uri: str, keep: Keep | None = None, *, verify_all: bool = True) -> Restored:
        info, files = self.store.open_uri(uri, keep, verify_all=verify_all)
        return Restored(info, files, self.name)

    def read(self, info: CheckpointInfo, fname: str) -> bytes:
        return self.store.read_files(info, fname.__eq__, verify_all=False)[fname]
