"""A storage error while reading a checkpoint is not a corrupt checkpoint (issue 32, item 5).

The defect these tests pin: any OSError reading the newest checkpoint made it corrupt. Rank 0
read it twice (the checkpoint wanted, then the newest that verifies), so one EIO or S3 throttle
on each read made it fall back to an older checkpoint and supersede the healthy newer ones for
good. Now only a verified fault (a checksum, a missing file, a manifest that does not decode)
does that; a storage error is retried, and if it lasts the start fails as infrastructure with
nothing set aside.

The storage here is the real local filesystem behind a pyarrow `PyFileSystem` whose handler
raises OSError(EIO) on the first N opens of one file: a fault of the store's dependency only.
"""

from __future__ import annotations

import errno
import glob
import pickle

import pyarrow.fs as pafs
import pytest
from local_fs_handler import LocalThroughPython

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest, dumps_state, files, loads_state
from orchestrator.checkpoint.files import CheckpointUnreadable
from orchestrator.checkpoint.manifest import MANIFEST_NAME, SUPERSEDED_NAME
from orchestrator.failures import INFRASTRUCTURE, WorkerFailure, classify
from orchestrator.rank.session import choose_resume_point
from orchestrator.storage import Location

EVERY_TIME = 10**9


def eio(path: str) -> OSError:
    return OSError(errno.EIO, "Input/output error", path)


def s3_throttled(path: str) -> OSError:
    """What pyarrow's S3 filesystem raises when S3 keeps answering 503 SlowDown: no errno."""
    return OSError(f"When reading information for key '{path}': AWS Error SLOW_DOWN during GetObject "
                   "operation: Please reduce your request rate.")


class FlakyFiles(LocalThroughPython):
    """The local filesystem, except that opening a file whose path ends with `suffix` raises
    `error(path)` (EIO by default) the first `failures` times (EVERY_TIME: always)."""

    def __init__(self, suffix: str = "", failures: int = 0, error=eio):
        super().__init__()
        self.suffix, self.failures, self.error, self.opens = suffix, failures, error, 0

    def before_read(self, path: str) -> None:
        if self.suffix and path.endswith(self.suffix):
            self.opens += 1
            if self.opens <= self.failures:
                raise self.error(path)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Waits of 0.01, 0.02 and 0.04 s: four tries, then the read fails."""
    monkeypatch.setattr(files, "READ_RETRY_FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(files, "READ_RETRY_BUDGET_S", 0.1)


@pytest.fixture
def run(tmp_path) -> str:
    """A run with checkpoints at steps 10, 20 and 30, written to the local filesystem."""
    location = str(tmp_path / "run")
    store = CheckpointStore(storage.resolve(location))
    for step in (10, 20, 30):
        manifest = Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=1, kind="torch", files={})
        store.commit(manifest, {"state.pt": dumps_state({"step": step})})
    return location


def flaky_store(run: str, handler: FlakyFiles) -> CheckpointStore:
    """The same run, read through `handler` (its checkpoints keep the same URIs)."""
    return CheckpointStore(Location(pafs.PyFileSystem(handler), run, run))


def newest(run: str):
    return CheckpointStore(storage.resolve(run)).committed()[-1]


def assert_nothing_set_aside(run: str) -> None:
    store = CheckpointStore(storage.resolve(run))
    assert [(i.step, i.status) for i in store.scan()] == [(10, "committed"), (20, "committed"), (30, "committed")]
    assert store.latest_committed().info.step == 30
    assert glob.glob(f"{run}/checkpoints/*/{SUPERSEDED_NAME}") == []


def test_a_storage_error_on_the_newest_checkpoint_is_retried_and_the_newest_is_resumed(run):
    handler = FlakyFiles("step-000000030/state.pt", failures=2)
    wanted = newest(run).uri

    point = choose_resume_point(flaky_store(run, handler), wanted)

    assert point.error is None and point.fallback_cause is None
    assert point.uri == wanted and point.restored.info.step == 30
    assert loads_state(point.restored.files["state.pt"], source="test") == {"step": 30}
    assert handler.opens == 3  # two failures, then the read that worked
    assert_nothing_set_aside(run)


@pytest.mark.parametrize("error,text", [(eio, "Input/output error"), (s3_throttled, "SLOW_DOWN")],
                         ids=["EIO", "S3 throttling"])
def test_a_storage_error_that_lasts_fails_the_start_as_infrastructure_and_sets_nothing_aside(run, error, text):
    handler = FlakyFiles("step-000000030/state.pt", failures=EVERY_TIME, error=error)
    store = flaky_store(run, handler)
    wanted = newest(run).uri

    point = choose_resume_point(store, wanted)

    assert point.restored is None and point.fallback_cause is None
    assert point.uri == wanted, "the failed start names the checkpoint wanted, not an older one"
    assert wanted in point.error and "failed 4 times" in point.error
    assert text in point.error and "not skipped or set aside" in point.error
    assert_nothing_set_aside(run)

    # The store's own error: classified as infrastructure (retried against failure.max_failures),
    # whole after crossing a process boundary, never a CheckpointError (a user error: "corrupt").
    with pytest.raises(CheckpointUnreadable) as raised:
        store.open_uri(wanted)
    assert classify(raised.value) == INFRASTRUCTURE
    record = WorkerFailure.from_exception(raised.value, rank=0, step=30).record
    assert record.kind == INFRASTRUCTURE and not record.signature  # never judged by its step
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)
    # Storage answers again: the same checkpoint loads.
    handler.failures = 0
    assert choose_resume_point(store, wanted).restored.info.step == 30


def test_a_checksum_mismatch_still_falls_back_and_sets_the_later_checkpoints_aside(run):
    wanted = newest(run)
    path = f"{wanted.location.path}/state.pt"
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    store = CheckpointStore(storage.resolve(run))

    point = choose_resume_point(store, wanted.uri)

    assert point.error is None and point.restored.info.step == 20
    assert "sha256" in point.fallback_cause
    assert [(i.step, i.status) for i in store.scan()] == [(10, "committed"), (20, "committed"), (30, "superseded")]
    assert store.latest_committed().info.step == 20


def test_a_storage_error_reading_a_manifest_is_retried_and_never_taken_for_a_corrupt_one(run):
    handler = FlakyFiles(f"step-000000030/{MANIFEST_NAME}", failures=2)
    store = flaky_store(run, handler)

    selection = store.latest_committed()

    assert selection.info.step == 30 and selection.skipped == []
    # A manifest storage never returns stops the listing: listed as corrupt, retention would
    # delete the checkpoints before it and a fallback would pass over it.
    handler.opens, handler.failures = 0, EVERY_TIME
    with pytest.raises(CheckpointUnreadable, match="step-000000030"):
        store.scan()
    assert_nothing_set_aside(run)


def test_verify_reports_a_checkpoint_storage_will_not_return_as_unreadable_not_corrupt(run):
    store = flaky_store(run, FlakyFiles("step-000000030/state.pt", failures=EVERY_TIME))

    checked = store.verify(store.scan()[-1])

    assert checked.status == "unreadable" and "Input/output error" in checked.problem
