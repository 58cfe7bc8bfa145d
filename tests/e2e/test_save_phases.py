"""The product's own save path killed at every phase of a save, in one real run per storage.

tests/unit/checkpoint/test_phases.py is the store's matrix (a writer of its own calls the store).
Here the torch job runs as a user runs it (`orchestrator run`, local mode, 2 ranks), and the
store's kill switch in the spec's `env:` SIGKILLs rank 0 from its background checkpoint writer
at each unsharded phase once, a different save each (tests/helpers/save_phase_runs.py): the
rank's session hands the snapshot over, its writer commits through the lease fence, rank 0
chooses where the restarted ranks resume. Each run must end with the clean run's weights bit for
bit, every restart resuming from a checkpoint that was committed at its kill (the save killed
before its commit ignored), and nothing the kills left (staging folders, half-deleted
checkpoints) may outlive the run. Once on local disk, once on the S3 server on loopback.
"""

from __future__ import annotations

import uuid

import pytest
from conftest import S3_CREDENTIALS, isolated_state
from save_phase_runs import NAME, kill_plan, list_local, run_killed_at_every_phase, s3_lister
from specs import torch_spec

from orchestrator.checkpoint import phases

pytestmark = pytest.mark.slow

# The phase from which the save being killed is committed: the rename locally, the manifest on S3.
COMMITTED_FROM = {"local": "published", "s3": "manifest_written"}
# Kills that leave something of the save behind in storage, for the run's own retention to remove:
# a staging folder locally; on S3 a step's objects without a manifest (an object being uploaded
# when its writer dies never appears, so a partial first file leaves nothing there).
LEAVE_BEHIND = {"local": {"file_partial", "files_written", "manifest_written", "retention"},
                "s3": {"files_written", "retention"}}
FINAL = {60, 63}  # keep_last 2 of the saves at every 10 steps and at each epoch's end (21, 42, 63)


@pytest.fixture(scope="module", params=["local", "s3"])
def killed(request, tmp_path_factory):
    where = request.param
    folder = tmp_path_factory.mktemp(f"killed-{where}")
    with isolated_state(tmp_path_factory), pytest.MonkeyPatch.context() as patch:
        if where == "s3":
            for key, value in S3_CREDENTIALS.items():  # the shell's exports, as a user of S3 has them
                patch.setenv(key, value)
            storage = request.getfixturevalue("_s3_endpoint").format(prefix=f"phases-{uuid.uuid4().hex[:8]}")
            listing = s3_lister(storage, NAME, S3_CREDENTIALS)
        else:
            storage = str(folder)
            listing = lambda: list_local(str(folder / NAME / "checkpoints"))  # noqa: E731
        spec = torch_spec(NAME, storage)
        spec["failure"]["max_failures"] = 8  # one restart per kill, and room to spare
        spec["env"] = {"TMPDIR": str(folder)}
        plan = kill_plan(where)
        assert sorted(p.split("@")[0] for p in plan) == sorted(
            p for p in phases.UNSHARDED if not (where == "s3" and p == "published"))
        yield where, run_killed_at_every_phase(spec, str(folder), plan, listing)


def _restored_after_each_kill(run):
    starts = run.result.starts
    assert len(starts) == len(run.kills) + 1, (starts, [k.phase for k in run.kills])
    return [start["restored_step"] for start in starts[1:]]


@pytest.mark.timeout(1500)
def test_a_run_killed_at_every_phase_of_its_own_saves_resumes_to_the_clean_weights_and_leaves_nothing_behind(
        killed, clean_torch):
    where, run = killed
    assert run.output.startswith("local mode: "), run.output[:300]
    # Every kill happened, once, in rank 0's background writer (not the training thread, not a writer of the test's).
    assert sorted(f"{k.phase}@{k.step}" for k in run.kills) == sorted(run.planned), run.output[-3000:]
    for kill in run.kills:
        assert kill.marker["thread"] == "checkpoint-writer" and kill.marker["rank"] == "0", kill.marker
    assert run.result.restarts == len(run.planned), run.result.failures

    order = phases.UNSHARDED
    for kill, restored in zip(run.kills, _restored_after_each_kill(run), strict=True):
        seen = kill.seen.committed
        what = (f"{where}: killed at {kill.phase}@{kill.step} with {sorted(seen)} committed "
                f"({sorted(kill.seen.leftovers)} besides)")
        if kill.phase == "retention":  # numbered by the step it deletes: that one is out of view
            assert kill.step not in seen, what
            interrupted = max(seen)  # retention runs once the save is committed and read back
        else:
            committed = order.index(kill.phase) >= order.index(COMMITTED_FROM[where])
            assert (kill.step in seen) == committed, what
            interrupted = kill.step
        if kill.phase in LEAVE_BEHIND[where]:
            assert kill.seen.leftovers, what  # so that "nothing left behind" below is a real check
        # Nothing committed is lost: the restart resumes from a checkpoint committed at the kill, and
        # from none older than the newest committed before the save that was killed.
        assert restored in seen or (restored is None and not seen), f"{what}: resumed from {restored}"
        before = seen - {interrupted}
        assert not before or (restored is not None and restored >= max(before)), f"{what}: resumed from {restored}"

    assert run.result.status == "finished"
    assert run.result.global_step == clean_torch.global_step
    assert run.result.weights_sha256 == clean_torch.weights_sha256
    assert run.final.leftovers == set() and run.final.committed == FINAL, run.final


@pytest.mark.timeout(1500)
def test_after_each_kill_the_ranks_resume_from_the_newest_checkpoint_committed_even_one_not_yet_announced(killed):
    where, run = killed
    wrong = [(f"{k.phase}@{k.step}", max(k.seen.committed, default=None), restored)
             for k, restored in zip(run.kills, _restored_after_each_kill(run), strict=True)
             if restored != max(k.seen.committed, default=None)]
    assert wrong == [], f"{where}: (kill, newest committed, resumed from): {wrong}"
