"""The checkpoint store: atomic commits, verification with fallback, retention, safe loading, S3."""

from __future__ import annotations

import json
import os
import pickle
import time

import pytest
import torch

from orchestrator import storage
from orchestrator.checkpoint import AsyncCheckpointWriter, CheckpointStore, Manifest, dumps_state, loads_state
from orchestrator.checkpoint.store import TMP_PREFIX
from orchestrator.errors import CheckpointError


def manifest(step: int) -> Manifest:
    return Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=2, kind="torch", files={})


def commit(store: CheckpointStore, step: int):
    state = {"w": torch.full((4,), float(step)), "step": step}
    return store.commit(manifest(step), {"state.pt": dumps_state(state)})


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(storage.resolve(str(tmp_path / "run")))


def loaded_step(store) -> int:
    selection = store.latest_loadable()
    return loads_state(selection.files["state.pt"], source="test")["step"]


def test_committed_checkpoints_are_listed_oldest_first_with_their_manifest(store):
    for step in (10, 20, 30):
        commit(store, step)
    infos = store.scan()
    assert [i.step for i in infos] == [10, 20, 30]
    assert all(i.status == "committed" for i in infos)
    assert infos[-1].manifest.files["state.pt"].size > 0
    assert "torch" in infos[-1].manifest.versions
    assert loaded_step(store) == 30


def _corrupt_truncate(info):
    path = os.path.join(info.location.path, "state.pt")
    with open(path, "r+b") as f:
        f.truncate(10)


def _corrupt_flip_byte(info):
    path = os.path.join(info.location.path, "state.pt")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _corrupt_remove_manifest(info):
    os.remove(os.path.join(info.location.path, "manifest.json"))


def _corrupt_garble_manifest(info):
    with open(os.path.join(info.location.path, "manifest.json"), "w") as f:
        f.write("{not json")


