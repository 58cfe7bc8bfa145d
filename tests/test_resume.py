"""Exact resume: a run interrupted at a random step ends with the clean run's weights, bit for bit.

The interruptions are real: a worker process SIGKILLs itself (Ray Train restarts the group and
the harness resumes from the newest committed checkpoint), or the driver is SIGKILLed and the
same command is run again.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

import orchestrator
from conftest import REPO, run_cli

pytestmark = pytest.mark.slow

# A random step each run; set ORCHESTRATOR_TEST_KILL_STEP to replay one.
KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_KILL_STEP", random.Random().randint(5, 55)))


def torch_spec(name, storage_dir, loop="jobs.digits_torch:train_loop", fault=None, every=10):
    config = {"hidden": 64, "lr": 0.05, "batch_size": 32}
    if fault:
        config["fault"] = fault
    return {
        "name": name, "storage": str(storage_dir), "seed": 0,
        "torch": {"train_loop": loop, "max_epochs": 3, "config": config},
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": every, "keep_last": 2},
        "failure": {"max_failures": 2},
    }


def lightning_spec(name, storage_dir, model_class="jobs.digits.DigitsClassifier", **model_args):
    return {
        "name": name, "storage": str(storage_dir), "seed": 0,
        "lightning": {
            "model": {"class_path": model_class, "init_args": {"hidden": 64, "lr": 0.002, **model_args}},
            "data": {"class_path": "jobs.digits.DigitsData", "init_args": {"batch_size": 32}},
            "trainer": {"max_epochs": 3},
        },
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": 10, "keep_last": 2},
        "failure": {"max_failures": 2},
    }


@pytest.mark.timeout(500)
def test_torch_job_killed_at_a_random_step_resumes_to_identical_weights(tmp_path):
    clean = orchestrator.run(torch_spec("clean", tmp_path), console=None)
    fault = {"kill_at": KILL_STEP, "marker": str(tmp_path / "kill-marker"), "kill_rank": 1}
    killed = orchestrator.run(torch_spec("killed", tmp_path, "faulty:torch_loop_killed_once", fault), console=None)
    assert (tmp_path / "kill-marker").exists(), "the fault was never injected"
    assert killed.restarts == 1, f"kill at step {KILL_STEP}"
    assert killed.global_step == clean.global_step
    assert killed.weights_sha256 == clean.weights_sha256, f"kill at step {KILL_STEP}"


@pytest.mark.timeout(500)
def test_lightning_job_killed_at_a_random_step_resumes_to_identical_weights(tmp_path):
    clean = orchestrator.run(lightning_spec("clean", tmp_path), console=None)
    killed = orchestrator.run(lightning_spec("killed", tmp_path, "faulty.KilledOnceClassifier",
                                             kill_at=KILL_STEP, marker=str(tmp_path / "kill-marker")), console=None)
    assert (tmp_path / "kill-marker").exists(), "the fault was never injected"
    assert killed.restarts == 1, f"kill at step {KILL_STEP}"
    assert killed.global_step == clean.global_step
    assert killed.weights_sha256 == clean.weights_sha256, f"kill at step {KILL_STEP}"
