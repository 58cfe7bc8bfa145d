"""Exact resume: a run interrupted at a random step ends with the clean run's weights, bit for bit.

The interruptions are real: a worker process SIGKILLs itself (Ray Train restarts the group and
the harness resumes from the newest committed checkpoint), or the driver is SIGKILLed and the
same command is run again.
"""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def clean_torch(tmp_path_factory):
    """The uninterrupted torch run every interrupted one is compared with."""
    return orchestrator.run(torch_spec("clean", tmp_path_factory.mktemp("clean")), console=None)


@pytest.mark.timeout(500)
def test_torch_job_killed_at_a_random_step_resumes_to_identical_weights(tmp_path, clean_torch):
    clean = clean_torch
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


@pytest.mark.timeout(500)
def test_a_finished_run_continues_when_the_spec_asks_for_more_and_resume_from_uri_takes_that_checkpoint(
        tmp_path, clean_torch):
    short = torch_spec("grow", tmp_path)
    short["torch"]["max_epochs"] = 1
    first = orchestrator.run(short, console=None)
    assert first.status == "finished" and first.global_step == 21
    one_epoch_checkpoint = first.final_checkpoint

    picked_spec = torch_spec("picked", tmp_path)
    picked_spec["resume_from"] = one_epoch_checkpoint
    picked = orchestrator.run(picked_spec, console=None)
    assert picked.resumed_from["uri"] == one_epoch_checkpoint
    assert picked.resumed_from["reason"] == "resume_from names this checkpoint"
    assert picked.weights_sha256 == clean_torch.weights_sha256

    grown = orchestrator.run(torch_spec("grow", tmp_path), console=None)
    assert grown.status == "finished"
    assert grown.resumed_from["uri"] == one_epoch_checkpoint
    assert grown.weights_sha256 == clean_torch.weights_sha256


@pytest.mark.timeout(500)
def test_a_sigkilled_driver_re_submitted_ends_with_identical_weights(tmp_path, clean_torch):
    import yaml

    spec = torch_spec("driver-killed", tmp_path, loop="faulty:slow_loop")
    spec["checkpoint"]["every_n_steps"] = 7
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "tests")}
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(path)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        commits = 0
        for line in driver.stdout:
            commits += "checkpoint committed" in line
            if commits == 3:  # a few checkpoints in, mid-epoch, with a write possibly in flight
                break
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()

    spec["torch"]["train_loop"] = "jobs.digits_torch:train_loop"  # the same training, without the sleeps
    path.write_text(yaml.safe_dump(spec))
    result = run_cli("run", str(path), env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "resuming from step" in result.stdout
    summary = json.loads((tmp_path / "driver-killed" / "summary.json").read_text())
    assert summary["resumed_from"]["step"] >= 14
    assert summary["weights_sha256"] == clean_torch.weights_sha256