@pytest.mark.parametrize("corrupt,status,reason", [
    (_corrupt_truncate, "corrupt", "has 10 bytes, manifest says"),
    (_corrupt_flip_byte, "committed", "fails its sha256 check"),  # sizes match: only the checksum finds it
    (_corrupt_remove_manifest, "partial", "no manifest"),
    (_corrupt_garble_manifest, "corrupt", "unreadable manifest"),
], ids=["truncated file", "flipped byte", "missing manifest", "unreadable manifest"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_one_used(store, corrupt, status, reason):
    commit(store, 10)
    newest = commit(store, 20)
    corrupt(newest)
    assert store.scan()[-1].status == status
    selection = store.latest_loadable()
    assert selection.info.step == 10
    assert len(selection.skipped) == 1 and "step-000000020" in selection.skipped[0]
    assert reason in selection.skipped[0]
    with pytest.raises(CheckpointError) as info:
        store.open_uri(newest.uri)
    assert newest.uri in str(info.value) and reason in str(info.value) and "Fix" in str(info.value)
    # the previous, intact checkpoint opens by its URI
    assert store.open_uri(store.scan()[0].uri)[0].step == 10


def test_an_uncommitted_temporary_folder_is_never_taken_for_a_checkpoint(store):
    commit(store, 10)
    tmp = os.path.join(store.root.path, f"{TMP_PREFIX}step-000000020-abcd")
    os.makedirs(tmp)
    open(os.path.join(tmp, "state.pt"), "wb").write(b"half written")
    assert [i.status for i in store.scan()] == ["committed", "partial"]
    assert store.latest_loadable().info.step == 10


def test_verify_finds_a_flipped_byte(store):
    info = commit(store, 10)
    _corrupt_flip_byte(info)
    assert store.verify(store.scan()[0]).status == "corrupt"


def test_a_rank_keeps_only_its_own_shard_but_a_damaged_shard_of_another_rank_still_fails_it(store):
    files = {f"state-{r}.pt": dumps_state({"rank": torch.tensor(r)}) for r in range(3)}
    info = store.commit(manifest(10), files)
    kept = store.read_files(info, keep={"state-1.pt"}.__contains__)
    assert list(kept) == ["state-1.pt"]
    with open(os.path.join(info.location.path, "state-2.pt"), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    # Every rank reaches the same verdict on the checkpoint, whichever file it keeps.
    assert store.latest_loadable(keep={"state-1.pt"}.__contains__).info is None


def test_resume_from_a_missing_uri_is_a_clear_error(store, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint folder exists"):
        store.open_uri(str(tmp_path / "run" / "checkpoints" / "step-000000999"))


def test_keep_last_keeps_exactly_the_newest_k_and_stale_partials_go(store):
    for step in (10, 20, 30, 40, 50):
        commit(store, step)
    os.makedirs(os.path.join(store.root.path, f"{TMP_PREFIX}step-000000015-dead"))
    deleted = store.retain(keep_last=2).deleted
    assert [i.step for i in store.scan()] == [40, 50]
    assert sorted(i.step for i in deleted) == [10, 15, 20, 30]


def test_retention_never_deletes_the_newest_committed_checkpoint(store):
    commit(store, 10)
    store.retain(keep_last=1)
    store.retain(keep_last=1)
    assert [i.step for i in store.committed()] == [10]


def test_a_pickled_object_is_refused_on_load():
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    data = pickle.dumps({"model": Evil()})
    with pytest.raises(CheckpointError) as info:
        loads_state(data, source="evil.pt")
    assert "evil.pt" in str(info.value) and "arbitrary code" in str(info.value)


def test_the_async_writer_returns_before_the_write_and_surfaces_background_failures(store):
    writer = AsyncCheckpointWriter(store, asynchronous=True)
    writer.save(manifest(10), lambda: {"state.pt": dumps_state({"x": torch.zeros(3)})})
    writer.wait()
    assert [i.step for i in store.committed()] == [10]

    def explode():
        raise OSError("disk full")

    writer.save(manifest(20), explode)
    with pytest.raises(RuntimeError, match="disk full"):
        writer.close()
    assert [i.step for i in store.committed()] == [10]


def test_sharded_async_writes_commit_on_rank_0_once_the_other_rank_wrote_its_shard(store):
    rank0, rank1 = AsyncCheckpointWriter(store), AsyncCheckpointWriter(store)
    sharded = manifest(10)
    sharded.sharded = True
    rank0.save_shard(sharded, "tok", 0, lambda: {"state-0.pt": dumps_state({"x": torch.zeros(3)})})
    # Rank 0's shard is whole once its receipt exists; without rank 1's the checkpoint must not.
    receipt = os.path.join(store.root.path, f"{TMP_PREFIX}step-000000010-tok", "shard-00000-tok.json")
    deadline = time.monotonic() + 30
    while not os.path.exists(receipt) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(receipt), "rank 0 never wrote its shard"
    assert store.committed() == [] and store.latest_loadable().info is None
    assert rank0.last_committed is None, "rank 0 must still be waiting for rank 1's shard"
    rank1.save_shard(sharded, "tok", 1, lambda: {"state-1.pt": dumps_state({"x": torch.ones(3)})})
    rank1.close()
    rank0.close()
    (info,) = store.committed()
    assert info.manifest.sharded and sorted(info.manifest.files) == ["state-0.pt", "state-1.pt"]
    assert rank0.last_committed.uri == info.uri and rank1.last_committed is None


def test_the_store_works_the_same_on_s3(s3_server):
    uri = s3_server.format(prefix="store-test/run")
    store = CheckpointStore(storage.resolve(uri))
    for step in (10, 20, 30):
        commit(store, step)
    assert [i.status for i in store.scan()] == ["committed"] * 3
    assert loaded_step(store) == 30
    newest = store.scan()[-1]
    newest.location.fs.delete_file(newest.location.join("manifest.json").path)
    assert store.scan()[-1].status == "partial"
    assert loaded_step(store) == 20
    store.retain(keep_last=1)
    assert [i.step for i in store.committed()] == [20]
    assert json.loads(storage.read_bytes(store.committed()[0].location.join("manifest.json")))["step"] == 20


def test_keep_best_keeps_the_best_k_by_the_monitored_metric_on_top_of_keep_last(store):
    losses = {10: 0.9, 20: 0.3, 30: 0.5, 40: 0.1, 50: 0.8, 60: 0.7}
    for step, loss in losses.items():
        m = manifest(step)
        m.metrics = {"val_loss": loss}
        store.commit(m, {"state.pt": dumps_state({"step": step})})
    store.retain(keep_last=1, keep_best=(2, "val_loss", "min"))
    assert [i.step for i in store.committed()] == [20, 40, 60]
    store.retain(keep_last=1, keep_best=(1, "val_loss", "max"))
    assert [i.step for i in store.committed()] == [60]  # the best of 20, 40, 60 by max is 60 itself


def _sharded_save(store, world_size: int, writing_ranks, timeout_s: float):
    import threading

    m = Manifest(step=7, epoch=0, batch_in_epoch=7, world_size=world_size, kind="torch", files={})
    threads = [threading.Thread(target=store.write_shard,
                                args=(7, "tok", r, {f"shard-{r}.pt": dumps_state({"rank": r, "w": torch.ones(3) * r})}))
               for r in writing_ranks]
    for t in threads:
        t.start()
    try:
        return store.commit_shards(m, "tok", timeout_s=timeout_s, poll_s=0.05)
    finally:
        for t in threads:
            t.join()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_sharded_checkpoint_commits_only_when_every_rank_wrote_its_shard(store, s3_server, where):
    if where == "s3":
        store = CheckpointStore(storage.resolve(s3_server.format(prefix=f"sharded-{os.getpid()}/run")))
    with pytest.raises(TimeoutError, match="shard-00002"):
        _sharded_save(store, 4, [0, 1, 3], timeout_s=1.0)
    assert store.committed() == []
    assert store.latest_loadable().info is None
    info = _sharded_save(store, 4, [0, 1, 2, 3], timeout_s=30)
    files = store.read_files(store.committed()[-1])
    assert info.step == 7 and sorted(files) == [f"shard-{r}.pt" for r in range(4)]
    assert loads_state(files["shard-2.pt"], source="t")["rank"] == 2


def test_a_shard_receipt_seen_while_it_is_still_being_written_is_waited_for(store):
    """On a local filesystem a receipt exists, empty, from its creation to its last byte: rank 0
    must wait for it to be whole (it once failed the save with a JSONDecodeError)."""
    import threading

    m = Manifest(step=7, epoch=0, batch_in_epoch=7, world_size=2, kind="torch", files={})
    store.write_shard(7, "tok", 0, {"shard-0.pt": dumps_state({"rank": 0})})
    staging = os.path.join(store.root.path, f"{TMP_PREFIX}step-000000007-tok")
    receipt = os.path.join(staging, "shard-00001-tok.json")
    open(receipt, "wb").close()  # rank 1 has created its receipt, not yet written it

    def rank_1_finishes():
        time.sleep(0.5)
        store.write_shard(7, "tok", 1, {"shard-1.pt": dumps_state({"rank": 1})})

    writer = threading.Thread(target=rank_1_finishes)
    writer.start()
    try:
        info = store.commit_shards(m, "tok", timeout_s=30, poll_s=0.05)
    finally:
        writer.join()
    assert info.status == "committed"
    assert sorted(store.read_files(store.committed()[-1])) == ["shard-0.pt", "shard-1.pt"]


def test_a_second_save_of_a_committed_step_keeps_the_committed_checkpoint(store):
    first = commit(store, 10)
    before = open(os.path.join(first.location.path, "manifest.json"), "rb").read()
    again = store.commit(manifest(10), {"state.pt": dumps_state({"w": torch.zeros(2), "step": -1})})
    assert again.uri == first.uri
    assert open(os.path.join(first.location.path, "manifest.json"), "rb").read() == before
    assert loaded_step(store) == 10
    assert not [n for n in os.listdir(store.root.path) if n.startswith(TMP_PREFIX)], "no staging left behind"


def test_an_interrupted_write_at_the_same_step_is_replaced_by_the_next_commit(store):
    leftover = os.path.join(store.root.path, "step-000000010")
    os.makedirs(leftover)
    open(os.path.join(leftover, "state.pt"), "wb").write(b"half written")
    assert [i.status for i in store.scan()] == ["partial"]
    commit(store, 10)
    assert [i.status for i in store.scan()] == ["committed"]
    assert loaded_step(store) == 10


def test_paths_and_enums_in_hyperparameters_are_saved_as_plain_values_and_anything_unsafe_is_named_at_save():
    import collections
    import enum
    import pathlib

    from orchestrator.checkpoint.serialization import UnsafeCheckpointValue, plain_state

    class Mode(enum.Enum):
        FAST = "fast"

    class Level(enum.IntEnum):  # an int too (as DeepSpeed's ZeroStageEnum): still pickled as its class
        HIGH = 3

    point = collections.namedtuple("point", "x y")
    state = {"hyper_parameters": collections.defaultdict(int, root=pathlib.Path("/data/x"), mode=Mode.FAST,
                                                         at=point(1, 2), level=Level.HIGH),
             "state_dict": collections.OrderedDict(w=torch.ones(2))}
    loaded = loads_state(dumps_state(plain_state(state)), source="test")  # weights_only=True
    assert loaded["hyper_parameters"] == {"root": "/data/x", "mode": "fast", "at": (1, 2), "level": 3}
    assert type(loaded["hyper_parameters"]["level"]) is int
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(2))

    with pytest.raises(UnsafeCheckpointValue, match=r"checkpoint\.hyper_parameters\.loss_fn = .*save_hyperparameters"):
        plain_state({"hyper_parameters": {"loss_fn": torch.nn.MSELoss()}})


def test_a_rank_whose_receipt_lets_rank_0_commit_at_once_does_not_fail_on_the_renamed_folder(store, monkeypatch):
    # Rank 0 renames the staging folder into place as soon as it sees the last receipt; the rank
    # that wrote that receipt must not touch the folder afterwards (it once fsynced it: ENOENT).
    import orchestrator.checkpoint.store as store_module

    sharded = Manifest(step=7, epoch=0, batch_in_epoch=7, world_size=2, kind="torch", files={})
    real_write_file = store_module.write_file

    def write_then_rank_0_commits(loc, payload, **kwargs):
        entry = real_write_file(loc, payload, **kwargs)
        if loc.path.endswith("shard-00001-tok.json"):
            store.commit_shards(sharded, "tok", timeout_s=5)
        return entry

    store.write_shard(7, "tok", 0, {"shard-0.pt": dumps_state({"rank": 0})})
    monkeypatch.setattr(store_module, "write_file", write_then_rank_0_commits)
    store.write_shard(7, "tok", 1, {"shard-1.pt": dumps_state({"rank": 1})})
    (info,) = store.committed()
    assert sorted(store.read_files(info)) == ["shard-0.pt", "shard-1.pt"]
