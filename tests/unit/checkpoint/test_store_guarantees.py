"""What the store promises beyond a clean commit: one writer, retention after read-back,
problems as warnings, full disks, newer formats. Real files, real processes, a real small
filesystem; no Ray."""

from __future__ import annotations

import json
import os
import uuid

import pytest
import torch

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest, Serialized, StorageFull, lease
from orchestrator.checkpoint.lease import LeaseLost, RunLease
from orchestrator.checkpoint.manifest import NewerFormat
from orchestrator.run_dir import RunDir


def manifest(step: int) -> Manifest:
    return Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=1, kind="torch", files={})


def state(step: int, size: int = 1000) -> Serialized:
    return Serialized({"w": torch.full((size,), float(step)), "step": step})


def test_an_orphaned_writer_commits_and_deletes_nothing_after_a_takeover(tmp_path, monkeypatch):
    run_dir = RunDir.at(str(tmp_path / "run"))
    # The first driver runs on another host (a live driver on this one is never taken over: its
    # pid answers); its heartbeat stands still (it never started here).
    with monkeypatch.context() as other_host:
        other_host.setattr(lease.socket, "gethostname", lambda: "another-host")
        first = RunLease.acquire(run_dir)
    orphan = CheckpointStore(run_dir.location, fence=lambda: lease.fence(run_dir, first.generation, first.nonce))
    orphan.commit(manifest(1), {"state.pt": state(1)})
    orphan.commit(manifest(2), {"state.pt": state(2)})
    # A new driver that watched its heartbeat stand still for a TTL takes the run over.
    second = RunLease.acquire(run_dir, ttl_s=0.5)
    assert second.generation == first.generation + 1

    with pytest.raises(LeaseLost, match=f"generation {second.generation}"):
        orphan.commit(manifest(3), {"state.pt": state(3)})
    report = orphan.retain(keep_last=1)
    assert report.deleted == [] and "LeaseLost" in report.problems[0]
    current = CheckpointStore(run_dir.location, fence=second.check)
    assert [i.step for i in current.committed()] == [1, 2]
    assert not [n for n in os.listdir(current.root.path) if n.startswith(".tmp-")], "the orphan's staging is gone"
    second.release()


class _BitRotStore(CheckpointStore):
    """Storage that hands back something else than was written: one byte of each new file flips
    between the commit and the read-back (what a bad disk or a buggy mount does)."""

    def confirm(self, info):
        for fname in info.manifest.files:
            path = info.location.join(fname).path
            data = bytearray(open(path, "rb").read())
            data[len(data) // 2] ^= 0xFF
            open(path, "wb").write(bytes(data))
        return super().confirm(info)


def test_keep_last_1_never_deletes_the_only_good_checkpoint_for_a_newest_that_reads_back_wrong(tmp_path):
    loc = storage.resolve(str(tmp_path / "run"))
    good = CheckpointStore(loc)
    assert good.commit(manifest(1), {"state.pt": state(1)}).status == "committed"
    good.retain(keep_last=1)

    rotten = _BitRotStore(loc)
    bad = rotten.commit(manifest(2), {"state.pt": state(2)})
    assert bad.status == "corrupt" and "sha256" in bad.problem
    assert rotten.retain(keep_last=1).deleted == []
    latest = rotten.latest_verified()
    assert latest.info.step == 1 and "step-000000002" in latest.skipped[0]

    # The next checkpoint that reads back intact replaces both.
    assert good.commit(manifest(3), {"state.pt": state(3)}).status == "committed"
    deleted = good.retain(keep_last=1).deleted
    assert sorted(i.step for i in deleted) == [1, 2]
    assert [i.step for i in good.scan()] == [3]


def test_a_retention_listing_error_is_a_warning_and_the_next_pass_recovers(tmp_path):
    store = CheckpointStore(storage.resolve(str(tmp_path / "run")))
    store.commit(manifest(1), {"state.pt": state(1)})
    store.commit(manifest(2), {"state.pt": state(2)})
    # The checkpoints folder cannot be listed: here it is briefly a file in its place.
    aside = tmp_path / "aside"
    os.rename(store.root.path, aside)
    open(store.root.path, "w").close()
    report = store.retain(keep_last=1)
    assert report.deleted == [] and "listing" in report.problems[0]
    os.remove(store.root.path)
    os.rename(aside, store.root.path)
    assert [i.step for i in store.retain(keep_last=1).deleted] == [1]


def test_a_checkpoint_of_a_newer_format_is_a_clear_error_not_corrupt(tmp_path):
    store = CheckpointStore(storage.resolve(str(tmp_path / "run")))
    info = store.commit(manifest(1), {"state.pt": state(1)})
    path = info.location.join("manifest.json").path
    raw = json.loads(open(path).read())
    raw["format"] = 99
    open(path, "w").write(json.dumps(raw))
    with pytest.raises(NewerFormat, match=r"written by a newer orchestrator .*format 99"):
        store.latest_verified()


def test_a_full_disk_is_a_clear_error_and_leaves_the_committed_checkpoints_whole(small_filesystem):
    store = CheckpointStore(storage.resolve(str(small_filesystem / "run")))
    committed = []
    with pytest.raises(StorageFull) as caught:
        for step in range(1, 10):
            committed.append(store.commit(manifest(step), {"state.pt": state(step, size=200_000)}).step)
    message = str(caught.value)
    assert str(small_filesystem) in message and "the filesystem is full" in message
    assert "needs about 0.8 MB" in message and "Fix:" in message
    assert len(committed) >= 2
    assert [i.step for i in store.committed()] == committed
    for info in store.committed():
        assert store.verify(info).status == "committed"
    assert not [n for n in os.listdir(store.root.path) if n.startswith(".tmp-")], "the partial write was removed"


def test_an_object_store_commit_counts_only_this_saves_shard_receipts(s3_server):
    store = CheckpointStore(storage.resolve(s3_server.format(prefix=f"receipts-{uuid.uuid4().hex[:8]}/run")))
    sharded = Manifest(step=4, epoch=0, batch_in_epoch=4, world_size=2, kind="torch", files={}, sharded=True)
    # An aborted attempt at step 4 left both ranks' shards and receipts behind.
    for rank in range(2):
        store.write_shard(4, "aborted", rank, {f"shard-{rank}.pt": state(-1)})
    # This attempt: rank 0 has written; rank 1 has not yet. The commit must wait for it.
    store.write_shard(4, "current", 0, {"shard-0.pt": state(4)})
    with pytest.raises(TimeoutError, match="shard"):
        store.commit_shards(sharded, "current", timeout_s=1, poll_s=0.05)
    store.write_shard(4, "current", 1, {"shard-1.pt": state(4)})
    info = store.commit_shards(sharded, "current", timeout_s=10, poll_s=0.05)
    assert info.status == "committed" and store.verify(info).status == "committed"
