"""The store as a checkpoint source, on real files: what it holds, and one step opened, verified."""

from __future__ import annotations

import os

import pytest

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest
from orchestrator.checkpoint.nearest import NearestFirst
from orchestrator.checkpoint.store import CorruptCheckpoint
from orchestrator.checkpoint.store_source import StoreSource
from orchestrator.errors import CheckpointError


def commit(store: CheckpointStore, step: int) -> None:
    manifest = Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=2, kind="torch", files={})
    store.commit(manifest, {"state.pt": f"state at {step}".encode(), "state-00001.pt": f"rank 1 at {step}".encode()})


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    store = CheckpointStore(storage.resolve(str(tmp_path / "run")))
    for step in (10, 20, 30):
        commit(store, step)
    return store


def truncate(store: CheckpointStore, step: int, fname: str = "state.pt") -> None:
    info = next(i for i in store.committed() if i.step == step)
    with open(os.path.join(info.location.path, fname), "r+b") as f:
        f.truncate(3)


def flip_a_byte(store: CheckpointStore, step: int, fname: str = "state.pt") -> None:
    info = next(i for i in store.committed() if i.step == step)
    path = os.path.join(info.location.path, fname)
    data = bytearray(open(path, "rb").read())
    data[0] ^= 0xFF
    open(path, "wb").write(bytes(data))


def test_the_store_holds_its_committed_steps_and_warns_of_each_newer_one_it_passes_over(store):
    truncate(store, 30)

    held = StoreSource(store).holding()

    assert held.steps == [10, 20] and held.newest.step == 20
    assert len(held.skipped) == 1 and "step-000000030" in held.skipped[0] and "bytes" in held.skipped[0]
    # The driver's own choice, as before the seam: the same newest and the same warnings.
    assert store.latest_committed().info.uri == held.newest.uri
    assert store.latest_committed().skipped == held.skipped


def test_a_corrupt_step_older_than_the_newest_is_not_held_and_not_warned_of(store):
    truncate(store, 10)

    held = StoreSource(store).holding()

    assert held.steps == [20, 30] and held.skipped == []


def test_opening_a_step_checks_every_file_and_holds_only_the_kept_ones(store):
    uri = store.committed()[-1].uri

    restored = StoreSource(store).open(uri, "state.pt".__eq__)

    assert restored.source == "storage" and restored.info.step == 30
    assert restored.files == {"state.pt": b"state at 30"}
    flip_a_byte(store, 30, "state-00001.pt")
    with pytest.raises(CheckpointError, match="state-00001.pt"):
        StoreSource(store).open(uri, "state.pt".__eq__)  # verify_all: the file not kept is checked too
    assert StoreSource(store).open(uri, "state.pt".__eq__, verify_all=False).files == {"state.pt": b"state at 30"}


def test_a_file_read_later_is_checked_against_its_checksum(store):
    source = StoreSource(store)
    restored = source.open(store.committed()[-1].uri, "state.pt".__eq__)

    assert source.read(restored.info, "state-00001.pt") == b"rank 1 at 30"
    flip_a_byte(store, 30, "state-00001.pt")
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        source.read(restored.info, "state-00001.pt")


def test_with_the_store_alone_nothing_is_gathered_and_its_errors_are_its_own(store, tmp_path):
    sources = NearestFirst([StoreSource(store)])

    assert sources.same_on_every_rank and sources.local_steps() == []
    assert sources.newest_every_rank_can_get().step == 30
    missing = str(tmp_path / "run" / "checkpoints" / "step-000000099")
    with pytest.raises(CheckpointError) as through_the_seam:
        sources.open(missing)
    with pytest.raises(CheckpointError) as from_the_store:
        store.open_uri(missing)
    assert str(through_the_seam.value) == str(from_the_store.value)
