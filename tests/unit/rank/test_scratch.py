"""What both harnesses and the script agent share: scratch folders that do not pile up when
workers are killed, and metrics recorded as floats (or refused, when the user passed them)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

from orchestrator.agent.supervisor import SCRATCH_PREFIX as SCRIPT_PREFIX
from orchestrator.errors import UserError
from orchestrator.rank.lightning.fit import SCRATCH_PREFIX as LIGHTNING_PREFIX
from orchestrator.rank.metric_values import metric_floats
from orchestrator.rank.scratch import make_scratch


@pytest.mark.parametrize("prefix", [LIGHTNING_PREFIX, SCRIPT_PREFIX])
def test_a_new_scratch_folder_removes_those_of_dead_workers_and_keeps_live_ones(prefix, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / f"{prefix}{int(dead.stdout)}-abc").mkdir()
    (tmp_path / f"{prefix}{int(dead.stdout)}-abc" / "lightning.ckpt").write_bytes(b"x" * 10)
    (tmp_path / f"{prefix}{os.getppid()}-def").mkdir()  # a live process's (pytest's parent)
    (tmp_path / "someone-elses").mkdir()

    mine = make_scratch(prefix)

    assert os.path.dirname(mine) == str(tmp_path) and os.path.basename(mine).startswith(f"{prefix}{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{prefix}{os.getppid()}-def", "someone-elses", os.path.basename(mine)])


def test_metrics_become_floats_and_lightnings_non_numbers_are_left_out():
    metrics = {"loss": torch.tensor(0.5), "acc": 1, "lr": np.float32(0.25), "flag": True, "name": "x",
               "vector": torch.ones(3)}
    assert metric_floats(metrics) == {"loss": 0.5, "acc": 1.0, "lr": 0.25}


def test_a_metric_the_user_passed_that_is_not_a_number_is_their_error_naming_it():
    with pytest.raises(UserError, match=r"metric 'tag' = 'warmup' \(a str\) is not a number.*Fix"):
        metric_floats({"loss": 0.1, "tag": "warmup"}, strict=True)
    assert metric_floats({"loss": torch.tensor(0.5), "warm": True}, strict=True) == {"loss": 0.5, "warm": 1.0}
