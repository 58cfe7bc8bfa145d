"""A run that resumes from an older checkpoint is a branch: its checkpoints are its own.

The defect these tests pin: a second save at step N kept whatever was committed there, on the
assumption that it held the same state. After a rollback (resume_from an earlier checkpoint, with
another seed or learning rate) or after rank 0 fell back past a corrupt newest checkpoint, it did
not: the later steps on storage stayed the old trajectory's, and `resume_from: latest` continued
the wrong model. A branch now supersedes the later checkpoints before it trains; a replay of the
same trajectory after a crash still keeps what is committed.
"""

from __future__ import annotations

import os

import pytest
from cli_runs import run_spec
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest, loads_state
from orchestrator.checkpoint.manifest import MANIFEST_NAME, SUPERSEDED_NAME
from orchestrator.driver import resume
from orchestrator.rank.fingerprint import weights_sha256
from orchestrator.spec import validate


def _commit(store: CheckpointStore, step: int, payload: bytes):
    manifest = Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=1, kind="torch", files={})
    return store.commit(manifest, {"state.pt": payload})


def _content(store: CheckpointStore, step: int) -> bytes:
    info = next(i for i in store.committed() if i.step == step)
    return store.read_files(info)["state.pt"]


def _store_with_steps(location: str, steps=(10, 20, 30, 40)) -> CheckpointStore:
    store = CheckpointStore(storage.resolve(location))
    for step in steps:
        _commit(store, step, f"first trajectory at {step}".encode())
    return store


def test_a_replayed_save_at_a_committed_step_keeps_the_committed_checkpoint(tmp_path):
    store = _store_with_steps(str(tmp_path / "run"))
    folder = tmp_path / "run" / "checkpoints" / "step-000000030"
    inode = os.stat(folder).st_ino

    kept = _commit(store, 30, b"a replay writes the same state again")

    assert kept.status == "committed"
    assert os.stat(folder).st_ino == inode, "a replay must not rewrite a committed checkpoint"
    assert _content(store, 30) == b"first trajectory at 30"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_branch_supersedes_the_later_checkpoints_and_its_saves_replace_them(tmp_path, where, request):
    if where == "s3":
        location = request.getfixturevalue("s3_server").format(prefix=f"branch-{os.getpid()}/run")
    else:
        location = str(tmp_path / "run")
    store = _store_with_steps(location)

    superseded = store.supersede_after(20)

    assert [i.name for i in superseded] == ["step-000000030", "step-000000040"]
    by_step = {i.step: i for i in store.scan()}
    assert {s: i.status for s, i in by_step.items()} == {10: "committed", 20: "committed", 30: "superseded",
                                                       40: "superseded"}
    # Set aside, not lost: the files and the manifest (renamed) are still there.
    assert storage.exists(by_step[40].location.join("state.pt"))
    assert storage.exists(by_step[40].location.join(SUPERSEDED_NAME))
    assert not storage.exists(by_step[40].location.join(MANIFEST_NAME))
    assert store.latest_committed().info.step == 20
    assert store.latest_loadable().skipped == []  # set aside on purpose: no warning on every start

    _commit(store, 30, b"second trajectory at 30")

    assert _content(store, 30) == b"second trajectory at 30"
    assert store.latest_committed().info.step == 30


def test_resume_from_an_earlier_checkpoint_of_the_run_branches_it(tmp_path):
    store = _store_with_steps(str(tmp_path / "run"))
    spec = validate({"name": "run", "storage": str(tmp_path), "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 50},
                     "resume_from": str(tmp_path / "run" / "checkpoints" / "step-000000020")})

    choice = resume.choose(spec, store)
    said = resume.branch(store, choice)

    assert choice.step == 20
    assert "2 later checkpoint(s)" in said and "step-000000030 ... step-000000040" in said
    assert [i.step for i in store.committed()] == [10, 20]


def test_resume_from_the_newest_checkpoint_is_no_branch(tmp_path):
    store = _store_with_steps(str(tmp_path / "run"))
    spec = validate({"name": "run", "storage": str(tmp_path), "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 50},
                     "resume_from": str(tmp_path / "run" / "checkpoints" / "step-000000040")})

    choice = resume.choose(spec, store)

    assert resume.branch(store, choice) is None
    assert [i.step for i in store.committed()] == [10, 20, 30, 40]


