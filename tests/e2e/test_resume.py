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
from cli_runs import run_spec
from conftest import REPO, assert_resumed_to_clean_weights, run_cli, wait_for
from specs import STEPS_PER_EPOCH, torch_spec

pytestmark = pytest.mark.slow

# Random steps each run; set ORCHESTRATOR_TEST_KILL_STEP / ORCHESTRATOR_TEST_DRIVER_KILL_STEP to replay one.
KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_KILL_STEP", random.Random().randint(5, 55)))
# Late enough that a checkpoint (every 10 steps) is committed before the driver dies, and early
# enough that the workers, which outlive a killed driver by a second or two, do not finish the run.
DRIVER_KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_DRIVER_KILL_STEP", random.Random().randint(12, 45)))


@pytest.mark.timeout(500)
def test_the_torch_job_is_deterministic_across_runs_and_killed_at_a_random_step_resumes_to_identical_weights(
        tmp_path, clean_torch):
    # The killed run is a second run of the clean run's spec (tests/helpers/specs.py), trained from
    # scratch up to its kill: the same weights at the end also say the job is deterministic.
    clean = clean_torch
    assert clean.status == "finished"
    assert clean.global_step == 3 * STEPS_PER_EPOCH
    assert clean.metrics["test_acc"] >= 0.85
    fault = {"kill_at": KILL_STEP, "marker": str(tmp_path / "kill-marker"), "kill_rank": 1}
    killed = run_spec(torch_spec("killed", tmp_path, "faulty:torch_loop_killed_once", fault), str(tmp_path))
    assert killed.status == "finished"
    assert_resumed_to_clean_weights(killed, clean, fault["marker"], KILL_STEP)


@pytest.mark.timeout(500)
def test_a_group_that_restarts_after_the_final_checkpoint_reports_the_loaded_models_fingerprint(tmp_path, clean_torch):
    # Rank 0 dies right after its synchronous save of the final step (63) is committed: the new
    # group starts with nothing left to train, and must still report the true weights.
    final = 3 * STEPS_PER_EPOCH
    fault = {"kill_at": final, "marker": str(tmp_path / "kill-marker"), "kill_rank": 0}
    spec = torch_spec("ends-then-dies", tmp_path, "faulty:torch_loop_killed_once", fault, every=STEPS_PER_EPOCH)
    spec["torch"]["max_steps"] = final
    spec["checkpoint"]["async"] = False
    result = run_spec(spec, str(tmp_path))
    assert result.restarts == 1 and result.starts[-1]["restored_step"] == final, result.starts
    assert result.global_step == final
    assert result.weights_sha256 == clean_torch.weights_sha256


# The Lightning job killed at a random step: test_failures_heal's killed-then-frozen Lightning test.


@pytest.mark.timeout(500)
def test_a_finished_run_continues_when_the_spec_asks_for_more(tmp_path, clean_torch):
    short = torch_spec("grow", tmp_path)
    short["torch"]["max_epochs"] = 1
    first = run_spec(short, str(tmp_path))
    assert first.status == "finished" and first.global_step == STEPS_PER_EPOCH
    one_epoch_checkpoint = first.final_checkpoint

    # (resume_from naming another run's checkpoint: test_failures_heal's unreadable-checkpoint test.)
    grown = run_spec(torch_spec("grow", tmp_path), str(tmp_path))
    assert grown.status == "finished"
    assert grown.resumed_from["uri"] == one_epoch_checkpoint
    assert grown.weights_sha256 == clean_torch.weights_sha256


def _kill_driver_at_its_marker(spec: dict, path, marker) -> None:
    """Run the spec through the CLI and SIGKILL the driver as soon as the job writes its marker."""
    import yaml

    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "tests", "helpers")}
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(path)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: marker.exists() or driver.poll() is not None, timeout=240, interval=0.05)
        assert driver.poll() is None, "the run ended before the driver could be killed"
        driver.send_signal(signal.SIGKILL)  # mid-epoch, with a checkpoint write possibly in flight
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.mark.timeout(500)
def test_a_sigkilled_torch_driver_re_submitted_ends_with_identical_weights(tmp_path, clean_torch):
    # In local mode, the torch job; the Lightning job's case is test_cli's killed driver on Ray,
    # which also has a second driver refused and `status` saying the driver died.
    import yaml

    marker = tmp_path / "marker"
    slow = torch_spec("driver-killed", tmp_path, loop="faulty:slow_loop", sleep_s=0.2, marker=str(marker),
                      mark_at=DRIVER_KILL_STEP)
    again = torch_spec("driver-killed", tmp_path)
    _kill_driver_at_its_marker(slow, tmp_path / "job.yaml", marker)

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(again))
    result = run_cli("run", str(tmp_path / "job.yaml"), env={"PYTHONPATH": os.path.join(REPO, "tests", "helpers")})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "resuming from step" in result.stdout, f"driver killed at step {DRIVER_KILL_STEP}"
    summary = json.loads((tmp_path / "driver-killed" / "summary.json").read_text())
    assert 10 <= summary["resumed_from"]["step"] < 3 * STEPS_PER_EPOCH
    assert summary["weights_sha256"] == clean_torch.weights_sha256, f"driver killed at step {DRIVER_KILL_STEP}"
