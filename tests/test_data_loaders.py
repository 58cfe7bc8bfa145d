"""ctx.data_loader: every loader keeps its own position; only the training loader's decides
where a resumed run continues."""

from __future__ import annotations

import pytest
from specs import torch_spec

import orchestrator

pytestmark = pytest.mark.slow


@pytest.mark.timeout(500)
def test_a_validation_loader_does_not_move_the_training_position_and_a_resume_stays_exact(tmp_path):
    # 1297 training samples / 2 ranks / 32 -> 21 steps an epoch; the kill falls mid-epoch 2.
    from jobs.digits_data import load_split

    spec = torch_spec("tutorial", tmp_path, "tutorial_loop:train_loop")
    clean = orchestrator.run(spec, console=None)
    fault = {"kill_at": 30, "marker": str(tmp_path / "kill-marker"), "kill_rank": 1}
    killed = orchestrator.run(torch_spec("tutorial-killed", tmp_path, "tutorial_loop:train_loop", fault), console=None)

    val_size = len(load_split("val"))
    for result in (clean, killed):
        assert result.metrics["val_seen"] == val_size  # the whole validation split, every epoch
        assert result.metrics["val_acc"] > 0.5
        assert result.global_step == 63
    # Resumed from step 30 (mid-epoch), or 21 if step 30's write had not committed yet.
    assert killed.restarts == 1 and killed.starts[1]["restored_step"] in (21, 30)
    assert killed.weights_sha256 == clean.weights_sha256