def test_resume_from_another_runs_checkpoint_supersedes_this_runs_checkpoint_at_that_step(tmp_path):
    other = _store_with_steps(str(tmp_path / "other"), steps=(20,))
    store = _store_with_steps(str(tmp_path / "run"), steps=(10, 20, 30))
    spec = validate({"name": "run", "storage": str(tmp_path), "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 50},
                     "resume_from": other.committed()[0].uri})

    resume.branch(store, resume.choose(spec, store))

    assert [i.step for i in store.committed()] == [10]


def test_retention_keeps_superseded_checkpoints_only_while_keep_last_keeps_everything(tmp_path):
    store = _store_with_steps(str(tmp_path / "run"), steps=(10, 20, 25, 40))
    store.supersede_after(20)
    _commit(store, 30, b"second trajectory at 30")  # verified by this store: retention's anchor

    store.retain(keep_last=None)
    assert [(i.step, i.status) for i in store.scan()] == [(10, "committed"), (20, "committed"), (25, "superseded"),
                                                          (30, "committed"), (40, "superseded")]

    store.retain(keep_last=2)
    # Older than the newest committed: gone. Newer (step 40): kept until the branch passes it.
    assert [(i.step, i.status) for i in store.scan()] == [(20, "committed"), (30, "committed"),
                                                          (40, "superseded")]


def test_a_resume_with_another_spec_names_each_changed_field_and_the_optimizer_caveat():
    base = {"name": "run", "seed": 0,
            "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 50, "config": {"lr": 0.05, "hidden": 64}}}
    old = validate(base)
    new = validate({**base, "seed": 7, "resume_from": "/some/where",
                    "torch": {**base["torch"], "config": {"lr": 0.1, "hidden": 64}}})
    manifest = Manifest(step=1, epoch=0, batch_in_epoch=1, world_size=1, kind="torch", files={},
                        spec=old.to_record())

    line = resume.spec_changes(new, manifest)

    assert "seed: 0 -> 7" in line and "torch.config.lr: 0.05 -> 0.1" in line
    assert "resume_from" not in line  # expected to differ on every resume
    assert "optimizer state restored from the checkpoint then brings back the old value" in line
    assert resume.spec_changes(old, manifest) is None


def _weights_in(checkpoint_dir) -> str:
    path = os.path.join(checkpoint_dir, "state.pt")
    state = loads_state(open(path, "rb").read(), source=path)
    return weights_sha256(state["objects"]["model"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_rolled_back_run_and_a_fallback_past_a_corrupt_checkpoint_keep_their_own_checkpoints(tmp_path):
    """The issue's recipe through the Python API: run to step 30, resume from step 10 with
    another seed; then corrupt the newest checkpoint and continue, so that rank 0 falls back."""
    def spec(**fields):
        base = torch_spec("br", tmp_path, every=10)
        base["torch"].update(max_steps=30, max_epochs=None)
        base["checkpoint"]["keep_last"] = None
        return {**base, **fields}

    checkpoints = tmp_path / "br" / "checkpoints"
    first = run_spec(spec(), str(tmp_path))
    branch_lines: list[str] = []
    second = run_spec(spec(seed=7, resume_from=str(checkpoints / "step-000000010")), str(tmp_path),
                      lines=branch_lines)

    assert second.weights_sha256 != first.weights_sha256  # another trajectory
    assert second.final_checkpoint.endswith("step-000000030")
    # The checkpoint the run names as final holds the model it reports, not the first run's.
    assert _weights_in(checkpoints / "step-000000030") == second.weights_sha256
    assert any("branches the run" in line for line in branch_lines), branch_lines
    assert any("seed: 0 -> 7" in line for line in branch_lines), branch_lines

    # The newest checkpoint is damaged in place (same size): the driver picks it by its size,
    # rank 0's hash check fails, and the group falls back to step 21 and trains 22..40 again.
    state = checkpoints / "step-000000030" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    third = run_spec(spec(seed=7, torch={**spec()["torch"], "max_steps": 40}), str(tmp_path))

    assert third.global_step == 40
    store = CheckpointStore(storage.resolve(str(tmp_path / "br")))
    step30 = next(i for i in store.scan() if i.step == 30)
    assert store.verify(step30).status == "committed", "the replay kept the corrupt checkpoint"
    assert _weights_in(checkpoints / "step-000000040") == third.weights_sha256
