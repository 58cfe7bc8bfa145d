"""ctx.data_loader: every loader keeps its own position; only the training loader's decides
where a resumed run continues; and samples augmented at random in the loader's worker processes
are the same after a resume.

One clean run and one run killed mid-epoch of the tutorial loop (tests/helpers/tutorial_loop.py: a
training loader with two augmenting workers, and a validation loader) are shared by the tests.
The unit check of the augmentation order is tests/unit/data/test_seeded.py."""

from __future__ import annotations

import pytest
from cli_runs import run_spec
from conftest import assert_resumed_to_clean_weights, isolated_state
from specs import torch_spec

pytestmark = pytest.mark.slow

# 1297 training samples / 2 ranks / 32 -> 21 steps an epoch; the kill falls mid-epoch 2, five
# steps after the checkpoint of step 30, so that the resume is a mid-epoch one as a rule.
KILL_AT = 35


@pytest.fixture(scope="module")
def tutorial_runs(tmp_path_factory, _warm_record):
    """(clean, killed, marker): the tutorial loop run through, and run with rank 1 killed once at KILL_AT."""
    tmp_path = tmp_path_factory.mktemp("tutorial")
    with isolated_state(tmp_path_factory, _warm_record):
        clean = run_spec(torch_spec("tutorial", tmp_path, "tutorial_loop:train_loop"), str(tmp_path))
        marker = str(tmp_path / "kill-marker")
        fault = {"kill_at": KILL_AT, "marker": marker, "kill_rank": 1}
        killed = run_spec(torch_spec("tutorial-killed", tmp_path, "tutorial_loop:train_loop", fault), str(tmp_path))
    return clean, killed, marker


@pytest.mark.timeout(500)
def test_a_validation_loader_does_not_move_the_training_position_and_a_resume_stays_exact(tutorial_runs):
    from jobs.digits_data import load_split

    clean, killed, _ = tutorial_runs
    val_size = len(load_split("val"))
    for result in (clean, killed):
        assert result.metrics["val_seen"] == val_size  # the whole validation split, every epoch
        assert result.metrics["val_acc"] > 0.5
        assert result.global_step == 63
    # Resumed from step 30 (mid-epoch), or 21 if step 30's write had not committed yet.
    assert killed.restarts == 1 and killed.starts[1]["restored_step"] in (21, 30)
    assert killed.weights_sha256 == clean.weights_sha256


@pytest.mark.timeout(500)
def test_a_run_with_augmenting_loader_workers_killed_mid_epoch_resumes_to_identical_weights(tutorial_runs):
    clean, killed, marker = tutorial_runs
    assert_resumed_to_clean_weights(killed, clean, marker, KILL_AT)
