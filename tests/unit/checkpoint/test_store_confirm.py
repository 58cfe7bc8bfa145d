"""A checkpoint whose read-back fails (orchestrator/checkpoint/store.py `confirm`): committed, but
storage will not return its manifest when the store reads it back. It is "unreadable", not
confirmed, so retention deletes nothing for it; the next checkpoint that reads back lets retention
go on as before.

The storage is the real local filesystem behind a pyarrow `PyFileSystem` (an object store to the
store: the manifest upload is the commit, then the read-back) whose handler raises OSError(EIO)
on every open of the new checkpoint's manifest while the test says so.
"""

from __future__ import annotations

import errno
import os

import pyarrow.fs as pafs
import pytest
import torch
from local_fs_handler import LocalThroughPython

from orchestrator.checkpoint import CheckpointStore, Manifest, Serialized, files
from orchestrator.storage import Location


class ManifestReadsFail(LocalThroughPython):
    """The local filesystem; while `failing` is set, opening a file whose path ends with it raises EIO."""

    def __init__(self):
        super().__init__()
        self.failing: str | None = None
        self.refused = 0

    def before_read(self, path: str) -> None:
        if self.failing and path.endswith(self.failing):
            self.refused += 1
            raise OSError(errno.EIO, "Input/output error", path)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """The read-back's retries in a fraction of a second: waits of 0.01, 0.02 and 0.04 s."""
    monkeypatch.setattr(files, "READ_RETRY_FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(files, "READ_RETRY_BUDGET_S", 0.1)


def manifest(step: int) -> Manifest:
    return Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=1, kind="torch", files={})


def state(step: int) -> Serialized:
    return Serialized({"w": torch.full((100,), float(step)), "step": step})


def folders(run: str) -> list[str]:
    """The checkpoint folders on disk, read with os.listdir (not the store's own listing)."""
    return sorted(name for name in os.listdir(os.path.join(run, "checkpoints")) if not name.startswith("."))


def test_a_commit_whose_read_back_fails_is_unreadable_and_retention_deletes_nothing_for_it(tmp_path):
    run = str(tmp_path / "run")
    handler = ManifestReadsFail()
    store = CheckpointStore(Location(pafs.PyFileSystem(handler), run, run))
    for step in (10, 20, 30):
        assert store.commit(manifest(step), {"state.pt": state(step)}).status == "committed"
        store.retain(keep_last=1)
    assert folders(run) == ["step-000000030"]

    handler.failing = "step-000000040/manifest.json"
    unreadable = store.commit(manifest(40), {"state.pt": state(40)})
    handler.failing = None  # storage answers again

    assert handler.refused >= 2, "the read-back was tried, and tried again"
    assert unreadable.status == "unreadable", unreadable
    assert "could not be read" in unreadable.problem and "Input/output error" in unreadable.problem
    assert unreadable.name not in store.verified
    # Committed all the same (its manifest is there), and the one before it kept: with keep_last 1,
    # a confirmed 40 would have made 30 redundant.
    assert os.path.exists(os.path.join(run, "checkpoints", "step-000000040", "manifest.json"))
    report = store.retain(keep_last=1)
    assert report.deleted == [] and report.problems == [], report
    assert folders(run) == ["step-000000030", "step-000000040"]

    # The next checkpoint that reads back intact makes both redundant.
    assert store.commit(manifest(50), {"state.pt": state(50)}).status == "committed"
    assert sorted(info.step for info in store.retain(keep_last=1).deleted) == [30, 40]
    assert folders(run) == ["step-000000050"]
