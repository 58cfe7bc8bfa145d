"""Several checkpoint sources asked nearest first: the resume choice takes the newest step every rank
can get, and each part comes from the nearest source that holds it intact.

The nearer source is this file's own `NodeMemory`, a stand-in for the in-memory tier (a node's
memory holds only its own ranks' parts, so it is not the same on every rank); behind it, the
store on real files.
"""

from __future__ import annotations

import hashlib
import logging

import pytest

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest
from orchestrator.checkpoint.info import CheckpointInfo
from orchestrator.checkpoint.manifest import FileEntry
from orchestrator.checkpoint.nearest import NearestFirst, newest_every_rank_can_get
from orchestrator.checkpoint.source import CheckpointSource, Holding, Keep, NotHeld, Restored
from orchestrator.checkpoint.store import CorruptCheckpoint, step_dir_name
from orchestrator.checkpoint.store_source import StoreSource
from orchestrator.rank.session import choose_resume_point


def manifest(step: int, files: dict[str, FileEntry]) -> Manifest:
    return Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=2, kind="torch", files=files)


def entry(data: bytes) -> FileEntry:
    return FileEntry(size=len(data), sha256=hashlib.sha256(data).hexdigest())


class NodeMemory(CheckpointSource):
    """One node's memory: the parts it was given, by step, each checked against the manifest
    made when it was given them. A checkpoint keeps its storage name."""

    name = "memory"
    same_on_every_rank = False

    def __init__(self, store: CheckpointStore, parts: dict[int, dict[str, bytes]]):
        self.root, self.parts = store.root, parts
        self.manifests = {step: manifest(step, {f: entry(b) for f, b in files.items()}) for step, files in parts.items()}

    def info(self, step: int) -> CheckpointInfo:
        name = step_dir_name(step)
        return CheckpointInfo(name, self.root.join(name), step, "committed", self.manifests[step])

    def holding(self) -> Holding:
        return Holding({step: self.info(step) for step in self.parts})

    def open(self, uri: str, keep: Keep | None = None, *, verify_all: bool = True) -> Restored:
        step = int(uri.rstrip("/").rsplit("step-", 1)[1])
        if step not in self.parts:
            raise NotHeld(f"{uri}: not in this node's memory")
        info = self.info(step)
        return Restored(info, {f: self.read(info, f) for f in self.parts[step] if keep is None or keep(f)}, self.name)

    def read(self, info: CheckpointInfo, fname: str) -> bytes:
        data = self.parts.get(info.step, {}).get(fname)
        if data is None:
            raise NotHeld(f"{info.uri}/{fname}: not in this node's memory")
        if entry(data) != self.manifests[info.step].files[fname]:
            raise CorruptCheckpoint(info.name, f"file '{fname}' fails its sha256 check")
        return data


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    """Storage holds steps 10 and 20 (30 and 40 were taken since, and are in memory only)."""
    store = CheckpointStore(storage.resolve(str(tmp_path / "run")))
    for step in (10, 20):
        store.commit(manifest(step, {}), {"state.pt": f"stored {step}".encode()})
    return store


def memory_of(store: CheckpointStore, *steps: int) -> NodeMemory:
    return NodeMemory(store, {step: {"state.pt": f"in memory {step}".encode()} for step in steps})


def test_the_newest_step_is_one_every_rank_gets_from_a_shared_source_or_from_its_own():
    assert newest_every_rank_can_get({10, 20}, [{30, 40}, {30}]) == 30
    assert newest_every_rank_can_get({10, 20}, [{30, 40}, {40}]) == 40
    assert newest_every_rank_can_get({10, 20}, [{30, 40}, set()]) == 20
    assert newest_every_rank_can_get({10, 20}, None) == 20
    assert newest_every_rank_can_get(set(), [{30}, {40}]) is None


def test_the_resume_choice_takes_the_newest_step_every_rank_can_get_across_two_sources(store):
    # Rank 0's node kept steps 20, 30 and 40; rank 1's node, lost since step 30's copy, 30 only.
    rank0 = NearestFirst([memory_of(store, 20, 30, 40), StoreSource(store)])
    rank1 = NearestFirst([memory_of(store, 30), StoreSource(store)])
    assert not rank0.same_on_every_rank, "a node's memory is gathered over the ranks"

    gathered = [rank0.local_steps(), rank1.local_steps()]
    newest = rank0.newest_every_rank_can_get(gathered)

    assert gathered == [[20, 30, 40], [30]]
    assert newest.step == 30 and newest.uri == store.root.join("step-000000030").uri
    # Without rank 1's memory, step 30 is rank 0's alone: storage's newest is the one they share.
    assert rank0.newest_every_rank_can_get([[20, 30, 40], []]).step == 20


def test_each_step_is_opened_from_the_nearest_source_that_holds_it(store, caplog):
    sources = NearestFirst([memory_of(store, 20, 30), StoreSource(store)])
    named = {step: store.root.join(step_dir_name(step)).uri for step in (10, 20, 30)}

    with caplog.at_level(logging.WARNING):
        opened = {step: sources.open(uri) for step, uri in named.items()}

    assert {step: (r.source, r.files["state.pt"]) for step, r in opened.items()} == {
        10: ("storage", b"stored 10"), 20: ("memory", b"in memory 20"), 30: ("memory", b"in memory 30")}
    assert caplog.records == [], "a step the memory does not hold is no fault of it"


def test_a_memory_part_that_fails_its_check_is_read_from_storage_with_a_warning_naming_it(store, caplog):
    memory = memory_of(store, 20)
    memory.parts[20]["state.pt"] = b"a flipped bit"
    sources = NearestFirst([memory, StoreSource(store)])
    uri = store.root.join("step-000000020").uri

    with caplog.at_level(logging.WARNING):
        restored = sources.open(uri)

    assert restored.source == "storage" and restored.files["state.pt"] == b"stored 20"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "memory" in warned and uri in warned and "sha256" in warned
    # A part read later goes the same way: past the corrupt copy, to storage's.
    assert sources.read(restored.info, "state.pt") == b"stored 20"


def test_rank_0s_resume_point_reads_the_step_from_the_nearest_source(store):
    sources = NearestFirst([memory_of(store, 30), StoreSource(store)])

    point = choose_resume_point(store, store.root.join("step-000000030").uri, source=sources)

    assert point.error is None and point.fallback_cause is None
    assert point.restored.source == "memory" and point.restored.files["state.pt"] == b"in memory 30"
