"""A checkpoint another writer committed at the same step while this one was writing it
(orchestrator/checkpoint/store.py `_publish_local`): the one committed first is kept, whole, and
returned; this writer's own folder goes, and nothing is left half-replaced.

The other writer is a real process (forked from this one), on the same local run folder, that
commits the step to the end between this writer's check that the step is free and its rename into
place: it is started from this writer's fence (the lease check the store calls right before it
commits).
"""

from __future__ import annotations

import hashlib
import os

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest

STEP = 40
THEIRS = b"the other writer's state " * 400
MINE = b"this writer's state " * 500


def other_writer(run: str) -> int:
    """Commit STEP with THEIRS from a process of its own (forked: no second import of torch); its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store = CheckpointStore(storage.resolve(run))
            manifest = Manifest(step=STEP, epoch=0, batch_in_epoch=STEP, world_size=1, kind="torch", files={},
                                metrics={"writer": 2.0})
            code = 0 if store.commit(manifest, {"state.pt": THEIRS}).status == "committed" else 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_checkpoint_another_writer_committed_meanwhile_is_kept_and_returned(tmp_path):
    run = str(tmp_path / "run")
    commits_of_the_other: list[int] = []

    def fence() -> None:
        if not commits_of_the_other:
            commits_of_the_other.append(other_writer(run))

    store = CheckpointStore(storage.resolve(run), fence=fence)
    manifest = Manifest(step=STEP, epoch=0, batch_in_epoch=STEP, world_size=1, kind="torch", files={},
                        metrics={"writer": 1.0})
    kept = store.commit(manifest, {"state.pt": MINE})

    assert commits_of_the_other == [0], "the other writer committed while this one wrote"
    assert kept.status == "committed" and kept.manifest.metrics == {"writer": 2.0}, kept
    checkpoints = os.path.join(run, "checkpoints")
    assert sorted(os.listdir(checkpoints)) == [f"step-{STEP:09d}"], "this writer's folder is gone, nothing aside"
    with open(os.path.join(checkpoints, f"step-{STEP:09d}", "state.pt"), "rb") as f:
        on_disk = f.read()
    assert on_disk == THEIRS
    assert kept.manifest.files["state.pt"].sha256 == hashlib.sha256(THEIRS).hexdigest()
    assert CheckpointStore(storage.resolve(run)).latest_verified().info.manifest.metrics == {"writer": 2.0}
